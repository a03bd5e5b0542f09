"""gpufeed.DataLoader: the C++ loader in torch.utils.data.DataLoader's vocabulary."""
from __future__ import annotations

import atexit
import math
import numbers
import operator
import os
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from . import _C

_DTYPES = {torch.uint8: "uint8", torch.float32: "float32", torch.bfloat16: "bfloat16",
           torch.float16: "float16"}
_DTYPE_NAMED = {name: dtype for dtype, name in _DTYPES.items()}
# The keywords declared once in C++, beside their options structs (gpufeed/option.h): name, type,
# help, unit, accepted values and default. The signature, the type checks and the docstring's
# keyword list come from them; their values are checked by the same code as the CLI's flags.
_SPECS: Dict[str, Dict[str, Any]] = {s["name"]: s for s in _C.option_specs()}
# gpufeed.DataLoader's own keywords (torch's: where batches go, their layout, the sampler's shard).
_FRONT_KEYWORDS = ("device", "dtype", "memory_format", "shuffle", "rank", "world_size", "sampler", "extensions",
                   "labels_only")
# Where gpufeed.DataLoader's default is not the C++ struct's, as the rows declare it
# (Spec::python_default): torch.utils.data.DataLoader's batch_size=1 (the CLI's bench uses
# LoaderOptions' 256).
_PYTHON_DEFAULTS: Dict[str, Any] = {n: s["python_default"] for n, s in _SPECS.items()
                                    if s["python_default"] is not None}
IMAGENET_MEAN = tuple(_SPECS["mean"]["default"])
IMAGENET_STD = tuple(_SPECS["std"]["default"])
_STATE_VERSION = 3


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
# torchvision.datasets.folder.IMG_EXTENSIONS: the files torchvision's ImageFolder lists.
TORCHVISION_IMG_EXTENSIONS = tuple(_C.TORCHVISION_IMG_EXTENSIONS)


def distributed_rank_world_size() -> Tuple[int, int]:
    """(rank, world_size) as a DistributedSampler would default them: the initialised
    torch.distributed process group, else torchrun's environment (RANK, WORLD_SIZE), else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "WORLD_SIZE" in os.environ:
        return int(os.environ.get("RANK", "0")), int(os.environ["WORLD_SIZE"])
    return 0, 1


def _integer(name: str, value: Any, low: Optional[int] = None, high: Optional[int] = None) -> int:
    """`value` as an int (bool refused), else TypeError; outside [low, high] ValueError; both naming
    the keyword."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__} {value!r}")
    value = operator.index(value)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bounds}, not {value}")
    return value


_INT64_MAX = 2**63 - 1


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _keyword_value(name: str, value: Any) -> Any:
    """A schema keyword's Python value as the C++ check takes it (bool, int, float, str or a list
    of floats): TypeError naming the keyword for a value of the wrong type; the C++ side raises
    ValueError for a refused value."""
    spec = _SPECS[name]
    kind = spec["type"]
    if kind == "bool":
        return bool(value)
    if kind == "int":
        if isinstance(value, str) and spec["words"]:
            return value  # num_workers="auto"; another word is refused in C++ (ValueError)
        if spec["seed_range"]:  # torch.manual_seed's range; seed s orders as s mod 2**64 (as torch's)
            value = _integer(name, value, -2**63, 2**64 - 1)
            return value - 2**64 if value > _INT64_MAX else value
        value = _integer(name, value)
        if not -2**63 <= value <= _INT64_MAX:
            raise ValueError(f"{name}={value} is out of range ({spec['accepted']})")
        return value
    if kind in ("choice", "str"):
        if kind == "str" and isinstance(value, os.PathLike):
            return os.fspath(value)
        if not isinstance(value, str):
            raise TypeError(f"{name} must be {spec['accepted']}, not {type(value).__name__} {value!r}")
        return value
    if kind == "float":
        if isinstance(value, str):
            return value  # one of the words (random_erase_value="random"), checked in C++
        if not _is_number(value):
            raise TypeError(f"{name} must be {spec['accepted']}, not {type(value).__name__} {value!r}")
        return float(value)
    # floats: a number or a sequence of numbers
    if _is_number(value):
        return [float(value)]
    try:
        return [float(v) for v in value]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {spec['accepted']}, not {value!r}") from None


def _schema_keywords(options: Dict[str, Any]) -> Dict[str, Any]:
    """The schema keywords given (None: the default), checked for type; TypeError for an unknown
    keyword, as a Python function raises, with the nearest name."""
    out = {}
    for name, value in options.items():
        if name not in _SPECS:
            import difflib
            near = difflib.get_close_matches(name, list(_SPECS) + list(_FRONT_KEYWORDS), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise TypeError(f"gpufeed.DataLoader() got an unexpected keyword argument {name!r}{hint}")
        if value is None:
            if name == "batch_size":
                raise TypeError("batch_size=None (unbatched samples, as torch's DataLoader) is not supported: "
                                "gpufeed.DataLoader yields batches; use loader.dataset for single samples")
            continue
        out[name] = _keyword_value(name, value)
    for name, default in _PYTHON_DEFAULTS.items():
        out.setdefault(name, default)
    return out


def _keyword_default(name: str) -> Any:
    """The default gpufeed.DataLoader shows for a schema keyword (None: derived from others)."""
    if name in _PYTHON_DEFAULTS:
        return _PYTHON_DEFAULTS[name]
    return _SPECS[name]["default"]


def _keyword_doc(spec: Dict[str, Any]) -> str:
    """One docstring entry, from the schema."""
    default = spec["derived_default"] or repr(_keyword_default(spec["name"]))
    unit = f", {spec['unit']}" if spec["unit"] else ""
    return f"        {spec['name']}: {spec['help']} ({spec['accepted']}{unit}; default {default})."


def _extensions(value: Optional[Sequence[str]]) -> List[str]:
    """The file extensions folders are listed with (None: torchvision's IMG_EXTENSIONS)."""
    if value is None:
        return list(TORCHVISION_IMG_EXTENSIONS)
    if isinstance(value, str):
        value = (value,)
    out = []
    for e in value:
        if not isinstance(e, str) or not e.startswith(".") or len(e) < 2:
            raise ValueError(f"extensions must be names such as '.jpg' (with the dot), not {e!r}")
        out.append(e.lower())
    return out


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
            the list's folder; labels are class indices). The CLI's ``--data``.
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
    whatever the thread count (draw order: gpufeed/loader/augment.h). ``train`` is torchvision's
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

    def __init__(self, root: "str | os.PathLike[str]", *, device: "str | torch.device" = "cpu",
                 dtype: torch.dtype = torch.float32,
                 memory_format: torch.memory_format = torch.contiguous_format, shuffle: bool = False,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 sampler: "Optional[torch.utils.data.distributed.DistributedSampler]" = None,
                 extensions: Optional[Sequence[str]] = None, labels_only: bool = False,
                 _sample_only: bool = False, **options: Any):
        if isinstance(root, bytes):
            root = os.fsdecode(root)
        elif not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a path (str or os.PathLike), not {type(root).__name__}")
        keywords = _schema_keywords(options)
        self.labels_only = bool(labels_only)
        if self.labels_only and keywords.get("on_error") == "skip":
            raise ValueError("labels_only=True with on_error='skip': a skipped sample is replaced by another, "
                             "which only decoding finds out, so labels read off the listing would not match "
                             "the image loader's; send the image loader's labels instead")
        if rank is not None:
            rank = _integer("rank", rank, 0)
        if world_size is not None:
            world_size = _integer("world_size", world_size, 1)
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {list(_DTYPES)}, not {dtype}")
        if memory_format not in (torch.contiguous_format, torch.channels_last):
            raise ValueError(f"memory_format must be torch.contiguous_format or torch.channels_last, "
                             f"not {memory_format}")
        device = torch.device(device)
        depth = keywords.get("prefetch_depth", _keyword_default("prefetch_depth"))
        if isinstance(depth, int) and depth < 2 and dtype == torch.uint8 and device.type == "cpu":
            raise ValueError(
                "prefetch_depth=1 with dtype=torch.uint8 on the CPU: those batches are views of the "
                "loader's slots, and a `for images, labels in loader` loop still holds the previous "
                "batch when it asks for the next, so one slot can never be refilled; use "
                "prefetch_depth >= 2 (or a float dtype, whose batches are copies)")
        seed = 0 if options.get("seed") is None else _integer("seed", options["seed"])
        sampler_drop_last = False
        if sampler is not None:
            shuffle, seed, sampler_drop_last, rank, world_size = _from_distributed_sampler(
                sampler, shuffle, seed, rank, world_size)
            keywords["seed"] = _keyword_value("seed", seed)
        if rank is None or world_size is None:
            env_rank, env_world = distributed_rank_world_size()
            rank = env_rank if rank is None else rank
            world_size = env_world if world_size is None else world_size
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.device = device
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.root = os.fspath(root)
        extensions = _extensions(extensions)
        self._c = _C._Loader(self.root, keywords, str(self.device), _DTYPES[dtype],
                             memory_format == torch.channels_last, rank, world_size, bool(shuffle),
                             sampler_drop_last, _sample_only or self.labels_only, extensions)
        # What loader.dataset pickles to load the same samples in another process (a spawned or
        # forkserver DataLoader worker): plain str, int, float, bool and lists only, the checked
        # schema keywords (the seed a sampler= gave included) and the dtype by name, so it
        # unpickles wherever gpufeed imports (a torch.dtype or memory_format pickles as a reference
        # to whichever module holds torch, which a child of `python -c` or a notebook may lack).
        self._sample_recipe = {"root": self.root, "keywords": dict(keywords), "extensions": list(extensions),
                               "dtype": _DTYPES[dtype]}
        # The options in force, read back as the C++ side resolved them.
        resolved = {name: (keywords[name] if name in keywords else _keyword_default(name)) for name in _SPECS}
        self.batch_size = int(resolved["batch_size"])
        # prefetch_depth="auto": the slots it starts with (stats()["prefetch_depth"]: now).
        self.prefetch_depth = 3 if resolved["prefetch_depth"] == "auto" else int(resolved["prefetch_depth"])
        self.drop_last = bool(resolved["drop_last"])
        self.seed = int(seed)
        self.train = bool(resolved["train"])
        self.image_size = int(resolved["image_size"])
        self.mean = tuple(float(m) for m in resolved["mean"])
        self.std = tuple(float(v) for v in resolved["std"])
        self.shuffle = bool(shuffle)
        self._sampler_drop_last = bool(sampler_drop_last)
        self.dtype = dtype
        self.memory_format = memory_format
        self._convert = (_CpuConvert(self.mean, self.std, dtype, memory_format == torch.channels_last)
                         if self.device.type == "cpu" and dtype != torch.uint8 else None)
        self.rank = rank
        self.world_size = world_size
        self._init_torch_attributes(sampler, _sample_only or self.labels_only)
        self._init_iteration_state()
        _LIVE.add(self)

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

    def _init_iteration_state(self) -> None:
        """The iteration state machine, torchdata.stateful_dataloader.StatefulDataLoader's: the
        current iterator (made by iter() or by a state_dict() before any iter()), the state a
        load_state_dict() left for the next iterator, and the iterator whose epoch runs in C++."""
        self._next_epoch = 0
        self._iterator: Optional[_Cursor] = None
        self._initial_iter_for_state_dict = False
        self._next_iter_state: Optional[Dict[str, Any]] = None
        self._running: Optional[_Cursor] = None
        self._held: Optional[Tuple[_Cursor, Any]] = None  # a batch taken by an interrupted next(), for its cursor
        self._epoch_set_while_running = False
        self._closed = False
        self.last_batch: Dict[str, Any] = {}
        self._wait_slice_s = 0.05
        self._epoch_indices: List[int] = []  # labels_only: the running epoch's indices

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
        epoch = _integer("epoch", epoch, -2**63, _INT64_MAX)
        self._next_epoch = epoch
        self._epoch_set_while_running = self._running is not None
        if self._torch_sampler is not None:
            self._torch_sampler.set_epoch(epoch)

    def _fresh_epoch(self) -> int:
        """The epoch an iterator that starts from the beginning runs now."""
        if self._torch_sampler is not None:
            return int(getattr(self._torch_sampler, "epoch", self._next_epoch))
        return self._next_epoch

    def _pending_start(self) -> Tuple[int, int, Optional[Tuple[int, int]]]:
        """(epoch, batches already yielded, resume) where an iterator whose first next() came now
        would start: the state a load_state_dict() left (kept until an iterator yields, so an
        iterator that never yields consumes it no more than an epoch), else a fresh epoch."""
        state = self._next_iter_state
        if state is not None and not state["finished"]:
            return int(state["epoch"]), int(state["batches_yielded"]), state["_resume"]
        return self._fresh_epoch(), 0, None

    def __iter__(self) -> "_Iterator":
        if self._closed:
            raise RuntimeError("gpufeed.DataLoader: the loader was closed")
        if self._initial_iter_for_state_dict:  # the iterator a state_dict() before any iter() described
            self._initial_iter_for_state_dict = False
            it = self._iterator
        else:
            it = _Cursor()
        self._iterator = it
        self._plan(it, self._pending_start())
        return _Iterator(self, it)

    def _plan(self, it: "_Cursor", start: Tuple[int, int, Optional[Tuple[int, int]]]) -> None:
        """Starts decoding from `start` = (epoch, batches yielded, resume) for `it`, which
        supersedes the running iterator. Nothing is consumed: an iterator that never yields uses up
        no epoch, and its first next() re-plans if a set_epoch or load_state_dict moved its start."""
        epoch, batches, resume = start
        self._c.set_resume(None if resume is None else (epoch, *resume))  # labels_only's indices too
        if not self.labels_only:
            self._c.start_epoch(epoch, batches)
        it.planned = (epoch, batches, resume, self.image_size)
        it.image_size = self.image_size
        self._running = it

    def _commit(self, it: "_Cursor") -> None:
        """An iterator's first next(): its start is the one set_epoch or a loaded state names now
        (a DistributedSampler's iterator reads its epoch at its first next()); it consumes the
        loaded state, and the next fresh iterator runs the epoch after it."""
        start = self._pending_start()
        self._next_iter_state = None
        it.epoch, it.batches_yielded, it.resume = start
        if it.planned != (*start, self.image_size):
            self._plan(it, start)
        if self.labels_only:
            self._epoch_indices = self._c.sampler_indices(it.epoch)
        self._epoch_set_while_running = False
        self._next_epoch = it.epoch + 1
        it.committed = True

    def _next_batch(self, it: "_Cursor") -> Tuple[torch.Tensor, torch.Tensor]:
        if it.finished:
            raise StopIteration  # an exhausted iterator stays exhausted (Python's iterator protocol)
        if self._closed:
            raise RuntimeError("gpufeed.DataLoader: the loader was closed")
        if it.superseded_by_load:
            raise RuntimeError("gpufeed.DataLoader: this iterator was superseded by load_state_dict() (it had "
                               "yielded batches of its own epoch; iter(loader) resumes the loaded state)")
        if it is not self._running:
            raise RuntimeError("gpufeed.DataLoader: this iterator was superseded by a newer "
                               "iter(loader) (one epoch runs at a time)")
        if not it.committed:
            self._commit(it)
        out = self._take(it)
        if out is None:
            it.finished = True
            self._running = None
            raise StopIteration
        return self._deliver(it, out)

    def _take(self, it: "_Cursor") -> Optional[Tuple[Any, torch.Tensor, Dict[str, Any]]]:
        """The next batch of `it` as (images, labels, info), or None after the last: the one an
        interrupted call took and kept, else the C++ loader's."""
        held, self._held = self._held, None
        if held is not None and held[0] is it:
            return held[1]
        del held  # another epoch's: its slots go back now
        return self._next_labels(it) if self.labels_only else self._c.next(self._wait_slice_s, self._stream())

    def _deliver(self, it: "_Cursor", out: Tuple[Any, torch.Tensor, Dict[str, Any]]) -> Tuple[Any, torch.Tensor]:
        """Batch `out` as the caller gets it, counted as yielded by `it` only once nothing can
        interrupt: Ctrl-C (or an error) while the CPU float conversion runs keeps `out` for `it`'s
        next call, so that call returns this batch."""
        images, labels, info = out
        try:
            if self.labels_only:
                images = None
            elif self._convert is not None:  # CPU, float: the slot's views become copies (the slot is freed)
                images, labels = self._convert(images), labels.clone()
        except BaseException:
            self._held = (it, out)
            raise
        it.batches_yielded += 1
        self.last_batch = info
        return images, labels

    def _stream(self) -> int:
        """The caller's current CUDA stream (the batch is made ready on it), 0 on the CPU."""
        return torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0

    def _next_labels(self, it: "_Cursor") -> Optional[Tuple[None, torch.Tensor, Dict[str, Any]]]:
        """labels_only: batch ``it.batches_yielded`` of the running epoch as (None, [N] int64
        labels on ``device``, last_batch info), or None after the last one."""
        k = it.batches_yielded
        n = len(self._epoch_indices)  # a resumed epoch's share may be shorter than len(self)'s
        if k >= (n // self.batch_size if self.drop_last else -(-n // self.batch_size)):
            return None
        indices = self._epoch_indices[k * self.batch_size:(k + 1) * self.batch_size]
        if not hasattr(self, "_targets"):
            self._targets = torch.tensor(self.targets, dtype=torch.int64)
        labels = self._targets[torch.tensor(indices, dtype=torch.int64)].to(self.device)
        return None, labels, {"epoch": it.epoch, "batch_index": k, "indices": list(indices), "skipped": [],
                              "wait_ms": 0.0}

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
        taken with (dataset_size, batch_size, shuffle, drop_last, seed, which resuming must match;
        rank and world_size, which it need not: see load_state_dict)."""
        if self._iterator is None:
            self._iterator = _Cursor()
            self._initial_iter_for_state_dict = True
        it, state = self._iterator, self._next_iter_state
        if it.committed:
            epoch, batches, finished, resume, next_epoch = (it.epoch, it.batches_yielded, it.finished, it.resume,
                                                            self._next_epoch)
        elif state is not None:  # loaded, not yet consumed: the loaded position
            epoch, batches, finished, resume = (int(state["epoch"]), int(state["batches_yielded"]),
                                                bool(state["finished"]), state["_resume"])
            next_epoch = self._next_epoch
        else:
            epoch, batches, finished, resume = self._fresh_epoch(), 0, False, None
            next_epoch = epoch + 1
        epoch_world_size, epoch_start = (self.world_size, 0) if resume is None else resume
        return {
            "version": _STATE_VERSION,
            "epoch": epoch,
            "batches_yielded": batches,
            "finished": finished,
            "next_epoch": next_epoch,
            "num_batches": len(self),
            "epoch_world_size": epoch_world_size,
            "epoch_start": epoch_start,
            **self._identity(),
        }

    def _identity(self) -> Dict[str, Any]:
        """The options a state_dict can only be resumed with."""
        return {"dataset_size": len(self.samples), "batch_size": self.batch_size, "shuffle": self.shuffle,
                "drop_last": self.drop_last, "sampler_drop_last": self._sampler_drop_last, "seed": self.seed,
                "rank": self.rank, "world_size": self.world_size}

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
        if not isinstance(state, dict):
            raise TypeError(f"gpufeed.DataLoader.load_state_dict: a state_dict() dict, not {type(state).__name__}")
        if state == {}:
            self._iterator, self._initial_iter_for_state_dict = None, False
            return
        state = _upgrade_state(state)
        mine = self._identity()
        for key in ("dataset_size", "batch_size", "shuffle", "drop_last", "seed"):
            if state[key] != mine[key]:
                raise ValueError(f"gpufeed.DataLoader.load_state_dict: the state has {key}={state[key]!r}, "
                                 f"this loader {mine[key]!r}: resuming would yield other batches")
        if state["sampler_drop_last"] not in (None, mine["sampler_drop_last"]):
            raise ValueError(f"gpufeed.DataLoader.load_state_dict: the state has the sampler's drop_last="
                             f"{state['sampler_drop_last']!r}, this loader {mine['sampler_drop_last']!r}: "
                             f"resuming would yield other batches")
        _integer("state['epoch']", state["epoch"], -2**63, _INT64_MAX)
        _integer("state['next_epoch']", state["next_epoch"], -2**63, _INT64_MAX)
        if not isinstance(state["finished"], bool):
            raise TypeError(f"gpufeed.DataLoader.load_state_dict: state['finished'] must be a bool, "
                            f"not {state['finished']!r}")
        world_size = _integer("state['world_size']", state["world_size"], 1)
        epoch_world_size = _integer("state['epoch_world_size']", state["epoch_world_size"], 1)
        epoch_start = _integer("state['epoch_start']", state["epoch_start"], 0)
        if epoch_start == 0 and epoch_world_size != world_size:
            raise ValueError(f"gpufeed.DataLoader.load_state_dict: the state's epoch_world_size={epoch_world_size} "
                             f"with epoch_start=0 contradicts its world_size={world_size} (a resumed epoch "
                             f"has positions consumed)")
        resume = None if epoch_start == 0 else (epoch_world_size, epoch_start)
        batches = state["batches_yielded"]
        if world_size == self.world_size:
            # Another rank's state is this rank's too: the ranks of a job stand at the same position.
            _integer("state['batches_yielded']", batches, 0, len(self))
        elif state["finished"]:  # the epoch ran to its end: the next one starts on this world size
            _integer("state['batches_yielded']", batches, 0)
        elif state["sampler_drop_last"] is None:
            raise ValueError(f"gpufeed.DataLoader.load_state_dict: a version-2 state does not record the "
                             f"sampler's drop_last, which resuming on world_size={self.world_size} instead of "
                             f"{world_size} needs; resume it with world_size={world_size}")
        else:
            batches = _integer("state['batches_yielded']", batches, 0)
            consumed = self._c.consumed_after_batches(epoch_world_size, epoch_start, world_size,
                                                      _integer("state['rank']", state["rank"], 0, world_size - 1),
                                                      batches)
            resume, batches = (None if consumed == 0 else (epoch_world_size, consumed)), 0
        self._next_epoch = int(state["next_epoch"])
        self._next_iter_state = dict(state, batches_yielded=batches, _resume=None if state["finished"] else resume)
        self._supersede_for_load()

    def _supersede_for_load(self) -> None:
        """After load_state_dict: the current iterator resumes the loaded state at its first next()
        if it has not yielded yet; one that has yielded batches of its own epoch raises
        RuntimeError from then on (torchdata's StatefulDataLoader would go on with the old epoch,
        silently ignoring the loaded state)."""
        it = self._iterator
        if it is not None and not it.committed:
            if it is self._running:
                self._plan(it, self._pending_start())  # decode the resumed batches now
            return
        if it is not None:
            it.superseded_by_load = True
            if it is self._running:
                self._running = None
        self._iterator, self._initial_iter_for_state_dict = None, False

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
        return self._c.sampler_indices(self._current_epoch() if epoch is None else epoch)

    def _current_epoch(self) -> int:
        """The epoch running now (or resumed next), else the one the next iteration starts."""
        it = self._iterator
        if it is not None and it.committed and not it.finished and not self._epoch_set_while_running:
            return it.epoch
        return self._epoch_of_next_iter()

    def _epoch_of_next_iter(self) -> int:
        """The epoch the next ``iter(loader)`` will run (if set_epoch is not called before its
        first next())."""
        return self._pending_start()[0]

    def _current_image_size(self) -> int:
        """The train crop side of the running epoch, else of the next one."""
        it = self._running
        return it.image_size if it is not None and not it.finished else self.image_size

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
        = this rank's indices of the current epoch; ``set_epoch``)."""
        return self._torch_sampler if self._torch_sampler is not None else _RankSampler(self)

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
        or could not be read back: dropped and fetched again)}, summed over the dataset's life."""
        self._decoding("stats")
        return self._c.stats()

    def _decoding(self, what: str) -> None:
        if self.labels_only:
            raise RuntimeError(f"gpufeed.DataLoader.{what}(): a labels_only loader decodes nothing")

    def load_sample(self, index: int, epoch: int, image_size: Optional[int] = None) -> torch.Tensor:
        """Sample `index` of `epoch` decoded and transformed exactly as the workers do it,
        [S, S, 3] uint8, S = image_size (default: the running epoch's, else the next one's; train
        only, eval keeps its crop). Needs no decode threads: works in a forked process too.
        Raises IndexError, gpufeed.DecodeError, and KeyboardInterrupt on Ctrl-C while a remote
        read waits (that read is dropped; the loader and later reads go on)."""
        size = self._current_image_size() if image_size is None else _integer("image_size", image_size, 1)
        return self._c.load_sample(_integer("index", index), epoch, size)

    # ---- life -------------------------------------------------------------------------------------

    def close(self) -> None:
        """Cancels the epoch's pending work and frees the slots no live tensor holds (also done
        when the loader is garbage-collected). Tensors from earlier batches stay valid."""
        self._closed = True
        self._running = None
        self._held = None
        self._c.close()

    def __enter__(self) -> "DataLoader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"gpufeed.DataLoader(root={self.root!r}, samples={len(self.samples)}, batch_size={self.batch_size}, "
                f"shuffle={self.shuffle}, train={self.train}, image_size={self.image_size}, device={self.device}, "
                f"dtype={self.dtype}, rank={self.rank}, world_size={self.world_size})")


class _Cursor:
    """Where one iterator stands; the loader keeps its current one (without a reference back,
    so a loader nobody refers to is freed at once). An iterator is planned at iter() (decoding
    starts) and committed at its first next(), when its start (epoch, position) is fixed."""

    __slots__ = ("epoch", "batches_yielded", "finished", "committed", "planned", "image_size", "resume",
                 "superseded_by_load")

    def __init__(self):
        self.epoch: Optional[int] = None  # fixed at the first next()
        self.batches_yielded = 0
        self.finished = False
        self.committed = False  # its first next() happened: its epoch is fixed and counted
        self.planned: Optional[Tuple[Any, ...]] = None  # (epoch, batches, resume, image_size) decoding now
        self.image_size = 0  # the train crop side of its epoch, once planned
        # (world size of the epoch's list, its positions consumed before this run's ranks were dealt
        # the rest): the epoch resumes one begun on another number of ranks; None: DistributedSampler's
        self.resume: Optional[Tuple[int, int]] = None
        self.superseded_by_load = False  # it had yielded when load_state_dict() was called


class _Iterator:
    """One epoch of a DataLoader. Unlike a generator it survives an exception: after
    KeyboardInterrupt the pending batch is the next one returned, after a DecodeError
    (on_error="raise") the batch following the failed one. Once it has raised StopIteration it
    keeps raising it; after a newer ``iter(loader)`` started, it raises RuntimeError (one epoch
    runs at a time)."""

    def __init__(self, loader: DataLoader, cursor: _Cursor):
        self._loader = loader
        self._cursor = cursor

    def __iter__(self) -> "_Iterator":
        return self

    def __next__(self) -> Tuple[torch.Tensor, torch.Tensor]:
        return self._loader._next_batch(self._cursor)

    def __len__(self) -> int:
        return len(self._loader)

    @property
    def finished(self) -> bool:
        """It has raised StopIteration."""
        return self._cursor.finished


class _RankSampler(torch.utils.data.Sampler):
    """``loader.sampler``: this rank's dataset indices, as the DistributedSampler a
    torch.utils.data.DataLoader would hold (``len`` = samples per epoch for this rank, padding
    included; iteration = the indices of the loader's current epoch; ``set_epoch``)."""

    def __init__(self, loader: DataLoader):
        self._loader = loader
        self.num_replicas = loader.world_size
        self.rank = loader.rank
        self.shuffle = loader.shuffle
        self.seed = loader.seed

    @property
    def epoch(self) -> int:
        """The epoch iteration describes: the running (or resumed) epoch, else the next one."""
        return self._loader._current_epoch()

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)

    def __len__(self) -> int:
        return self._loader._c.sampler_size()

    def __iter__(self) -> Iterator[int]:
        return iter(self._loader.indices())


class _SampleDataset(torch.utils.data.Dataset):
    """``loader.dataset``: a map-style torch Dataset over the loader's samples, in dataset order.

    ``dataset[i]`` is ``(image, label)``: sample i decoded and transformed exactly as the
    loader's workers do it for the loader's current epoch (eval transforms do not depend on the
    epoch), in the loader's dtype and layout for one sample: ``[3, S, S]`` normalised for the
    float dtypes (contiguous; a 3-d tensor has no channels_last), ``[S, S, 3]`` uint8 for
    torch.uint8; on the CPU; label an int. So ``torch.utils.data.Subset(loader.dataset, range(a,
    b))`` fed to a plain torch.utils.data.DataLoader yields what the loader would (PyTorch's
    examples/imagenet/main.py validates the samples its DistributedSampler(drop_last=True) left
    out that way). It pickles as plain values (the root, the checked keywords, the dtype's
    name, the epoch and crop side), so DataLoader workers under the spawn and forkserver start
    methods, also of a program without a main file (``python -c``, a notebook), rebuild a
    sample-only loader over the same data and load the same pixels. Raises IndexError out of
    range, gpufeed.DecodeError for an unreadable sample. ``classes``, ``class_to_idx``,
    ``samples``, ``targets`` and ``root`` are ImageFolder's."""

    def __init__(self, loader: Optional[DataLoader], recipe: Dict[str, Any]):
        self._loader = loader
        self._recipe = recipe  # DataLoader._sample_recipe: plain values only
        self._epoch = 0
        self._image_size = 0
        self._rebuilt = False

    def _source(self) -> DataLoader:
        if self._loader is None:  # unpickled in another process: samples only, no threads or slots
            r = self._recipe
            keywords = dict(r["keywords"], num_workers=1, prefetch_depth=2, batch_size=1)
            self._loader = DataLoader(r["root"], extensions=r["extensions"], device="cpu", dtype=torch.uint8,
                                      rank=0, world_size=1, _sample_only=True, **keywords)
        return self._loader

    def __getstate__(self) -> Dict[str, Any]:
        if self._loader is not None and not self._rebuilt:
            return {"recipe": self._recipe, "epoch": self._loader._current_epoch(),
                    "image_size": self._loader._current_image_size()}
        return {"recipe": self._recipe, "epoch": self._epoch, "image_size": self._image_size}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self._loader, self._recipe = None, state["recipe"]
        self._epoch, self._image_size = state["epoch"], state["image_size"]
        self._rebuilt = True

    def __len__(self) -> int:
        return len(self._source().samples)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, int]:
        loader = self._source()
        n = len(loader.samples)
        index = operator.index(index)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"gpufeed.DataLoader.dataset: index {index} out of range for {n} samples")
        if self._rebuilt:
            image = loader.load_sample(index, self._epoch, self._image_size)
            dtype = _DTYPE_NAMED[self._recipe["dtype"]]
        else:
            image = loader.load_sample(index, loader._current_epoch())
            dtype = loader.dtype
        return _normalise_sample(image, dtype, loader.mean, loader.std), loader.samples[index][1]

    @property
    def root(self) -> str:
        return self._source().root

    @property
    def classes(self) -> List[str]:
        return self._source().classes

    @property
    def class_to_idx(self) -> Dict[str, int]:
        return self._source().class_to_idx

    @property
    def samples(self) -> List[Tuple[str, int]]:
        return self._source().samples

    @property
    def targets(self) -> List[int]:
        return self._source().targets


def _normalise_sample(image: torch.Tensor, dtype: torch.dtype, mean: Sequence[float],
                      std: Sequence[float]) -> torch.Tensor:
    """One [S, S, 3] uint8 sample as the loader's batches carry it: itself for uint8, else
    [3, S, S] (x * 1/(255 std) - mean/std) in float32 (a multiply, then a subtract: the CPU
    prefetcher's operations and roundings), then cast to `dtype`."""
    if dtype == torch.uint8:
        return image
    std_t = torch.tensor(std, dtype=torch.float32)
    scale = (1.0 / (255.0 * std_t)).view(3, 1, 1)
    shift = (torch.tensor(mean, dtype=torch.float32) / std_t).view(3, 1, 1)
    out = image.permute(2, 0, 1).to(torch.float32)
    out.mul_(scale).sub_(shift)
    return out if dtype == torch.float32 else out.to(dtype)


def _from_distributed_sampler(sampler: Any, shuffle: bool, seed: int, rank: Optional[int],
                              world_size: Optional[int]) -> Tuple[bool, int, bool, int, int]:
    """(shuffle, seed, drop_last, rank, world_size) of a torch DistributedSampler passed as
    ``sampler=``; ValueError for any other sampler or for keywords that contradict it."""
    if not isinstance(sampler, torch.utils.data.distributed.DistributedSampler):
        raise ValueError(f"sampler must be a torch.utils.data.distributed.DistributedSampler (gpufeed "
                         f"follows its num_replicas, rank, shuffle, seed, drop_last and epoch), not "
                         f"{type(sampler).__name__}")
    if shuffle:
        raise ValueError("sampler option is mutually exclusive with shuffle (as in torch.utils.data.DataLoader): "
                         "the sampler's own shuffle is used")
    for name, given, theirs in (("rank", rank, sampler.rank), ("world_size", world_size, sampler.num_replicas)):
        if given is not None and given != theirs:
            raise ValueError(f"{name}={given} contradicts the sampler's {theirs}")
    if seed not in (0, sampler.seed):
        raise ValueError(f"seed={seed} contradicts the sampler's seed {sampler.seed} (with sampler=, the "
                         f"sampler's seed seeds the order and the augmentation)")
    return bool(sampler.shuffle), int(sampler.seed), bool(sampler.drop_last), int(sampler.rank), \
        int(sampler.num_replicas)


_STATE_KEYS = ("epoch", "batches_yielded", "finished", "next_epoch", "dataset_size", "batch_size", "shuffle",
               "drop_last", "sampler_drop_last", "seed", "rank", "world_size", "epoch_world_size", "epoch_start")


def _upgrade_state(state: Dict[str, Any]) -> Dict[str, Any]:
    """A state_dict of this or an earlier version, in this version's keys; ValueError naming what
    is missing or unknown."""
    version = state.get("version")
    if version == 1 and "in_epoch" in state:  # in_epoch instead of finished
        state = dict(state, version=2, finished=not state["in_epoch"])
        del state["in_epoch"]
        version = 2
    if version == 2:  # the epoch's own DistributedSampler list; the sampler's drop_last unrecorded
        state = dict(state, version=_STATE_VERSION, sampler_drop_last=None,
                     epoch_world_size=state.get("world_size"), epoch_start=0)
    elif version != _STATE_VERSION:
        raise ValueError(f"gpufeed.DataLoader.load_state_dict: not a gpufeed.DataLoader state_dict "
                         f"(version {version!r}; this gpufeed writes {_STATE_VERSION})")
    missing = [k for k in _STATE_KEYS if k not in state]
    if missing:
        raise ValueError(f"gpufeed.DataLoader.load_state_dict: the state lacks {', '.join(missing)}")
    return state


def _document_schema_keywords() -> None:
    """DataLoader's signature and docstring: its own keywords, then the schema's, keyword-only,
    with the defaults gpufeed.DataLoader applies (inspect.signature and help() show them)."""
    import inspect
    own = inspect.signature(DataLoader.__init__)
    params = [p for p in own.parameters.values() if p.kind != p.VAR_KEYWORD and p.name != "_sample_only"]
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=_keyword_default(name))
               for name in _SPECS]
    DataLoader.__init__.__signature__ = own.replace(parameters=params)
    DataLoader.__doc__ = DataLoader.__doc__.replace(
        "{keywords}", "\n".join(_keyword_doc(spec) for spec in _SPECS.values()))


_document_schema_keywords()
