"""gpufeed.DataLoader: the C++ loader in torch.utils.data.DataLoader's vocabulary.

A façade over three modules: _keywords (the keyword schema, its checks, the signature and
docstring), _epochs (the iteration state machine: iterators, epochs, state_dict) and _views
(loader.sampler, loader.dataset, the shard from a DistributedSampler or torch.distributed)."""
from __future__ import annotations

import atexit
import numbers
import os
import weakref
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from . import _C
from ._epochs import _EpochState, _Iterator
from ._keywords import (  # noqa: F401 (IMAGENET_MEAN/STD, TORCHVISION_IMG_EXTENSIONS: gpufeed._loader's names)
    _DTYPES, IMAGENET_MEAN, IMAGENET_STD, TORCHVISION_IMG_EXTENSIONS, Keywords, _integer, document_schema_keywords,
    resolve_keywords)
# distributed_rank_world_size: gpufeed's; _SampleDataset: pickled as gpufeed._loader._SampleDataset
from ._views import _RankSampler, _SampleDataset, distributed_rank_world_size  # noqa: F401


class _CpuConvert:
    """uint8 ``[N, H, W, 3]`` -> ``[N, 3, H, W]`` ``dtype``, ``(x / 255 - mean) / std``, NCHW or
    channels_last: a copy to float32 in the target layout, a multiply and a subtract in float32 (the
    device room's constants: scale = 1 / (255 std), shift = mean / std), then a cast for bfloat16 /
    float16. The same arithmetic as the CUDA kernel and the C++ CPU prefetcher, so float32 results are
    bit-identical across them."""

    def __init__(self, mean, std, dtype: torch.dtype, channels_last: bool):
        scale, shift = _C.normalize_constants(tuple(mean), tuple(std))
        self.scale = torch.tensor(scale, dtype=torch.float32).view(1, 3, 1, 1)
        self.shift = torch.tensor(shift, dtype=torch.float32).view(1, 3, 1, 1)
        self.dtype = dtype
        self.format = torch.channels_last if channels_last else torch.contiguous_format

    def __call__(self, nhwc: torch.Tensor) -> torch.Tensor:
        nchw = nhwc.permute(0, 3, 1, 2)
        out = torch.empty(nchw.shape, dtype=torch.float32, memory_format=self.format)
        out.copy_(nchw)
        out.mul_(self.scale).sub_(self.shift)
        return out if self.dtype == torch.float32 else out.to(self.dtype)


_LIVE: "weakref.WeakSet[DataLoader]" = weakref.WeakSet()


@atexit.register
def _close_live_loaders() -> None:
    """At interpreter exit, before modules are torn down: stop every loader's threads and drop its
    C++ object (a loader still referenced by a global, e.g. a DataLoader worker's copy of
    loader.dataset, would otherwise be reported as leaked)."""
    for loader in list(_LIVE):
        try:
            loader.close()
            loader._c = None
        except Exception:  # noqa: BLE001 (exit must go on; a forked child's loader cannot close)
            pass


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
            the list's folder; labels are class indices). The CLI's ``--data``. A list of them
            (each any of these, or shards, local or remote) mixes several sources: their samples
            are numbered as ``torch.utils.data.ConcatDataset`` numbers them (``samples``,
            ``indices``, ``last_batch["indices"]``), labels kept as each source gives them, and
            each epoch takes from source s a fixed count set by ``weights`` (see there).
        weights: sources mixed (``root`` a list): the relative weight of each, one per source,
            each > 0 (MosaicML streaming's ``Stream(proportion=...)``, litData's
            ``CombinedStreamingDataset(weights=...)``). An epoch of E = ``epoch_size`` samples takes
            k_s = E w_s / sum(w) from source s, rounded by the largest remainder (sum k_s = E,
            |k_s - E w_s / sum(w)| < 1, the same every epoch): whole passes over the source, then
            a different seeded subset of its shards each epoch (of its samples, for a source without
            shards), ordered as ``shuffle_order`` says (docs/DATASETS.md, "Mixing several
            sources"). Default: each source's size (an epoch is each sample once, ConcatDataset's).
            ``source_counts()`` and ``stats()["sources"]`` report the counts. Also for one dataset,
            with ``epoch_size``. ValueError for a count other than one per source or a weight not
            finite and > 0.
        epoch_size: samples per epoch over all sources, >= 0 (streaming's ``epoch_size``): above the
            total it repeats sources, below it samples them down. Default: the sources' total size.
            ``len(loader)``, ``len(loader.sampler)`` and the padding follow it as
            DistributedSampler(epoch_size) would.
        shuffle: permute every epoch with a generator seeded ``seed + epoch``, exactly
            DistributedSampler's order (also with one process).
        device: ``"cpu"`` or ``"cuda[:N]"`` (a torch.device too). CUDA batches are copied from
            pinned slots on a copy stream and made ready on ``torch.cuda.current_stream()`` at
            the time each batch is requested.
        dtype: ``torch.uint8``: the raw images, ``[N, S, S, 3]`` NHWC, unnormalised (on the CPU a
            zero-copy view of the loader's slot, see below); ``torch.float32``, ``bfloat16`` or
            ``float16``: ``[N, 3, S, S]``, ``(x / 255 - mean) / std`` (torchvision's ToTensor +
            Normalize).
        memory_format: ``torch.contiguous_format`` (NCHW) or ``torch.channels_last`` for the
            float dtypes (uint8 is always NHWC).
        rank, world_size: shard as DistributedSampler(num_replicas=world_size, rank=rank,
            shuffle=shuffle, seed=seed) does (padding by repeating the start). Default: the
            initialised torch.distributed process group, else torchrun's RANK/WORLD_SIZE, else 0/1.
            A state_dict() taken on another world_size resumes on this one (load_state_dict).
        extensions: the file names a folder's listing keeps (case-insensitive, with the dot). Default:
            torchvision's ``IMG_EXTENSIONS`` (.jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp), so
            ``samples``, ``dataset`` and a DistributedSampler built over the script's own
            ``torchvision.datasets.ImageFolder`` index the same files; ``gpufeed.IMAGE_EXTENSIONS``
            (the CLI's list: those and .gif) reads GIFs too. File lists and shards list what they
            name.
        sampler: a ``torch.utils.data.distributed.DistributedSampler`` (as a script builds for
            torch's DataLoader): its num_replicas, rank, shuffle, seed and drop_last give the
            order, and its ``epoch`` (its set_epoch) chooses each fresh epoch. Other samplers raise
            ValueError (gpufeed orders samples itself), as do shuffle=True and a rank, world_size
            or seed that contradict it. ``drop_last`` here stays DataLoader's (the last, shorter
            batch); the sampler's drop_last is DistributedSampler's (cut the tail so the ranks'
            shards are disjoint instead of padding). Distributed evaluation that counts every
            sample once is main.py's: ``sampler=DistributedSampler(val, shuffle=False,
            drop_last=True)``, then the ``len(loader.sampler) * world_size:`` tail through
            ``Subset(loader.dataset, ...)``; the default (padding) repeats up to world_size - 1
            samples.
        labels_only: decode nothing: iteration yields ``(None, labels)``, the ``[N]`` int64
            labels (on ``device``) and ``last_batch`` indices of the batches a loader with the
            same dataset and keywords yields with images, read off the listing in the sampler's
            order, with no decode threads or slots (``num_workers`` is 0). For a process that
            needs the labels but not the images, e.g. the last stage of a pipeline-parallel model
            whose first stage reads the images. ``len``, ``set_epoch``, ``indices``,
            ``state_dict`` and ``load_state_dict`` are the image loader's; ``stats`` and
            ``epoch_summary`` raise RuntimeError. Refuses ``on_error="skip"`` (ValueError): a
            skip replaces a sample only a decode finds bad, so the labels would no longer match.
        views (among the keywords below): multi-crop self-supervised views, DINO's collate. A
            preset name (``"dino"``, ``"dinov2"``, ``"dinov2_paper"``; ``local_crops_number``
            sets the local crops) or a list of dicts, one per view, of the view keywords
            ``gpufeed.views_preset`` returns (a view is the train transform's keywords:
            image_size, scale, ratio, interpolation, hflip_p, color_jitter, ...). Iteration then
            yields ``(views, labels)``, ``views`` a list of K tensors, view k ``[N, 3, S_k, S_k]``
            in ``dtype`` (uint8: ``[N, S_k, S_k, 3]``), on ``device``; every view of a sample
            comes from one decode (``stats()["decodes"]``), view k drawn from (seed, epoch,
            index, k) whatever the thread count. ``loader.views`` is the list in force;
            ``load_sample`` and ``dataset[i]`` give a list of K images. Refuses
            ``decode_device`` gpu/auto, ``max_image_size``, ``set_image_size`` and augmentation
            keywords beside the views (ValueError).
        **options: the keywords below, declared once in C++ beside their options structs and
            shared with the CLI (``batch_size`` is ``gpufeed bench --batch-size``); every one
            keyword-only. A value of the wrong type raises TypeError, a refused value ValueError,
            both naming the keyword; None means the default.

{keywords}

    Notes on the keywords: ``num_workers`` threads are C++ threads, not processes (the
    ``num_workers`` attribute is the count the loader started with). ``num_workers="auto"``
    starts with the CPU budget and then runs the fewest threads that keep this loop's data wait
    under 1%, measured from how fast the loop asks for batches; ``stats()["threads"]`` is the
    count now and ``stats()["thread_decisions"]`` says why; the batches are the same. The wait it
    keeps under 1% is the wait for decoded batches: with a float ``dtype`` on the CPU the uint8 ->
    float conversion runs in ``next()`` on the loop's own thread, so the loop's time in ``next()``
    also holds that conversion, which more decode threads would not shorten (``dtype=torch.uint8``,
    or ``device="cuda"``, where the conversion runs on the GPU, leaves it out). ``seed`` with ``shuffle`` orders every epoch
    with a generator seeded ``seed + epoch``, exactly DistributedSampler's order (also with one
    process); each sample's crop, flip and augmentation depend only on (seed, epoch, index),
    whatever the thread count (draw order: gpufeed/transforms/augment.h). ``train`` is torchvision's
    RandomResizedCrop(image_size, scale, ratio) + RandomHorizontalFlip(), else Resize(resize_size)
    + CenterCrop(image_size). ``on_error="skip"`` replaces an unreadable sample by the next good
    sample of this rank's epoch order (batch shapes and the number of batches stay fixed, so DDP
    ranks stay in step); each skip is in ``epoch_summary()``, and more than ``max_skips`` in one
    epoch raises gpufeed.SkipLimitExceeded. CPU uint8 batches are views of their slots and a
    ``for`` loop holds the previous batch while it asks for the next, so they need
    ``prefetch_depth >= 2``. The augmentations (``auto_augment``, ``color_jitter`` and
    ``color_jitter_p``, ``grayscale_p``, ``gaussian_blur_p``, ``solarize_p``, ``random_erase``)
    run on the train transform after the flip with torchvision.transforms.v2's
    semantics and pixels (fill 0); gpufeed erases the uint8 image with the value that normalises
    nearest to ``random_erase_value`` under ``mean``/``std``. A stale or corrupt listing cache
    (``index_cache``) is rebuilt, never trusted; a cache folder that cannot be written means no
    cache, never an error.

    Iterating yields ``(images, labels)``: labels are ``[N]`` int64 on ``device``. CPU uint8
    batches are views of the loader's slot, not copies: the slot returns to the loader only when
    the last tensor referring to it (images or labels, or a view of them) is freed, so never hold
    more than ``prefetch_depth - 1`` batches at once (iteration raises RuntimeError if every slot
    is held); ``.clone()`` what you keep. The float dtypes and CUDA batches are fresh tensors.

    Epochs: each ``iter(loader)`` runs one epoch, ``set_epoch(e)`` chooses it (as
    DistributedSampler.set_epoch); without set_epoch the epochs count 0, 1, 2, ... by themselves
    (with ``sampler=``, the sampler's epoch is used, as torch's DataLoader does). As with torch's
    DataLoader over a DistributedSampler, an iterator runs the epoch that set_epoch named before
    its first ``next()`` (decoding starts at ``iter()`` and is redone if set_epoch changes it), and
    an iterator that never yields uses up no epoch: Lightning's and Accelerate's loops make
    iterators before they call set_epoch. One epoch runs at a time: an iterator raises
    StopIteration for good once exhausted, and RuntimeError when used after a newer
    ``iter(loader)`` (breaking out of an epoch and starting the next is fine) or, if it had
    yielded, after a ``load_state_dict()``.

    What scripts and frameworks read off a torch DataLoader is there: ``dataset`` (a map-style
    torch Dataset over the samples, ``dataset[i]`` = ``(image, label)`` as the batches carry them),
    ``sampler`` (this rank's indices), ``batch_sampler``, ``batch_size``, ``drop_last``,
    ``num_workers``, ``pin_memory`` (True for CUDA: the slots are page-locked), ``collate_fn``
    (None), ``len(loader)``; ``state_dict``/``load_state_dict`` follow torchdata's
    StatefulDataLoader in every order of calls.

    Raises (from iteration): gpufeed.DecodeError, gpufeed.SkipLimitExceeded, KeyboardInterrupt
    (Ctrl-C while waiting; the pending batch is kept for the next ``next()``), RuntimeError.
    Construction raises RuntimeError naming the path when ``root`` is not a dataset, ValueError
    for bad options, and KeyboardInterrupt on Ctrl-C while it lists a folder or opens remote
    shards (their requests are cancelled).
    """

    def __init__(self, root: "str | os.PathLike[str] | Sequence[str | os.PathLike[str]]", *,
                 weights: Optional[Sequence[float]] = None, epoch_size: Optional[int] = None,
                 device: "str | torch.device" = "cpu",
                 dtype: torch.dtype = torch.float32,
                 memory_format: torch.memory_format = torch.contiguous_format, shuffle: bool = False,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 sampler: "Optional[torch.utils.data.distributed.DistributedSampler]" = None,
                 extensions: Optional[Sequence[str]] = None, labels_only: bool = False,
                 _sample_only: bool = False, **options: Any):
        kw = resolve_keywords(root, options, device=device, dtype=dtype, memory_format=memory_format,
                              shuffle=shuffle, rank=rank, world_size=world_size, sampler=sampler,
                              extensions=extensions, labels_only=labels_only)
        self.labels_only = kw.labels_only
        self.device = kw.device
        # One dataset: its path (str); several sources: their paths (list of str).
        self.root = kw.root
        self.weights, self.epoch_size = _mixing(weights, epoch_size)
        self._c = _C._Loader(kw.paths, kw.schema, str(self.device), _DTYPES[kw.dtype],
                             kw.memory_format == torch.channels_last, kw.rank, kw.world_size, kw.shuffle,
                             kw.sampler_drop_last, _sample_only or self.labels_only, kw.extensions, kw.view_rows,
                             self.weights, self.epoch_size)
        # What loader.dataset pickles to load the same samples in another process (a spawned or
        # forkserver DataLoader worker): plain str, int, float, bool and lists only, the checked
        # schema keywords (the seed a sampler= gave included) and the dtype by name, so it
        # unpickles wherever gpufeed imports (a torch.dtype or memory_format pickles as a reference
        # to whichever module holds torch, which a child of `python -c` or a notebook may lack).
        keywords = dict(kw.schema, views=kw.view_rows) if kw.view_rows else dict(kw.schema)
        self._sample_recipe = {"root": self.root, "keywords": keywords, "extensions": list(kw.extensions),
                               "dtype": _DTYPES[kw.dtype], "weights": self.weights, "epoch_size": self.epoch_size}
        self._init_options(kw)
        self._init_torch_attributes(sampler, _sample_only or self.labels_only)
        self._epochs = _EpochState(self)
        _LIVE.add(self)

    def _init_options(self, kw: Keywords) -> None:
        """The options in force as attributes, the schema's read back as the C++ side resolved them."""
        self.batch_size = int(kw.in_force("batch_size"))
        # prefetch_depth="auto": the slots it starts with (stats()["prefetch_depth"]: now).
        depth = kw.in_force("prefetch_depth")
        self.prefetch_depth = 3 if depth == "auto" else int(depth)
        self.drop_last = bool(kw.in_force("drop_last"))
        self.seed = kw.seed
        self.train = bool(kw.in_force("train"))
        self.image_size = int(kw.in_force("image_size"))
        # Multi-crop: the views in force, one dict of every view keyword each (views_preset's
        # form); None for the single-view transform.
        self.views = self._c.views() or None
        self.mean = tuple(float(m) for m in kw.in_force("mean"))
        self.std = tuple(float(v) for v in kw.in_force("std"))
        self.shuffle = kw.shuffle
        self._sampler_drop_last = kw.sampler_drop_last
        self.dtype = kw.dtype
        self.memory_format = kw.memory_format
        self._convert = (_CpuConvert(self.mean, self.std, kw.dtype, kw.memory_format == torch.channels_last)
                         if self.device.type == "cpu" and kw.dtype != torch.uint8 else None)
        self.rank = kw.rank
        self.world_size = kw.world_size
        # shuffle_order as resolved for this dataset ("auto" never stays): "exact" or "shards".
        self.shuffle_order = self._c.shuffle_order()
        self.shard_window = int(kw.in_force("shard_window"))
        self.shard_partitions = int(kw.in_force("shard_partitions"))
        # Each source's samples per epoch when the sampler mixes sources (or resamples one: weights,
        # epoch_size), else None.
        self._mixing_counts = self._c.mixing_counts()

    def _init_torch_attributes(self, sampler: Any, sample_only: bool) -> None:
        """torch.utils.data.DataLoader's attributes, as scripts and frameworks read them."""
        self.num_workers = (0 if self.labels_only else 1) if sample_only else int(self._c.stats()["threads"])
        self.persistent_workers = True  # the decode threads live as long as the loader
        self.multiprocessing_context = None
        self.in_order = True
        self.pin_memory = self.device.type == "cuda" and not self.labels_only
        self.collate_fn = None
        self.timeout = 0
        self.worker_init_fn = None
        self.generator = None
        self._torch_sampler = sampler
        if sampler is not None and len(sampler) != self._c.sampler_size():
            raise ValueError(f"sampler: len(sampler) is {len(sampler)} but this rank gets "
                             f"{self._c.sampler_size()} of the {len(self.samples)} samples of {self.root!r}: "
                             f"the sampler was built over another dataset")

    # ---- iteration --------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch for this rank (len(DataLoader))."""
        if self.labels_only:  # BatchSampler's count over this rank's shard
            n = self._c.sampler_size()
            return n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        return self._c.num_batches()

    def set_image_size(self, size: int) -> None:
        """Progressive resizing (FFCV's ResNet recipe): the train crop side, pixels, of the epochs
        started from the next ``iter(loader)`` on; batches become ``[N, 3, size, size]`` (or
        ``[N, size, size, 3]`` for uint8). A resumed epoch gets the size set before its iter, so
        set the schedule's size for that epoch before iterating (e.g. FFCV's train_imagenet.py
        ``get_resolution(epoch)``; ``gpufeed train --min-res/--max-res`` implements it). Set during
        the previous epoch (any time after its ``iter``), and the loader decodes the next epoch's
        first batches at that size while the previous one ends, so it starts without a wait
        (``prefetch_next_epoch``). Raises ValueError when size exceeds ``max_image_size`` (naming
        both), when size < 1, or on an eval loader."""
        if not self.labels_only:
            self._c.set_image_size(int(size))
        self.image_size = int(size)

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next fresh iteration runs (DistributedSampler.set_epoch): its order and
        its augmentation draws. A state loaded mid-epoch resumes its own epoch first; with
        ``sampler=`` the sampler's set_epoch is called too."""
        self._epochs.set_epoch(epoch)

    def __iter__(self) -> "_Iterator":
        return _Iterator(self, self._epochs.start_iterator())

    @property
    def last_batch(self) -> Dict[str, Any]:
        """The account of the batch the last next() returned ({} before any): epoch, batch_index,
        indices (its dataset indices, in order), skipped (the samples on_error="skip" replaced in
        it) and wait_ms."""
        return self._epochs.last_batch

    # ---- checkpointing (torchdata.stateful_dataloader.StatefulDataLoader's semantics) -------------

    def state_dict(self) -> Dict[str, Any]:
        """Where iteration stands, as plain Python values: load it into a loader with the same
        dataset and options and iterate to get exactly the batches an uninterrupted run would
        still yield (the rest of the epoch when taken mid-epoch, else the next epoch).

        It describes the current iterator, as StatefulDataLoader's does: the one the last
        ``iter(loader)`` returned, or, before any, the one the next ``iter()`` will return (so a
        state_dict() right after load_state_dict() equals the loaded state). Keys: version, epoch,
        batches_yielded, finished (the iterator raised StopIteration), next_epoch (the epoch a
        fresh iteration runs after it), sampler_drop_last, epoch_world_size and epoch_start (the
        epoch's DistributedSampler list is the one for epoch_world_size ranks, and its first
        epoch_start positions were consumed before this run's ranks were dealt the rest: world_size
        and 0 unless the epoch was resumed from another number of ranks), and the options it was
        taken with (dataset_size, batch_size, shuffle, drop_last, seed, shuffle_order and, for
        "shards", shard_window and shard_partitions, and source_sizes and samples_per_epoch (each
        source's count per epoch when sources are mixed, else None), which resuming must match;
        weights and epoch_size, recorded as given: weights giving the same counts resume alike; a
        state without shuffle_order is "exact", one without source_sizes a single dataset; rank and
        world_size, which it need not: see load_state_dict). The sources' paths are not recorded
        (a run may resume reading the same data from another place): sources of the same sizes
        and counts are taken to be the same. A mixed epoch resumes on another world_size as any
        other: its global list is one for every world size, so each remaining position of it is
        delivered once."""
        return self._epochs.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restores a state_dict(): the next ``iter(loader)`` resumes from it, and so does an
        iterator made before this call that has not yielded yet; one that has yielded batches of
        its own epoch raises RuntimeError ("superseded") from then on, never a silent restart
        (torchdata's StatefulDataLoader goes on with that iterator's own epoch, ignoring the
        loaded state). ``{}`` is a no-op, as in StatefulDataLoader.

        Same world_size: a state of another rank resumes this rank at the same position (the ranks
        of a job step together; Lightning loads rank 0's state on every rank), exactly as an
        uninterrupted run goes on.

        Another world_size (resuming on another number of ranks, docs/SCALING.md): the ranks of
        the old run consumed in lockstep, so one rank's state tells which positions of the epoch's
        DistributedSampler list were consumed (batches_yielded x batch_size per rank); the rest is
        dealt to this run's ranks as DistributedSampler deals (rank r takes remaining[r::world_size])
        without padding, so across the new ranks every sample the old run had not consumed is
        delivered exactly once, and the ranks' batch counts may differ by one (DDP: use
        ``torch.distributed.algorithms.Join``, as for validation tails). A short last batch is
        still dropped with ``drop_last``, the only exception. The next epoch is
        DistributedSampler(num_replicas=world_size, rank=rank) order. state_dict() then describes
        the position in this run (epoch_world_size, epoch_start, batches_yielded of this rank's
        share), so it can be resumed again on any number of ranks.

        Raises ValueError when the state was taken with options that give other batches (dataset
        size, batch_size, shuffle, drop_last, the sampler's drop_last, seed), is not a complete
        gpufeed state, is a version-2 state (no sampler drop_last) of another world_size, or is
        the state of a rank whose share of a resumed epoch ran out while rank 0 may still have had
        a batch (take rank 0's state); TypeError for a value of the wrong type."""
        self._epochs.load_state_dict(state)

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
        DistributedSampler(...).set_epoch(epoch) yields (under ``shuffle_order="shards"`` or when
        mixing sources, this rank's contiguous run of the epoch's global list instead); batch k
        holds indices[k * batch_size:(k + 1) * batch_size]."""
        return self._c.sampler_indices(self._epochs.current_epoch() if epoch is None else epoch)

    def _source_sizes(self) -> List[int]:
        """[S] samples of each source (one entry for a single dataset)."""
        offsets = self._c.source_offsets()
        return [b - a for a, b in zip(offsets, offsets[1:])]

    def source_counts(self, epoch: Optional[int] = None) -> Dict[str, List[int]]:
        """Each source's samples in `epoch` (default: the current one), one entry per source in
        ``root``'s order (one for a single dataset): ``samples_per_epoch``, its count in the epoch
        across all ranks before padding (k_s, see ``weights``; the same every epoch), and
        ``rank_samples``, its count among this rank's ``indices(epoch)`` (padding and a resumed
        epoch's share included)."""
        e = self._epochs.current_epoch() if epoch is None else _integer("epoch", epoch)
        counts = self._c.source_counts(e)
        if counts is None:
            return {"samples_per_epoch": [self._c.epoch_samples()], "rank_samples": [len(self.indices(e))]}
        return {"samples_per_epoch": list(counts[0]), "rank_samples": list(counts[1])}

    # ---- what scripts read off a torch.utils.data.DataLoader ------------------------------------

    @property
    def dataset(self) -> "_SampleDataset":
        """A map-style ``torch.utils.data.Dataset`` over this loader's samples (see
        ``_SampleDataset``): ``len`` = dataset size, ``dataset[i]`` = ``(image, label)`` with the
        loader's transform, dtype and layout for one sample."""
        return _SampleDataset(self, self._sample_recipe)

    @property
    def sampler(self) -> "torch.utils.data.Sampler":
        """This rank's index sampler: the DistributedSampler given as ``sampler=``, else a view
        with DistributedSampler's interface (``len`` = this rank's samples per epoch; iteration
        = this rank's indices of the current epoch; ``set_epoch``). With
        ``shuffle_order="shards"`` (chosen, or "auto" on remote shards), and when sources are
        mixed (a list ``root``, ``weights`` or ``epoch_size``), it is always the view, whose
        iteration is the order the loader reads (a DistributedSampler given as ``sampler=`` still
        sets the epoch, but its own iteration would not be the loader's order)."""
        if self._torch_sampler is not None and self.shuffle_order == "exact" and self._mixing_counts is None:
            return self._torch_sampler
        return _RankSampler(self)

    @property
    def batch_sampler(self) -> torch.utils.data.BatchSampler:
        """``BatchSampler(sampler, batch_size, drop_last)``: the index lists of this rank's
        batches (what the loader yields when no sample is skipped)."""
        return torch.utils.data.BatchSampler(self.sampler, self.batch_size, self.drop_last)

    # ---- accounts ---------------------------------------------------------------------------------

    def epoch_summary(self) -> Dict[str, Any]:
        """The current epoch's skip account over the batches yielded so far: epoch, batches,
        samples, skipped, complete, skipped_by_kind {kind: n}, skips [{index, replaced_by,
        position, path, kind, reason}] (on_error="skip"; see DecodeError.kind for the kinds), wait_s
        (seconds this epoch's iteration waited for decoded batches) and first_wait_s (its part for
        the first batch, which the loader decodes while the previous epoch ends)."""
        self._decoding("epoch_summary")
        return self._c.epoch_summary()

    def stats(self) -> Dict[str, Any]:
        """The loader's counters over its life: samples, skipped, bytes_read, read_s, decode_s,
        resize_s (thread seconds summed over the workers), decoded_pixels, threads (decode threads
        in use now), prefetch_depth (batch slots now), thread_decisions (num_workers="auto" and
        prefetch_depth="auto": each change of the thread count or of the slots, a dict of epoch,
        batch, from, to, prefetch_depth_from, prefetch_depth_to, sample_cost_us, demand_per_s,
        needed, wait_fraction and why; the rules are gpufeed/loader/thread_tuner.h's and
        gpufeed/loader/loader.h's), slots {ready, in_flight, held, free} now, and for remote
        shards remote: {requests, bytes_fetched (requests that succeeded, the open's included, and
        their body bytes), cache_hits, cache_hit_bytes (samples read from cache_dir),
        cache_checksum_failures, cache_read_errors (cached samples whose bytes failed their CRC-32C
        or could not be read back: dropped and fetched again), dataset_bytes (the shards' sizes:
        bytes_fetched / dataset_bytes is the egress in copies of the dataset), chunks_fetched,
        chunks_refetched (remote_read="shards": whole shards or chunks fetched, and those fetched
        again after being dropped to keep remote_shards_in_flight), peak_held_bytes (the most shard
        bytes one reader held in memory)}, summed over the dataset's life. With several sources,
        ``sources``: one dict per source, {name, size, samples_per_epoch, rank_samples (the current
        epoch's, as ``source_counts()``), remote (as above, a remote source only)}, and ``remote``
        the sum over the remote sources (peak_held_bytes summed too)."""
        self._decoding("stats")
        d = self._c.stats()
        if "sources" in d:
            counts = self.source_counts()
            for source, total, mine in zip(d["sources"], counts["samples_per_epoch"], counts["rank_samples"]):
                source.update(samples_per_epoch=total, rank_samples=mine)
            remote = [s["remote"] for s in d["sources"] if "remote" in s]
            if remote:
                d["remote"] = {k: sum(r[k] for r in remote) for k in remote[0]}
        return d

    def _decoding(self, what: str) -> None:
        if self.labels_only:
            raise RuntimeError(f"gpufeed.DataLoader.{what}(): a labels_only loader decodes nothing")

    def load_sample(self, index: int, epoch: int, image_size: Optional[int] = None) -> torch.Tensor:
        """Sample `index` of `epoch` decoded and transformed exactly as the workers do it,
        [S, S, 3] uint8, S = image_size (default: the running epoch's, else the next one's; train
        only, eval keeps its crop). Needs no decode threads: works in a forked process too.
        Raises IndexError, gpufeed.DecodeError, and KeyboardInterrupt on Ctrl-C while a remote
        read waits (that read is dropped; the loader and later reads go on)."""
        size = self._epochs.current_image_size() if image_size is None else _integer("image_size", image_size, 1)
        return self._c.load_sample(_integer("index", index), epoch, size)

    # ---- life -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Cancels the epoch's pending work and frees the slots no live tensor holds (also done
        when the loader is garbage-collected). Tensors from earlier batches stay valid."""
        self._epochs.close()
        self._c.close()

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"gpufeed.DataLoader(root={self.root!r}, samples={len(self.samples)}, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, train={self.train}, image_size={self.image_size}, device={self.device}, "
                f"dtype={self.dtype}, rank={self.rank}, world_size={self.world_size})")


def _mixing(weights: Any, epoch_size: Any) -> Tuple[Optional[List[float]], Optional[int]]:
    """weights and epoch_size checked for type (the C++ side checks the values): TypeError naming
    the keyword."""
    if isinstance(weights, torch.Tensor):
        weights = weights.tolist()
    if weights is not None:
        if isinstance(weights, (str, bytes, dict)) or not hasattr(weights, "__iter__"):
            raise TypeError(f"weights must be a sequence of numbers, one per source, not {type(weights).__name__}")
        weights = list(weights)
        for w in weights:
            if isinstance(w, bool) or not isinstance(w, numbers.Real):
                raise TypeError(f"weights: each weight must be a number, not {w!r}")
        weights = [float(w) for w in weights]
    if epoch_size is not None:
        epoch_size = _integer("epoch_size", epoch_size, 0, 2**63 - 1)
    return weights, epoch_size


document_schema_keywords(DataLoader)
