"""Resuming a gpufeed.DataLoader state on another number of ranks (docs/SCALING.md, "Resuming on
another number of ranks"): what the old ranks consumed plus what the new ranks deliver is the old
epoch's DistributedSampler list, every remaining sample exactly once, with the pixels and labels an
uninterrupted run gives; the next epoch is torch's DistributedSampler order for the new world size."""
import io
import tarfile

import pytest
import torch
from torch.utils.data import DistributedSampler

import gpufeed
from remote_servers import RangeHTTPServer

N = 27  # the `folder` fixture's samples
EPOCH = 1


def torch_order(n, world, rank, shuffle, seed, drop_last, epoch):
    s = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
    s.set_epoch(epoch)
    return list(s)


def global_list(n, world, shuffle, seed, drop_last, epoch):
    """DistributedSampler's padded (or truncated) list of the epoch: rank r holds positions r, r + world, ..."""
    ranks = [torch_order(n, world, r, shuffle, seed, drop_last, epoch) for r in range(world)]
    return [ranks[p % world][p // world] for p in range(len(ranks[0]) * world)]


def loader_for(root, world, rank, shuffle, sampler_drop_last, num_workers=1, **kw):
    # DistributedSampler's order for the remote kind too (remote shards default to the shard-aware
    # order; test_shard_order.py resumes that one).
    kw = dict(batch_size=2, image_size=8, dtype=torch.uint8, num_workers=num_workers, prefetch_depth=2,
              index_cache="off", shuffle_order="exact", **kw)
    if sampler_drop_last:
        sampler = DistributedSampler(range(N), num_replicas=world, rank=rank, shuffle=shuffle, seed=5, drop_last=True)
        return gpufeed.DataLoader(root, sampler=sampler, **kw)
    return gpufeed.DataLoader(root, rank=rank, world_size=world, shuffle=shuffle, seed=5, **kw)


def take(loader, it, k=None):
    """Up to k batches (None: the rest of the epoch) as [(indices, labels, images)]."""
    out = []
    for images, labels in it:
        out.append((list(loader.last_batch["indices"]), labels.tolist(), images.clone()))
        if k is not None and len(out) == k:
            break
    return out


def old_run(root, world, shuffle, sampler_drop_last, k):
    """`world` ranks take k batches of epoch EPOCH; returns (consumed indices, rank `world - 1`'s
    state, every index's image in the uninterrupted run: the old ranks finish their epoch)."""
    consumed, images, state = [], {}, None
    for rank in range(world):
        loader = loader_for(root, world, rank, shuffle, sampler_drop_last)
        loader.set_epoch(EPOCH)
        it = iter(loader)
        before = take(loader, it, k)
        consumed += [i for idx, _, _ in before for i in idx]
        if rank == world - 1:
            state = loader.state_dict()
        for idx, _, x in before + take(loader, it):
            images.update(zip(idx, x))
    return consumed, state, images


def shards_of(folder, tmp_path):
    """The folder as one WebDataset tar shard (key = class/stem, .jpg and .cls members), in the
    folder's sample order."""
    files = sorted((p.parent.name, p) for p in folder.rglob("*.jpg"))
    classes = sorted({c for c, _ in files})
    path = tmp_path / "train-000000.tar"
    with tarfile.open(path, "w") as tar:
        for c, p in files:
            for name, data in ((f"{c}/{p.stem}.jpg", p.read_bytes()), (f"{c}/{p.stem}.cls", str(classes.index(c)).encode())):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return str(path)


@pytest.mark.parametrize("world,new_world,shuffle,sampler_drop_last,kind",
                         [(4, 3, True, False, "folder"), (4, 3, False, True, "folder"), (2, 3, True, True, "folder"),
                          (2, 3, False, False, "folder"), (4, 1, True, False, "folder"), (4, 3, True, False, "shards"),
                          (4, 3, True, False, "http"), (2, 3, False, True, "http")])
def test_new_ranks_deliver_what_the_old_ranks_left_exactly_once(folder, tmp_path, world, new_world, shuffle,
                                                                sampler_drop_last, kind):
    if kind == "http":  # the shard over HTTP (remote data: its index read from the tar headers)
        shards_of(folder, tmp_path)
        with RangeHTTPServer(tmp_path) as http:
            resume_on_another_world_size(http.url + "/train-000000.tar", world, new_world, shuffle, sampler_drop_last)
    else:
        resume_on_another_world_size(folder if kind == "folder" else shards_of(folder, tmp_path), world, new_world,
                                     shuffle, sampler_drop_last)


def resume_on_another_world_size(root, world, new_world, shuffle, sampler_drop_last):
    k = 2
    consumed, state, reference_images = old_run(root, world, shuffle, sampler_drop_last, k)
    expected = global_list(N, world, shuffle, 5, sampler_drop_last, EPOCH)
    assert state["world_size"] == world and state["batches_yielded"] == k and state["rank"] == world - 1
    assert len(consumed) == k * 2 * world

    delivered, counts = [], []
    for rank in range(new_world):
        loader = loader_for(root, new_world, rank, shuffle, sampler_drop_last, num_workers=rank + 1)
        loader.load_state_dict(state)
        batches = take(loader, iter(loader))
        mine = [i for idx, _, _ in batches for i in idx]
        counts.append(len(mine))
        delivered += mine
        # Dealt as DistributedSampler deals the remaining positions, without padding.
        assert mine == expected[k * 2 * world + rank::new_world]
        targets = loader.targets
        for idx, labels, images in batches:
            assert labels == [targets[i] for i in idx]
            for i, x in zip(idx, images):  # the pixels of the uninterrupted run's same sample
                assert torch.equal(x, reference_images[i]), f"sample {i}"
        # The next epoch is torch's DistributedSampler order for the new world size.
        loader.set_epoch(EPOCH + 1)
        assert [i for idx, _, _ in take(loader, iter(loader)) for i in idx] == \
            torch_order(N, new_world, rank, shuffle, 5, sampler_drop_last, EPOCH + 1)
    assert sorted(consumed + delivered) == sorted(expected)
    assert max(counts) - min(counts) <= 1


def test_a_labels_only_loader_resumes_as_the_image_loader_does(folder):
    consumed, state, _ = old_run(folder, 4, True, False, 1)
    for rank in range(3):
        images = loader_for(folder, 3, rank, True, False)
        labels = loader_for(folder, 3, rank, True, False, labels_only=True)
        images.load_state_dict(state)
        labels.load_state_dict(state)
        assert [y.tolist() for _, y in labels] == [y.tolist() for _, y in images]


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_resumed_epoch_resumes_again_on_a_third_world_size(folder, drop_last):
    """4 ranks take 1 batch, 3 ranks take 1 batch of the rest and checkpoint (rank 0's state), 2
    ranks finish; with batch-level drop_last the last ranks' short last batches are the only
    samples not delivered."""
    consumed, state = [], None
    for rank in range(4):
        loader = loader_for(folder, 4, rank, True, False, drop_last=drop_last)
        loader.set_epoch(EPOCH)
        consumed += [i for idx, _, _ in take(loader, iter(loader), 1) for i in idx]
        state = state or loader.state_dict()
    expected = global_list(N, 4, True, 5, False, EPOCH)  # 28 positions, 7 a rank
    assert sorted(consumed) == sorted(expected[:8])
    middle, state3 = [], None
    for rank in range(3):  # 20 positions left: 7, 7, 6
        loader = loader_for(folder, 3, rank, True, False, drop_last=drop_last)
        loader.load_state_dict(state)
        mine = [i for idx, _, _ in take(loader, iter(loader), 1) for i in idx]
        assert mine == expected[8 + rank::3][:2]
        middle += mine
        state3 = state3 or loader.state_dict()
    assert (state3["world_size"], state3["epoch_world_size"], state3["epoch_start"], state3["batches_yielded"]) == \
        (3, 4, 8, 1)
    last = []
    for rank in range(2):  # 14 positions left: 7 each, 3 batches of 2 and a short one
        loader = loader_for(folder, 2, rank, True, False, drop_last=drop_last)
        loader.load_state_dict(state3)
        mine = [i for idx, _, _ in take(loader, iter(loader)) for i in idx]
        assert mine == expected[14 + rank::2][:6 if drop_last else 7]
        last += mine
    dropped = [expected[26], expected[27]] if drop_last else []
    assert sorted(consumed + middle + last + dropped) == sorted(expected)


def test_states_that_cannot_resume_on_another_world_size_raise(folder):
    # 4 -> 3 ranks after 1 batch each: 8 of 28 positions consumed, 20 left, shares of 7, 7 and 6,
    # 4, 4 and 3 batches. Rank 2's state after its last batch cannot tell whether rank 0 took its
    # fourth: refused, naming rank 0 (whose share is the longest).
    consumed, state, _ = old_run(folder, 4, False, False, 1)
    rank2 = loader_for(folder, 3, 2, False, False)
    rank2.load_state_dict(state)
    assert len(take(rank2, iter(rank2))) == 3
    short_state = rank2.state_dict()
    assert short_state["finished"] is True  # an epoch run to its end resumes at the next one anywhere
    short_state = dict(short_state, finished=False)
    with pytest.raises(ValueError, match="rank 0"):
        loader_for(folder, 2, 0, False, False).load_state_dict(short_state)
    # The sampler's drop_last must match, and a version-2 state (which does not record it) only
    # resumes on its own world size.
    with pytest.raises(ValueError, match="drop_last"):
        loader_for(folder, 3, 0, False, True).load_state_dict(state)
    v2 = {k: v for k, v in state.items() if k not in ("sampler_drop_last", "epoch_world_size", "epoch_start")}
    v2["version"] = 2
    with pytest.raises(ValueError, match="version-2"):
        loader_for(folder, 3, 0, False, False).load_state_dict(v2)
    same = loader_for(folder, 4, 1, False, False)
    same.load_state_dict(v2)
    assert [i for idx, _, _ in take(same, iter(same)) for i in idx] == torch_order(N, 4, 1, False, 5, False, EPOCH)[2:]
    with pytest.raises(ValueError, match="epoch_world_size"):
        loader_for(folder, 3, 0, False, False).load_state_dict(dict(state, epoch_world_size=2))


def test_a_state_taken_at_the_epochs_end_starts_the_next_epoch_on_the_new_world_size(folder):
    old = loader_for(folder, 1, 0, True, False)  # 14 batches of 2: more than a rank of 4 has
    old.set_epoch(EPOCH)
    assert len(take(old, iter(old))) == 14
    state = old.state_dict()
    assert state["finished"] and state["next_epoch"] == EPOCH + 1
    for rank in range(4):
        new = loader_for(folder, 4, rank, True, False)
        new.load_state_dict(state)
        assert [i for idx, _, _ in take(new, iter(new)) for i in idx] == \
            torch_order(N, 4, rank, True, 5, False, EPOCH + 1)
