"""gpufeed.DataLoader's state_dict/load_state_dict against torchdata's StatefulDataLoader (0.11.0):
the same call sequences (iter, next on any live iterator, state_dict, load_state_dict, resume into
a new loader, set_epoch) over the same dataset size must yield the same index batches."""
import random

import pytest
import torch

import gpufeed

stateful = pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is not installed (setup.sh)")
stateful_sampler = pytest.importorskip("torchdata.stateful_dataloader.sampler")

N = 27  # the `folder` fixture's samples


class Pair:
    """A gpufeed loader and the oracle over range(N) with the same batching and sharding."""

    def __init__(self, folder, batch_size, drop_last, world_size, rank):
        self.g = gpufeed.DataLoader(folder, batch_size=batch_size, drop_last=drop_last, rank=rank,
                                    world_size=world_size, image_size=8, dtype=torch.uint8, num_workers=1,
                                    prefetch_depth=2)
        self.sampler = torch.utils.data.DistributedSampler(range(N), num_replicas=world_size, rank=rank,
                                                           shuffle=False)
        self.o = stateful.StatefulDataLoader(range(N), batch_size=batch_size, drop_last=drop_last,
                                             sampler=self.sampler)
        self.iterators = []  # [gpufeed iterator, oracle iterator, made before the last load_state_dict]


def gpufeed_next(loader, it):
    try:
        next(it)
    except StopIteration:
        return "stop"
    except RuntimeError as e:
        assert "superseded" in str(e), e
        return "superseded"
    return list(loader.last_batch["indices"])


def oracle_next(it):
    try:
        return next(it).tolist()
    except StopIteration:
        return "stop"


def run_sequence(folder, rng, config, steps=60):
    pair = Pair(folder, *config)
    saved = []
    log = []
    pending_oracle_state = None  # loaded, and no iterator has yielded since
    for step in range(steps):
        op = rng.choices(["iter", "next", "state", "load", "resume", "set_epoch"], [2, 10, 2, 1, 1, 1])[0]
        if op in ("load", "resume") and not saved:
            op = "state"
        if op == "next" and not pair.iterators:
            op = "iter"
        log.append(op)
        if op == "iter":
            pair.iterators.append([iter(pair.g), iter(pair.o), False])
        elif op == "next":
            k = len(pair.iterators) - 1 if rng.random() < 0.75 else rng.randrange(len(pair.iterators))
            g_it, o_it, before_load = pair.iterators[k]
            newest = k == len(pair.iterators) - 1
            had_yielded = g_it._cursor.committed
            got = gpufeed_next(pair.g, g_it)
            if got == "superseded":
                # The documented differences: torchdata runs an older iterator on beside the newer
                # one, gpufeed one epoch at a time (only an iterator a newer iter() replaced
                # raises); and torchdata's iterator made before load_state_dict goes on with its
                # own epoch, gpufeed's raises if it had yielded.
                assert not newest or (before_load and had_yielded) or pair.g._epochs._running is not g_it._cursor, log
                continue
            if before_load and had_yielded:  # exhausted before the load: it stays exhausted
                assert got == "stop", log
            elif not had_yielded and pending_oracle_state is not None:
                # The first iterator to yield after a load resumes the loaded state, made before the
                # load or not, whatever iterators were made (and never yielded) in between; the
                # oracle's state goes to its first iter() after the load, so it is loaded again here.
                assert newest, log
                pair.o.load_state_dict(pending_oracle_state)
                o_it = pair.iterators[k][1] = iter(pair.o)
            if g_it._cursor.committed and not had_yielded:  # its first next(): it took the loaded state
                pending_oracle_state = None
                pair.iterators[k][2] = False
            assert got == oracle_next(o_it), (log, config)
        elif op == "state":
            # gpufeed describes a loaded state no iterator has consumed yet; the oracle's may
            # describe a later iter() of its own, so the loaded state is its counterpart.
            saved.append((pair.g.state_dict(),
                          pair.o.state_dict() if pending_oracle_state is None else pending_oracle_state))
        elif op in ("load", "resume"):
            j = rng.randrange(len(saved))
            if op == "resume":
                pair = Pair(folder, *config)
            pair.g.load_state_dict(saved[j][0])
            assert pair.g.state_dict() == saved[j][0]  # pytorch/data#1437: the loaded state, not a fresh one
            pair.g.load_state_dict(saved[j][0])
            pair.o.load_state_dict(saved[j][1])
            pending_oracle_state = saved[j][1]
            for entry in pair.iterators:
                entry[2] = True
        else:
            epoch = rng.randrange(5)
            pair.g.set_epoch(epoch)
            pair.sampler.set_epoch(epoch)
    return log


@pytest.mark.parametrize("config", [(4, False, 1, 0), (5, True, 1, 0), (3, False, 2, 1), (4, True, 2, 0),
                                    (2, False, 3, 2)])
def test_random_call_sequences_yield_what_stateful_dataloader_yields(folder, config):
    """(batch_size, drop_last, world_size, rank); 6 random sequences of 60 calls each."""
    for seed in range(6):
        run_sequence(folder, random.Random(seed * 100 + sum(config)), config)


def test_state_dict_right_after_load_equals_the_loaded_state(folder):
    kw = dict(batch_size=4, shuffle=True, seed=2, image_size=8, dtype=torch.uint8)
    a = gpufeed.DataLoader(folder, **kw)
    it = iter(a)
    next(it), next(it)
    state = a.state_dict()
    b = gpufeed.DataLoader(folder, **kw)
    b.load_state_dict(state)
    assert b.state_dict() == state
    assert b.state_dict() == state  # and again
    rest = [list(b.last_batch["indices"]) for _ in b]
    assert rest == [a.indices(0)[k:k + 4] for k in range(8, 27, 4)]


def test_an_iterator_made_before_load_state_dict_resumes_it_or_raises_never_restarts(folder):
    """StatefulDataLoader restarts the epoch when an iterator made before load_state_dict() is
    iterated (prime-rl PR#3332, determined PR#6708: the loaded state is silently ignored). gpufeed
    departs from it: an iterator that has not yielded yet yields the resumed batches; one that has
    yielded raises "superseded"."""
    kw = dict(batch_size=4, shuffle=True, seed=2, image_size=8, dtype=torch.uint8)
    a = gpufeed.DataLoader(folder, **kw)
    it = iter(a)
    next(it), next(it), next(it)
    state = a.state_dict()  # 3 batches into epoch 0
    rest = [a.indices(0)[k:k + 4] for k in range(12, 27, 4)]

    # The oracle's behaviour, which the reports describe: the early iterator starts over.
    oracle = stateful.StatefulDataLoader(range(N), batch_size=4, sampler=stateful_sampler.RandomSampler(range(N)))
    o_it = iter(oracle)
    for _ in range(3):
        next(o_it)
    o_state = oracle.state_dict()
    fresh = stateful.StatefulDataLoader(range(N), batch_size=4, sampler=stateful_sampler.RandomSampler(range(N)))
    early = iter(fresh)
    fresh.load_state_dict(o_state)
    assert len(list(early)) == 7  # a whole epoch of 27 samples in batches of 4, not the 4 resumed ones

    # gpufeed, an iterator that had not yielded: the resumed batches, then the next epoch.
    b = gpufeed.DataLoader(folder, **kw)
    early = iter(b)
    b.load_state_dict(state)
    assert b.state_dict() == state
    assert [list(b.last_batch["indices"]) for _ in early] == rest
    assert [list(b.last_batch["indices"]) for _ in b] == [a.indices(1)[k:k + 4] for k in range(0, 27, 4)]

    # gpufeed, an iterator that had yielded batches of its own epoch: it raises, and iter() resumes.
    c = gpufeed.DataLoader(folder, **kw)
    c.set_epoch(4)
    old = iter(c)
    next(old)
    c.load_state_dict(state)
    with pytest.raises(RuntimeError, match="superseded by load_state_dict"):
        next(old)
    assert [list(c.last_batch["indices"]) for _ in c] == rest
    with pytest.raises(RuntimeError, match="superseded"):
        next(old)


def stream(loader):
    """Batches across epochs, as a training loop takes them: (images, indices)."""
    while True:
        for images, _ in loader:
            yield images.clone(), list(loader.last_batch["indices"])


@pytest.mark.parametrize("cuts", [[2], [2, 2], [1, 3, 1], [0, 5, 2], [7, 1]])
def test_chained_resumes_equal_the_uninterrupted_run(folder, cuts):
    """Resume, take k batches, save, resume again, ...: exactly the uninterrupted run's batches
    over two epochs (a cut at 7 is an epoch's end), shuffled and augmented, images included."""
    kw = dict(batch_size=4, shuffle=True, seed=6, image_size=16, dtype=torch.uint8, auto_augment="ta_wide")
    full = gpufeed.DataLoader(folder, **kw)
    reference = [next(s) for s in [stream(full)] for _ in range(14)]
    got, state = [], None
    for k in cuts + [14 - sum(cuts)]:
        loader = gpufeed.DataLoader(folder, **kw)
        if state is not None:
            loader.load_state_dict(state)
        batches = stream(loader)
        got += [next(batches) for _ in range(k)]
        state = loader.state_dict()
    assert [g[1] for g in got] == [r[1] for r in reference]
    assert all(torch.equal(g[0], r[0]) for g, r in zip(got, reference))


def oracle(seed):
    sampler = stateful_sampler.StatefulDistributedSampler(range(N), num_replicas=2, rank=1, shuffle=True, seed=seed)
    return stateful.StatefulDataLoader(range(N), batch_size=4, sampler=sampler), sampler


def test_shuffled_resume_against_stateful_dataloader(folder):
    """shuffle=True with StatefulDistributedSampler, set_epoch before every epoch as its users do
    (after a resume too): the same batches before and after a resume in the middle of epoch 1."""
    kw = dict(batch_size=4, shuffle=True, seed=11, rank=1, world_size=2, image_size=8, dtype=torch.uint8)
    o, o_sampler = oracle(11)
    g = gpufeed.DataLoader(folder, **kw)
    seq_o, seq_g = [], []

    def run(epochs, stop_after=None):
        for epoch in epochs:
            g.set_epoch(epoch)
            o_sampler.set_epoch(epoch)
            for k, (batch, _) in enumerate(zip(o, g)):
                seq_o.append(batch.tolist())
                seq_g.append(list(g.last_batch["indices"]))
                if stop_after is not None and epoch == epochs[-1] and k + 1 == stop_after:
                    return

    run([0, 1], stop_after=2)
    g_state, o_state = g.state_dict(), o.state_dict()
    o, o_sampler = oracle(11)
    o.load_state_dict(o_state)
    g = gpufeed.DataLoader(folder, **kw)
    g.load_state_dict(g_state)
    run([1, 2])
    assert len(seq_o) == 4 + 4 + 4 and seq_g == seq_o
