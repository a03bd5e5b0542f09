"""gpufeed.DataLoader's torch-compat views: what scripts and frameworks read off a
torch.utils.data.DataLoader (``loader.sampler``, ``loader.dataset``) and how a torch
DistributedSampler or torch.distributed's process group gives the loader its shard."""
from __future__ import annotations

import operator
import os
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

if TYPE_CHECKING:
    from ._loader import DataLoader


def distributed_rank_world_size() -> Tuple[int, int]:
    """(rank, world_size) as a DistributedSampler would default them: the initialised
    torch.distributed process group, else torchrun's environment (RANK, WORLD_SIZE), else (0, 1)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "WORLD_SIZE" in os.environ:
        return int(os.environ.get("RANK", "0")), int(os.environ["WORLD_SIZE"])
    return 0, 1


class _RankSampler(torch.utils.data.Sampler):
    """``loader.sampler``: this rank's dataset indices, as the DistributedSampler a
    torch.utils.data.DataLoader would hold (``len`` = samples per epoch for this rank, padding
    included; iteration = the indices of the loader's current epoch; ``set_epoch``).
    ``shuffle_order`` says whose order iteration gives: "exact" (DistributedSampler's, index for
    index) or "shards" (the shard-aware order: the same length and padding, another order)."""

    def __init__(self, loader: "DataLoader"):
        self._loader = loader
        self.num_replicas = loader.world_size
        self.rank = loader.rank
        self.shuffle = loader.shuffle
        self.seed = loader.seed
        self.shuffle_order = loader.shuffle_order

    @property
    def epoch(self) -> int:
        """The epoch iteration describes: the running (or resumed) epoch, else the next one."""
        return self._loader._epochs.current_epoch()

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

    # Pickled by the name gpufeed._loader._SampleDataset: the module that unpickling imports is
    # the one whose DataLoader a copy rebuilds its sample-only loader with.
    __module__ = "gpufeed._loader"

    def __init__(self, loader: Optional["DataLoader"], recipe: Dict[str, Any]):
        self._loader = loader
        self._recipe = recipe  # DataLoader._sample_recipe: plain values only
        self._epoch = 0
        self._image_size = 0
        self._rebuilt = False

    def _source(self) -> "DataLoader":
        if self._loader is None:  # unpickled in another process: samples only, no threads or slots
            from ._loader import DataLoader
            r = self._recipe
            keywords = dict(r["keywords"], num_workers=1, prefetch_depth=2, batch_size=1)
            self._loader = DataLoader(r["root"], extensions=r["extensions"], device="cpu", dtype=torch.uint8,
                                      rank=0, world_size=1, weights=r.get("weights"),
                                      epoch_size=r.get("epoch_size"), _sample_only=True, **keywords)
        return self._loader

    def __getstate__(self) -> Dict[str, Any]:
        if self._loader is not None and not self._rebuilt:
            epochs = self._loader._epochs
            return {"recipe": self._recipe, "epoch": epochs.current_epoch(), "image_size": epochs.current_image_size()}
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
            dtype = getattr(torch, self._recipe["dtype"])  # torch.uint8, torch.float32, ...
        else:
            image = loader.load_sample(index, loader._epochs.current_epoch())
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
    prefetcher's operations and roundings), then cast to `dtype`. A list (multi-crop views):
    each view alike."""
    if isinstance(image, list):
        return [_normalise_sample(v, dtype, mean, std) for v in image]
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

