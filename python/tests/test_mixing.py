"""gpufeed.DataLoader mixing several sources (root a list, weights, epoch_size; docs/DATASETS.md,
"Mixing several sources"): each source's count per epoch by the largest remainder, taken as whole
passes plus a seeded subset of whole shards, one global order for every world size, a mid-epoch
state resumed on another world size delivering the rest once, and a remote source read one GET per
shard against a local HTTP server."""
import collections
import pathlib
import subprocess

import pytest
import torch

import gpufeed
from conftest import make_image_folder, take_indices as take
from remote_servers import RangeHTTPServer

N_A, N_B = 27, 15  # source A: 3 classes x 9, 4 per shard (7 shards); B: 3 x 5, 5 per shard (3 shards)
SHARDS_A = [4, 4, 4, 4, 4, 4, 3]
WEIGHTS = [1, 2]
EPOCH_SIZE = 40  # quotas 13.33 and 26.67: floors 13 + 26, the one left to B (larger fraction)
COUNTS = [13, 27]
EPOCH = 2


def pack(folder: pathlib.Path, out: pathlib.Path, per_shard: int, cli) -> pathlib.Path:
    subprocess.run([str(cli), "pack", str(folder), str(out), "--max-samples-per-shard", str(per_shard), "--shuffle",
                    "--index-cache", "off", "--progress", "off"], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory, gpufeed_cli):
    root = tmp_path_factory.mktemp("mixing")
    a = pack(make_image_folder(root / "a", per_class=9, seed=31), root / "a_shards", 4, gpufeed_cli)
    b_folder = make_image_folder(root / "b", classes=("ants", "bees", "cats"), per_class=5, seed=32)
    b = pack(b_folder, root / "b_shards", 5, gpufeed_cli)
    assert len(list(a.glob("*.tar"))) == 7 and len(list(b.glob("*.tar"))) == 3
    return {"a": a, "b": b, "b_folder": b_folder, "root": root}


def loader_for(roots, world=1, rank=0, **kw):
    kw = dict(dict(batch_size=2, image_size=8, dtype=torch.uint8, num_workers=1, prefetch_depth=2, index_cache="off",
                   shard_window=2, shard_partitions=4, weights=WEIGHTS, epoch_size=EPOCH_SIZE), **kw)
    return gpufeed.DataLoader([str(r) for r in roots], shuffle=True, seed=5, rank=rank, world_size=world, **kw)


def global_order(roots, world, epoch=EPOCH, **kw):
    """The epoch as the ranks consume it in lockstep (position p: rank p % world's p // world-th)."""
    ranks = []
    for rank in range(world):
        loader = loader_for(roots, world, rank, **kw)
        loader.set_epoch(epoch)
        ranks.append(list(loader.indices()))
    return [ranks[p % world][p // world] for p in range(len(ranks[0]) * world)]


def test_counts_follow_the_weights_by_whole_shards_and_one_global_order_for_world_sizes_1_to_4(sources):
    roots = [sources["a"], sources["b"]]
    loader = loader_for(roots)
    assert loader.root == [str(r) for r in roots] and len(loader.samples) == N_A + N_B
    assert loader.shuffle_order == "exact"  # local sources: auto is one permutation of the picks
    assert len(loader) == EPOCH_SIZE // 2 and len(loader.sampler) == EPOCH_SIZE
    loader.set_epoch(EPOCH)
    order = take(loader, iter(loader))
    assert order == list(loader.indices(EPOCH))
    per_source = collections.Counter(i >= N_A for i in order)
    assert [per_source[False], per_source[True]] == COUNTS
    # B (15 samples, 27 picks): one whole pass plus 12 of it; A: 13 of 27, whole shards but the last.
    b = collections.Counter(i - N_A for i in order if i >= N_A)
    assert set(b) == set(range(N_B)) and sorted(b.values()) == [1] * 3 + [2] * 12
    a = sorted(i for i in order if i < N_A)
    assert len(set(a)) == 13
    starts = [sum(SHARDS_A[:s]) for s in range(len(SHARDS_A))]
    by_shard = collections.Counter(max(s for s, start in enumerate(starts) if start <= i) for i in a)
    assert sum(n != SHARDS_A[s] for s, n in by_shard.items()) <= 1  # at most one shard cut
    counts = loader.source_counts(EPOCH)
    assert counts == {"samples_per_epoch": COUNTS, "rank_samples": COUNTS}
    stats = loader.stats()["sources"]
    assert [s["name"] for s in stats] == [str(r) for r in roots] and [s["size"] for s in stats] == [N_A, N_B]
    assert [s["samples_per_epoch"] for s in stats] == COUNTS and "remote" not in stats[0]
    # Another subset of A the next epoch; the same counts.
    loader.set_epoch(EPOCH + 1)
    assert sorted(i for i in loader.indices() if i < N_A) != a
    assert loader.source_counts()["samples_per_epoch"] == COUNTS
    # One global list whatever the world size (rank r reads a contiguous run of it, padded as
    # DistributedSampler pads); the shard-aware order of the picks too.
    for kw in ({}, {"shuffle_order": "shards"}):
        one = global_order(roots, 1, **kw)
        for world in (2, 3, 4):
            got = global_order(roots, world, **kw)
            runs = [one[EPOCH_SIZE * r // world:EPOCH_SIZE * (r + 1) // world] for r in range(world)]
            per_rank = -(-EPOCH_SIZE // world)
            assert got == [(runs[p % world] * 2)[p // world] for p in range(per_rank * world)], (kw, world)
        parts = loader_for(roots, 3, 1, **kw).source_counts(EPOCH)
        assert parts["samples_per_epoch"] == COUNTS and sum(parts["rank_samples"]) == 14


@pytest.mark.parametrize("world,new_world", [(2, 3), (4, 1)])
def test_a_mid_epoch_state_resumes_on_another_world_size_each_remaining_sample_once(sources, world, new_world):
    roots = [sources["a"], sources["b"]]
    kw = dict(shuffle_order="shards")
    expected = global_order(roots, world, **kw)
    consumed, state = [], None
    for rank in range(world):
        loader = loader_for(roots, world, rank, **kw)
        loader.set_epoch(EPOCH)
        consumed += take(loader, iter(loader), 2)
        if rank == 0:
            state = loader.state_dict()
    start = 2 * 2 * world
    assert sorted(consumed) == sorted(expected[:start])
    assert (state["source_sizes"], state["samples_per_epoch"]) == ([N_A, N_B], COUNTS)
    assert (state["weights"], state["epoch_size"]) == ([1.0, 2.0], EPOCH_SIZE)
    delivered = []
    for rank in range(new_world):
        loader = loader_for(roots, new_world, rank, **kw)
        loader.load_state_dict(state)
        mine = take(loader, iter(loader))
        assert mine == expected[start + rank::new_world]
        delivered += mine
    assert collections.Counter(consumed + delivered) == collections.Counter(expected)
    # Weights or an epoch size giving other counts give other batches: refused, naming the key;
    # proportional weights give the same counts and resume alike.
    for other in (dict(weights=[1, 3]), dict(epoch_size=41)):
        with pytest.raises(ValueError, match="samples_per_epoch"):
            loader_for(roots, new_world, 0, **kw, **other).load_state_dict(state)
    same = loader_for(roots, new_world, 0, **dict(kw, weights=[2.5, 5.0]))
    same.load_state_dict(state)
    assert take(same, iter(same)) == expected[start::new_world]
    # The same sources with the default weights (each sample once) count otherwise.
    with pytest.raises(ValueError, match="samples_per_epoch"):
        loader_for(roots, new_world, 0, **dict(kw, weights=None, epoch_size=None)).load_state_dict(state)
    with pytest.raises(ValueError, match="dataset_size|source_sizes"):
        loader_for([sources["b"], sources["a"]], new_world, 0, **kw).load_state_dict(state)


def test_a_remote_source_is_read_one_get_per_shard_and_gives_the_local_batches(sources, capfd):
    # A over HTTP (shards), B a local ImageFolder: "auto" is the shard-aware order (a remote source).
    # The next epoch's first batches are not decoded ahead: the GETs counted are this epoch's.
    local = loader_for([sources["a"], sources["b_folder"]], shuffle_order="shards", prefetch_next_epoch=False)
    local.set_epoch(EPOCH)
    want = [(list(local.last_batch["indices"]), y.clone(), x.clone()) for x, y in local]
    with RangeHTTPServer(sources["root"]) as http:
        url = http.url + "/a_shards/train-{000000..000006}.tar"
        loader = loader_for([url, sources["b_folder"]], prefetch_next_epoch=False)
        assert loader.shuffle_order == "shards"
        capfd.readouterr()
        loader_for([url, sources["b_folder"]], shuffle_order="exact")  # only A's 13 samples are remote
        err = capfd.readouterr().err
        assert "an epoch makes about 13 requests (one per sample) over 7 shards" in err, err
        before = len(http.requests.snapshot())
        loader.set_epoch(EPOCH)
        got = [(list(loader.last_batch["indices"]), y.clone(), x.clone()) for x, y in loader]
        gets = [r for r in http.requests.snapshot()[before:] if r[0] == "GET"]
    assert len(got) == len(want)
    for (i, y, x), (j, v, u) in zip(got, want):
        assert i == j and torch.equal(y, v) and torch.equal(x, u)
    read = {i // 4 for idx, _, _ in got for i in idx if i < N_A}  # A's shards this epoch (4 per shard)
    assert sorted(r[1] for r in gets) == sorted(f"/a_shards/train-{s:06d}.tar" for s in read)
    stats = loader.stats()
    assert stats["sources"][0]["remote"]["chunks_fetched"] == len(read) and "remote" not in stats["sources"][1]
    assert stats["remote"]["chunks_fetched"] == len(read)
    assert [s["samples_per_epoch"] for s in stats["sources"]] == COUNTS


def test_one_dataset_with_epoch_size_and_refused_values(sources):
    one = gpufeed.DataLoader(str(sources["b"]), batch_size=4, image_size=8, dtype=torch.uint8, num_workers=1,
                             index_cache="off", shuffle=True, epoch_size=7)
    assert len(one) == 2 and len(one.sampler) == 7
    assert one.source_counts() == {"samples_per_epoch": [7], "rank_samples": [7]}
    assert len(set(take(one, iter(one)))) == 7
    plain = gpufeed.DataLoader(str(sources["b"]), batch_size=4, image_size=8, dtype=torch.uint8, num_workers=1,
                               index_cache="off")
    assert plain.source_counts() == {"samples_per_epoch": [N_B], "rank_samples": [N_B]}
    roots = [sources["a"], sources["b"]]
    with pytest.raises(ValueError, match="weights"):
        loader_for(roots, weights=[1, 2, 3])
    with pytest.raises(ValueError, match="weights"):
        loader_for(roots, weights=[1, -2])
    with pytest.raises(ValueError, match="epoch_size"):
        loader_for(roots, epoch_size=-1)
    with pytest.raises(TypeError, match="weights"):
        loader_for(roots, weights="12")
    with pytest.raises(TypeError, match="weights"):
        loader_for(roots, weights={0: 1, 1: 2})
    with pytest.raises(ValueError, match="epoch_size"):
        loader_for(roots, epoch_size=2**64)
    assert loader_for(roots, weights=torch.tensor([1.0, 2.0])).source_counts(0)["samples_per_epoch"] == COUNTS
    # A DistributedSampler given as sampler= supplies the epoch, rank and world size; the loader
    # reads the mixing order, and loader.sampler says so (not the DistributedSampler's order).
    dist = torch.utils.data.distributed.DistributedSampler(range(EPOCH_SIZE), num_replicas=2, rank=1, seed=5)
    mixed = gpufeed.DataLoader([str(r) for r in roots], weights=WEIGHTS, epoch_size=EPOCH_SIZE, sampler=dist,
                               batch_size=2, image_size=8, dtype=torch.uint8, num_workers=1, index_cache="off")
    assert list(mixed.sampler) == list(mixed.indices()) != list(dist)
    with pytest.raises(ValueError, match="root"):
        gpufeed.DataLoader([])
