"""gpufeed.DataLoader's iteration state machine, torchdata's StatefulDataLoader's: iterators,
epochs, state_dict and load_state_dict."""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

import torch

from ._keywords import _INT64_MAX, _integer

if TYPE_CHECKING:
    from ._loader import DataLoader

_STATE_VERSION = 3


class _Cursor:
    """Where one iterator stands; the loader's _EpochState keeps its current one (without a
    reference back, so a loader nobody refers to is freed at once). An iterator is planned at
    iter() (decoding starts) and committed at its first next(), when its start (epoch, position)
    is fixed."""

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

    def __init__(self, loader: "DataLoader", cursor: _Cursor):
        self._loader = loader
        self._cursor = cursor

    def __iter__(self) -> "_Iterator":
        return self

    def __next__(self) -> Tuple[torch.Tensor, torch.Tensor]:
        return self._loader._epochs.next_batch(self._cursor)

    def __len__(self) -> int:
        return len(self._loader)

    @property
    def finished(self) -> bool:
        """It has raised StopIteration."""
        return self._cursor.finished


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


class _EpochState:
    """The iteration state machine, torchdata.stateful_dataloader.StatefulDataLoader's: the
    current iterator (made by iter() or by a state_dict() before any iter()), the state a
    load_state_dict() left for the next iterator, and the iterator whose epoch runs in C++.
    gpufeed.DataLoader owns one and delegates iteration, set_epoch and checkpointing to it; it reads
    the loader's C++ object and options through a weak proxy (no reference back, so a loader
    nobody refers to is freed at once)."""

    def __init__(self, loader: "DataLoader"):
        self._loader = weakref.proxy(loader)
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
        self._targets: Optional[torch.Tensor] = None  # labels_only: the labels in dataset order

    # ---- iteration --------------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """DataLoader.set_epoch: the epoch the next fresh iteration runs; a sampler= is told too."""
        epoch = _integer("epoch", epoch, -2**63, _INT64_MAX)
        self._next_epoch = epoch
        self._epoch_set_while_running = self._running is not None
        if self._loader._torch_sampler is not None:
            self._loader._torch_sampler.set_epoch(epoch)

    def _fresh_epoch(self) -> int:
        """The epoch an iterator that starts from the beginning runs now."""
        if self._loader._torch_sampler is not None:
            return int(getattr(self._loader._torch_sampler, "epoch", self._next_epoch))
        return self._next_epoch

    def _pending_start(self) -> Tuple[int, int, Optional[Tuple[int, int]]]:
        """(epoch, batches already yielded, resume) where an iterator whose first next() came now
        would start: the state a load_state_dict() left (kept until an iterator yields, so an
        iterator that never yields consumes it no more than an epoch), else a fresh epoch."""
        state = self._next_iter_state
        if state is not None and not state["finished"]:
            return int(state["epoch"]), int(state["batches_yielded"]), state["_resume"]
        return self._fresh_epoch(), 0, None

    def start_iterator(self) -> _Cursor:
        """iter(loader): the iterator's cursor, planned (its epoch decoding starts)."""
        if self._closed:
            raise RuntimeError("gpufeed.DataLoader: the loader was closed")
        if self._initial_iter_for_state_dict:  # the iterator a state_dict() before any iter() described
            self._initial_iter_for_state_dict = False
            it = self._iterator
        else:
            it = _Cursor()
        self._iterator = it
        self._plan(it, self._pending_start())
        return it

    def _plan(self, it: "_Cursor", start: Tuple[int, int, Optional[Tuple[int, int]]]) -> None:
        """Starts decoding from `start` = (epoch, batches yielded, resume) for `it`, which
        supersedes the running iterator. Nothing is consumed: an iterator that never yields uses up
        no epoch, and its first next() re-plans if a set_epoch or load_state_dict moved its start."""
        epoch, batches, resume = start
        self._loader._c.set_resume(None if resume is None else (epoch, *resume))  # labels_only's indices too
        if not self._loader.labels_only:
            self._loader._c.start_epoch(epoch, batches)
        it.planned = (epoch, batches, resume, self._loader.image_size)
        it.image_size = self._loader.image_size
        self._running = it

    def _commit(self, it: "_Cursor") -> None:
        """An iterator's first next(): its start is the one set_epoch or a loaded state names now
        (a DistributedSampler's iterator reads its epoch at its first next()); it consumes the
        loaded state, and the next fresh iterator runs the epoch after it."""
        start = self._pending_start()
        self._next_iter_state = None
        it.epoch, it.batches_yielded, it.resume = start
        if it.planned != (*start, self._loader.image_size):
            self._plan(it, start)
        if self._loader.labels_only:
            self._epoch_indices = self._loader._c.sampler_indices(it.epoch)
        self._epoch_set_while_running = False
        self._next_epoch = it.epoch + 1
        it.committed = True

    def next_batch(self, it: "_Cursor") -> Tuple[torch.Tensor, torch.Tensor]:
        """next() of the iterator `it` is the cursor of."""
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
        if self._loader.labels_only:
            return self._next_labels(it)
        return self._loader._c.next(self._wait_slice_s, self._stream())

    def _deliver(self, it: "_Cursor", out: Tuple[Any, torch.Tensor, Dict[str, Any]]) -> Tuple[Any, torch.Tensor]:
        """Batch `out` as the caller gets it, counted as yielded by `it` only once nothing can
        interrupt: Ctrl-C (or an error) while the CPU float conversion runs keeps `out` for `it`'s
        next call, so that call returns this batch."""
        images, labels, info = out
        try:
            if self._loader.labels_only:
                images = None
            elif self._loader._convert is not None:  # CPU, float: the slot's views become copies (the slot is freed)
                convert = self._loader._convert
                images = [convert(v) for v in images] if isinstance(images, list) else convert(images)
                labels = labels.clone()
        except BaseException:
            self._held = (it, out)
            raise
        it.batches_yielded += 1
        self.last_batch = info
        return images, labels

    def _stream(self) -> int:
        """The caller's current CUDA stream (the batch is made ready on it), 0 on the CPU."""
        return torch.cuda.current_stream(self._loader.device).cuda_stream if self._loader.device.type == "cuda" else 0

    def _next_labels(self, it: "_Cursor") -> Optional[Tuple[None, torch.Tensor, Dict[str, Any]]]:
        """labels_only: batch ``it.batches_yielded`` of the running epoch as (None, [N] int64
        labels on ``device``, last_batch info), or None after the last one."""
        k = it.batches_yielded
        n = len(self._epoch_indices)  # a resumed epoch's share may be shorter than len(self._loader)'s
        if k >= (n // self._loader.batch_size if self._loader.drop_last else -(-n // self._loader.batch_size)):
            return None
        indices = self._epoch_indices[k * self._loader.batch_size:(k + 1) * self._loader.batch_size]
        if self._targets is None:
            self._targets = torch.tensor(self._loader.targets, dtype=torch.int64)
        labels = self._targets[torch.tensor(indices, dtype=torch.int64)].to(self._loader.device)
        return None, labels, {"epoch": it.epoch, "batch_index": k, "indices": list(indices), "skipped": [],
                              "wait_ms": 0.0}

    # ---- checkpointing --------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """DataLoader.state_dict (its docstring says what it holds)."""
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
        epoch_world_size, epoch_start = (self._loader.world_size, 0) if resume is None else resume
        return {
            "version": _STATE_VERSION,
            "epoch": epoch,
            "batches_yielded": batches,
            "finished": finished,
            "next_epoch": next_epoch,
            "num_batches": len(self._loader),
            "epoch_world_size": epoch_world_size,
            "epoch_start": epoch_start,
            **self._identity(),
        }

    def _identity(self) -> Dict[str, Any]:
        """The options a state_dict can only be resumed with."""
        loader = self._loader
        return {"dataset_size": len(loader.samples), "batch_size": loader.batch_size, "shuffle": loader.shuffle,
                "drop_last": loader.drop_last, "sampler_drop_last": loader._sampler_drop_last, "seed": loader.seed,
                "rank": loader.rank, "world_size": loader.world_size, "shuffle_order": loader.shuffle_order,
                "shard_window": loader.shard_window, "shard_partitions": loader.shard_partitions,
                "source_sizes": loader._source_sizes(), "samples_per_epoch": loader._mixing_counts,
                "weights": loader.weights, "epoch_size": loader.epoch_size}

    @staticmethod
    def _check_order(state: Dict[str, Any], mine: Dict[str, Any]) -> None:
        """The state's order is this loader's: shuffle_order (a state without it is DistributedSampler's,
        "exact"), for "shards" its window and partitions, and the mixing of sources."""
        keys = ("shuffle_order",) + (("shard_window", "shard_partitions") if mine["shuffle_order"] == "shards" else ())
        # Mixing: the sources' sizes and each one's count per epoch, which with the seed fix every
        # epoch's list (a state without them: one dataset, not mixed). Weights and epoch_size are
        # recorded as given, not compared: proportional weights give the same counts.
        defaults = {"shuffle_order": "exact", "source_sizes": [state.get("dataset_size")]}
        for key in keys + ("source_sizes", "samples_per_epoch"):
            theirs = state.get(key, defaults.get(key))
            if theirs != mine[key]:
                raise ValueError(f"gpufeed.DataLoader.load_state_dict: the state has {key}={theirs!r}, "
                                 f"this loader {mine[key]!r}: resuming would yield other batches")

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """DataLoader.load_state_dict (its docstring gives the rules and the errors)."""
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
        self._check_order(state, mine)
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
        if world_size == self._loader.world_size:
            # Another rank's state is this rank's too: the ranks of a job stand at the same position.
            _integer("state['batches_yielded']", batches, 0, len(self._loader))
        elif state["finished"]:  # the epoch ran to its end: the next one starts on this world size
            _integer("state['batches_yielded']", batches, 0)
        elif state["sampler_drop_last"] is None:
            raise ValueError(f"gpufeed.DataLoader.load_state_dict: a version-2 state does not record the "
                             f"sampler's drop_last, which resuming on world_size={self._loader.world_size} instead of "
                             f"{world_size} needs; resume it with world_size={world_size}")
        else:
            batches = _integer("state['batches_yielded']", batches, 0)
            consumed = self._loader._c.consumed_after_batches(epoch_world_size, epoch_start, world_size,
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

    def current_epoch(self) -> int:
        """The epoch running now (or resumed next), else the one the next iteration starts."""
        it = self._iterator
        if it is not None and it.committed and not it.finished and not self._epoch_set_while_running:
            return it.epoch
        return self.epoch_of_next_iter()

    def epoch_of_next_iter(self) -> int:
        """The epoch the next ``iter(loader)`` will run (if set_epoch is not called before its
        first next())."""
        return self._pending_start()[0]

    def current_image_size(self) -> int:
        """The train crop side of the running epoch, else of the next one."""
        it = self._running
        return it.image_size if it is not None and not it.finished else self._loader.image_size

    def close(self) -> None:
        """The loader closed: iterators raise RuntimeError; the held batch's slots go back."""
        self._closed = True
        self._running = None
        self._held = None
