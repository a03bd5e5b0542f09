"""gpufeed.DataLoader: the C++ loader in torch.utils.data.DataLoader's vocabulary."""
from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from . import _C

_DTYPES = {torch.uint8: "uint8", torch.float32: "float32", torch.bfloat16: "bfloat16",
           torch.float16: "float16"}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
_STATE_VERSION = 1


def distributed_rank_world_size() -> Tuple[int, int]:
    """(rank, world_size) as a DistributedSampler would default them: the initialised
    torch.distributed process group, else torchrun's environment (RANK, WORLD_SIZE), else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "WORLD_SIZE" in os.environ:
        return int(os.environ.get("RANK", "0")), int(os.environ["WORLD_SIZE"])
    return 0, 1


def _color_jitter(value: "float | Sequence[float] | None") -> List[float]:
    """color_jitter as [brightness, contrast, saturation, hue] (None: all off)."""
    if value is None:
        return [0.0, 0.0, 0.0, 0.0]
    if isinstance(value, (int, float)):
        return [float(value)] * 3 + [0.0]
    values = [float(v) for v in value]
    if len(values) != 4:
        raise ValueError(f"color_jitter must be one number or (brightness, contrast, saturation, hue), not {value!r}")
    return values


class DataLoader:
    """Batches of decoded, augmented images from a folder or a file list, as torch tensors.

    A drop-in for ``torch.utils.data.DataLoader(torchvision.datasets.ImageFolder(root,
    transform), batch_size, sampler=DistributedSampler(...))`` in a training loop::

        loader = gpufeed.DataLoader("data/train", batch_size=256, shuffle=True, num_workers=8,
                                    device="cuda", dtype=torch.bfloat16,
                                    memory_format=torch.channels_last)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            for images, labels in loader:      # [N, 3, S, S] bfloat16 and [N] int64, on cuda
                ...

    Decoding (libjpeg-turbo, only the pixels the crop keeps) and augmentation run on a oneTBB
    pool of ``num_workers`` C++ threads in this process, straight into ``prefetch_depth``
    preallocated batch slots (page-locked when ``device`` is CUDA); no Python runs on them, and
    the GIL is released while the caller waits for a batch.

    Args:
        root: an ImageFolder root (``root/<class>/**/<image>``, classes sorted, as torchvision),
            a flat folder of images (class = file-name prefix up to the first ``_``, as
            ``n01440764_tench.JPEG``), or a file list of ``path label`` lines (paths relative to
            the list's folder; labels are class indices). The CLI's ``--data``.
        batch_size: samples per batch (DataLoader's ``batch_size``).
        shuffle: permute every epoch with a generator seeded ``seed + epoch``, exactly
            DistributedSampler's order (also with one process).
        drop_last: drop the last, shorter batch (DataLoader's ``drop_last``).
        num_workers: decode threads (C++ threads, not processes); None or 0: all hardware threads;
            more than 1024 raises ValueError.
        seed: seeds the order and the augmentation; each sample's crop and flip depend only on
            (seed, epoch, index), whatever the thread count.
        train: True: RandomResizedCrop(image_size, scale, ratio) + RandomHorizontalFlip()
            (torchvision's semantics); False: Resize(resize_size) + CenterCrop(image_size).
        image_size: output height = width, pixels (train: of the first epoch; see set_image_size).
        max_image_size: train only: the largest side ``set_image_size`` may set later
            (progressive resizing); slots are allocated once for it. Default: image_size.
        scale, ratio: RandomResizedCrop's area fraction and aspect-ratio ranges.
        resize_size: eval only; default round(image_size * 256 / 224) (256 at 224), torchvision's
            ImageNet recipe.
        device: ``"cpu"`` or ``"cuda[:N]"`` (a torch.device too). CUDA batches are copied from
            pinned slots on a copy stream and made ready on ``torch.cuda.current_stream()`` at
            the time each batch is requested.
        dtype: ``torch.uint8``: the raw images, ``[N, S, S, 3]`` NHWC, unnormalised (on the CPU a
            zero-copy view of the loader's slot, see below); ``torch.float32``, ``bfloat16`` or
            ``float16``: ``[N, 3, S, S]``, ``(x / 255 - mean) / std`` (torchvision's ToTensor +
            Normalize).
        memory_format: ``torch.contiguous_format`` (NCHW) or ``torch.channels_last`` for the
            float dtypes (uint8 is always NHWC).
        mean, std: per RGB channel; default the ImageNet statistics torchvision's models use.
        on_error: ``"raise"`` (DataLoader's behaviour, but naming the file): iteration raises
            gpufeed.DecodeError for the batch's first unreadable sample; ``"skip"``: the sample is
            replaced by the next good sample of this rank's epoch order (batch shapes and the
            number of batches stay fixed, so DDP ranks stay in step), each skip is in
            ``epoch_summary()``, and more than ``max_skips`` in one epoch raises
            gpufeed.SkipLimitExceeded.
        max_skips: see on_error.
        prefetch_depth: batch slots, the one the caller holds included (>= 1); the loader works
            ahead into the others.
        auto_augment: train only, per sample after the flip, with torchvision.transforms.v2's
            semantics and pixels: ``"ta_wide"`` (TrivialAugmentWide()), ``"ra"``
            (RandAugment(ra_num_ops, ra_magnitude)) or ``"imagenet"`` (AutoAugment's ImageNet
            policy); fill 0 (the transforms' default). The names are torchvision's references'
            ``--auto-augment`` values.
        augment_interpolation: the policy's ``interpolation`` for its geometric ops (shears,
            translations, rotations): ``"nearest"`` (torchvision's default) or ``"bilinear"``
            (what the classification references pass, their ``--interpolation`` default); both
            give torchvision's pixels exactly.
        ra_magnitude, ra_num_ops: RandAugment's magnitude (bin 0..30) and ops per sample.
        color_jitter: ColorJitter(brightness, contrast, saturation, hue) before the policy: one
            number b (= ColorJitter(b, b, b)) or four.
        random_erase: RandomErasing probability (the references' ``--random-erase``), after the
            policy. The references erase after Normalize; gpufeed erases the uint8 image with the
            value that normalises nearest to ``random_erase_value`` (0: the mean colour;
            ``"random"``: per-pixel standard normals), using ``mean``/``std``.
        Every random choice comes from the sample's own stream (seed, epoch, index): the same
        for any num_workers. Draw order: gpufeed/loader/augment.h.
        rank, world_size: shard as DistributedSampler(num_replicas=world_size, rank=rank,
            shuffle=shuffle, seed=seed) does (padding by repeating the start). Default: the
            initialised torch.distributed process group, else torchrun's RANK/WORLD_SIZE, else 0/1.
        index_cache: where the dataset's listing is cached so that the next start does not walk the
            tree: None keeps it in the user's cache folder (``$XDG_CACHE_HOME/gpufeed``, else
            ``~/.cache/gpufeed``), ``"beside"`` beside the dataset
            (``<parent>/<name>.gpufeed-index``; never in a folder whose mode forbids writing, even
            as root), ``"off"`` never caches, anything else is a folder to keep it in
            (``gpufeed train --index-cache``). A stale or corrupt cache is rebuilt, never trusted;
            a cache folder that cannot be written means no cache, never an error.

    Iterating yields ``(images, labels)``: labels are ``[N]`` int64 on ``device``. CPU uint8
    batches are views of the loader's slot, not copies: the slot returns to the loader only when
    the last tensor referring to it (images or labels, or a view of them) is freed, so never hold
    more than ``prefetch_depth - 1`` batches at once (iteration raises RuntimeError if every slot
    is held); ``.clone()`` what you keep. The float dtypes and CUDA batches are fresh tensors.

    Epochs: each ``iter(loader)`` runs one epoch, ``set_epoch(e)`` chooses it (as
    DistributedSampler.set_epoch); without set_epoch the epochs count 0, 1, 2, ... by themselves.

    Raises (from iteration): gpufeed.DecodeError, gpufeed.SkipLimitExceeded, KeyboardInterrupt
    (Ctrl-C while waiting; the pending batch is kept for the next ``next()``), RuntimeError.
    Construction raises RuntimeError naming the path when ``root`` is not a dataset, ValueError
    for bad options.
    """

    def __init__(self, root: "str | os.PathLike[str]", batch_size: int = 1, shuffle: bool = False,
                 drop_last: bool = False, num_workers: Optional[int] = None, seed: int = 0,
                 train: bool = True, image_size: int = 224,
                 scale: Tuple[float, float] = (0.08, 1.0),
                 ratio: Tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
                 resize_size: Optional[int] = None, device: "str | torch.device" = "cpu",
                 dtype: torch.dtype = torch.float32,
                 memory_format: torch.memory_format = torch.contiguous_format,
                 mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                 on_error: str = "raise", max_skips: int = 100, prefetch_depth: int = 3,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 auto_augment: Optional[str] = None, ra_magnitude: int = 9, ra_num_ops: int = 2,
                 color_jitter: "float | Sequence[float] | None" = None, random_erase: float = 0.0,
                 random_erase_value: "float | str" = 0.0, augment_interpolation: str = "nearest",
                 max_image_size: Optional[int] = None, index_cache: Optional[str] = None):
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {list(_DTYPES)}, not {dtype}")
        if memory_format not in (torch.contiguous_format, torch.channels_last):
            raise ValueError(f"memory_format must be torch.contiguous_format or torch.channels_last, "
                             f"not {memory_format}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        if prefetch_depth < 1:
            raise ValueError(f"prefetch_depth must be >= 1, not {prefetch_depth}")
        if num_workers is not None and num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, not {num_workers}")
        if len(mean) != 3 or len(std) != 3:
            raise ValueError("mean and std need 3 values (R, G, B)")
        if rank is None or world_size is None:
            env_rank, env_world = distributed_rank_world_size()
            rank = env_rank if rank is None else rank
            world_size = env_world if world_size is None else world_size
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.batch_size = batch_size
        self.num_workers = num_workers or 0
        self.prefetch_depth = prefetch_depth
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.train = train
        self.image_size = image_size
        self.dtype = dtype
        self.memory_format = memory_format
        self.rank = rank
        self.world_size = world_size
        self.root = os.fspath(root)
        jitter = _color_jitter(color_jitter)
        if isinstance(random_erase_value, str) and random_erase_value != "random":
            raise ValueError(f"random_erase_value must be a number or 'random', not {random_erase_value!r}")
        self._c = _C._Loader(
            self.root, batch_size, shuffle, drop_last, num_workers or 0, seed, train, image_size,
            (float(scale[0]), float(scale[1])), (float(ratio[0]), float(ratio[1])), 0.5,
            resize_size or 0, str(self.device), _DTYPES[dtype], memory_format == torch.channels_last,
            [float(m) for m in mean], [float(s) for s in std], on_error, max_skips, prefetch_depth,
            rank, world_size, auto_augment or "none", ra_num_ops, ra_magnitude, jitter,
            float(random_erase), str(random_erase_value), augment_interpolation, max_image_size or 0,
            "" if index_cache is None else os.fspath(index_cache))
        self._next_epoch = 0
        self._epoch = 0
        self._yielded = 0
        self._active = False   # an epoch has started and not ended
        self._resume: Optional[Tuple[int, int]] = None
        self._token = 0
        self.last_batch: Dict[str, Any] = {}
        self._wait_slice_s = 0.05

    # ---- iteration --------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch for this rank (len(DataLoader))."""
        return self._c.num_batches()

    def set_image_size(self, size: int) -> None:
        """Progressive resizing (FFCV's ResNet recipe): the train crop side, pixels, of the epochs
        started from the next ``iter(loader)`` on; batches become ``[N, 3, size, size]`` (or
        ``[N, size, size, 3]`` for uint8). A resumed epoch gets the size set before its iter, so
        set the schedule's size for that epoch before iterating (e.g. FFCV's train_imagenet.py
        ``get_resolution(epoch)``; ``gpufeed train --min-res/--max-res`` implements it). Raises ValueError when size exceeds ``max_image_size`` (naming both),
        when size < 1, or on an eval loader."""
        self._c.set_image_size(int(size))
        self.image_size = int(size)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next iteration runs (DistributedSampler.set_epoch): its order and its
        augmentation draws."""
        self._next_epoch = int(epoch)

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        if self._resume is not None:
            epoch, start = self._resume
            self._resume = None
        else:
            epoch, start = self._next_epoch, 0
        self._c.start_epoch(epoch, start)
        self._epoch, self._yielded, self._active = epoch, start, True
        self._next_epoch = epoch + 1
        self._token += 1
        return _Iterator(self, self._token)

    def _next_batch(self, token: int) -> Tuple[torch.Tensor, torch.Tensor]:
        if token != self._token:
            raise RuntimeError("gpufeed.DataLoader: this iterator was superseded by a newer "
                               "iter(loader) (one epoch runs at a time)")
        out = self._c.next(self._wait_slice_s)
        if out is None:
            self._active = False
            self._token += 1  # the iterator stays exhausted
            raise StopIteration
        images, labels, info = out
        self._yielded += 1
        self.last_batch = info
        return torch.utils.dlpack.from_dlpack(images), torch.utils.dlpack.from_dlpack(labels)


    # ---- checkpointing (torchdata.stateful_dataloader.StatefulDataLoader's semantics) -------------

    def state_dict(self) -> Dict[str, Any]:
        """Where iteration stands: load it into a loader with the same dataset and options and
        iterate to get exactly the batches an uninterrupted run would still yield (the rest of
        the epoch when taken mid-epoch, else the next epoch). Plain Python values."""
        return {
            "version": _STATE_VERSION,
            "epoch": self._epoch,
            "batches_yielded": self._yielded,
            "in_epoch": self._active,
            "next_epoch": self._next_epoch,
            "num_batches": len(self),
            "dataset_size": len(self.samples),
            "batch_size": self.batch_size, "shuffle": self.shuffle, "drop_last": self.drop_last,
            "seed": self.seed, "rank": self.rank, "world_size": self.world_size,
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores a state_dict(); the next iter() resumes from it. Raises ValueError when the
        state was taken with options that give other batches (dataset size, batch_size,
        shuffle, drop_last, seed, rank, world_size)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"gpufeed.DataLoader.load_state_dict: unknown state version {state.get('version')}")
        mine = self.state_dict()
        for key in ("dataset_size", "batch_size", "shuffle", "drop_last", "seed", "rank", "world_size"):
            if state[key] != mine[key]:
                raise ValueError(f"gpufeed.DataLoader.load_state_dict: the state has {key}={state[key]!r}, "
                                 f"this loader {mine[key]!r}: resuming would yield other batches")
        self._next_epoch = int(state["next_epoch"])
        self._epoch = int(state["epoch"])
        self._yielded = int(state["batches_yielded"])
        self._active = False
        self._resume = (self._epoch, self._yielded) if state["in_epoch"] else None

    # ---- the dataset, as torchvision.datasets.ImageFolder names it --------------------------------

    @property
    def classes(self) -> List[str]:
        """Class names, index = label (ImageFolder.classes)."""
        return list(self._c.classes())

    @property
    def class_to_idx(self) -> Dict[str, int]:
        """{class name: label} (ImageFolder.class_to_idx)."""
        return {c: i for i, c in enumerate(self._c.classes())}

    @property
    def samples(self) -> List[Tuple[str, int]]:
        """[(path, label)] in dataset order (ImageFolder.samples); dataset index = position."""
        if not hasattr(self, "_samples"):
            self._samples = [tuple(s) for s in self._c.samples()]
        return self._samples

    @property
    def targets(self) -> List[int]:
        """Labels in dataset order (ImageFolder.targets)."""
        return [label for _, label in self.samples]

    def indices(self, epoch: Optional[int] = None) -> List[int]:
        """This rank's dataset indices of `epoch` (default: the current one), in order: what
        DistributedSampler(...).set_epoch(epoch) yields; batch k holds
        indices[k * batch_size:(k + 1) * batch_size]."""
        return self._c.sampler_indices(self._epoch if epoch is None else epoch)

    # ---- accounts ---------------------------------------------------------------------------------

    def epoch_summary(self) -> Dict[str, Any]:
        """The current epoch's skip account over the batches yielded so far: epoch, batches,
        samples, skipped, complete, skipped_by_kind {kind: n}, skips [{index, replaced_by,
        position, path, kind, reason}] (on_error="skip"; see DecodeError.kind for the kinds)."""
        return self._c.epoch_summary()

    def stats(self) -> Dict[str, Any]:
        """The loader's counters over its life: samples, skipped, bytes_read, read_s, decode_s,
        resize_s (thread seconds summed over the workers), decoded_pixels, threads (decode threads
        in use), and slots {ready, in_flight, held, free} now."""
        return self._c.stats()

    def load_sample(self, index: int, epoch: int) -> torch.Tensor:
        """Sample `index` of `epoch` decoded and transformed exactly as the workers do it,
        [S, S, 3] uint8 (for tests and debugging; raises DecodeError)."""
        return torch.utils.dlpack.from_dlpack(self._c.load_sample(index, epoch))

    # ---- life -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Cancels the epoch's pending work and frees the slots no live tensor holds (also done
        when the loader is garbage-collected). Tensors from earlier batches stay valid."""
        self._token += 1
        self._c.close()

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"gpufeed.DataLoader(root={self.root!r}, samples={len(self.samples)}, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, train={self.train}, image_size={self.image_size}, device={self.device}, "
                f"dtype={self.dtype}, rank={self.rank}, world_size={self.world_size})")


class _Iterator:
    """One epoch of a DataLoader. Unlike a generator it survives an exception: after
    KeyboardInterrupt the pending batch is the next one returned, after a DecodeError
    (on_error="raise") the batch following the failed one."""

    def __init__(self, loader: DataLoader, token: int):
        self._loader = loader
        self._token = token

    def __iter__(self) -> "_Iterator":
        return self

    def __next__(self) -> Tuple[torch.Tensor, torch.Tensor]:
        return self._loader._next_batch(self._token)

    def __len__(self) -> int:
        return len(self._loader)
