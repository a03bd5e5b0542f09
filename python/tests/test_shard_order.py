"""gpufeed.DataLoader's shard-aware order (shuffle_order="shards", docs/DATASETS.md, "Shuffle
order") over shards packed by `gpufeed pack`: every sample once per epoch, one global order for
every world size of which each rank reads a contiguous run, a mid-epoch state_dict resumed on another world size delivering the rest once,
and `auto` choosing "shards" for remote shards (over a local HTTP server) and "exact" otherwise."""
import pathlib
import re
import subprocess

import pytest
import torch

import gpufeed
from conftest import make_image_folder, take_indices as take
from remote_servers import RangeHTTPServer

N = 27  # 3 classes x 9 images, packed 4 per shard: 7 shards of 4, 4, 4, 4, 4, 4, 3
PATTERN = "train-{000000..000006}.tar"
ORDER = dict(shuffle_order="shards", shard_window=2, shard_partitions=4)
EPOCH = 3


@pytest.fixture(scope="module")
def packed(tmp_path_factory, gpufeed_cli) -> pathlib.Path:
    root = tmp_path_factory.mktemp("shard_order")
    make_image_folder(root / "train", per_class=9, seed=21)
    subprocess.run([str(gpufeed_cli), "pack", str(root / "train"), str(root / "shards"), "--max-samples-per-shard",
                    "4", "--index-cache", "off", "--progress", "off"], check=True, capture_output=True)
    assert len(list((root / "shards").glob("*.tar"))) == 7
    return root / "shards"


def loader_for(data, world, rank, **kw):
    kw = dict(batch_size=2, image_size=8, dtype=torch.uint8, num_workers=1, prefetch_depth=2, index_cache="off",
              **{**ORDER, **kw})
    return gpufeed.DataLoader(str(data), shuffle=True, seed=7, rank=rank, world_size=world, **kw)


def rank_orders(data, world, epoch=EPOCH, iterate=False):
    """Each rank's indices of the epoch."""
    ranks = []
    for rank in range(world):
        loader = loader_for(data, world, rank)
        loader.set_epoch(epoch)
        mine = list(loader.indices())
        assert list(loader.sampler) == mine and len(loader.sampler) == len(mine)
        if iterate:
            assert take(loader, iter(loader)) == mine
        ranks.append(mine)
    return ranks


def global_order(data, world, epoch=EPOCH, iterate=False):
    """The epoch as the ranks consume it in lockstep: position p is rank p % world's p // world-th index."""
    ranks = rank_orders(data, world, epoch, iterate)
    return [ranks[p % world][p // world] for p in range(len(ranks[0]) * world)]


def test_every_sample_once_per_epoch_and_one_global_order_for_world_sizes_1_to_4(packed):
    orders = {w: rank_orders(packed, w, iterate=w in (1, 3)) for w in (1, 2, 3, 4)}
    one = orders[1][0]
    assert sorted(one) == list(range(N))
    for w, ranks in orders.items():
        # Rank r reads the run [N r // w, N (r + 1) // w) of the one global list, then (padding)
        # repeats its run's start.
        runs = [one[N * r // w:N * (r + 1) // w] for r in range(w)]
        for mine, run in zip(ranks, runs):
            assert len(mine) == -(-N // w), w
            assert mine == (run * 2)[:len(mine)], w
    # Not DistributedSampler's order, and another one each epoch.
    exact = loader_for(packed, 1, 0, shuffle_order="exact")
    exact.set_epoch(EPOCH)
    assert list(exact.indices()) != one
    assert global_order(packed, 1, EPOCH + 1) != one
    # Whole shards stay together: with 4 partitions, rank 0 of 4 reads partition 0 (6 samples),
    # from at most 3 shards (samples 4s..4s+3 are shard s).
    loader = loader_for(packed, 4, 0)
    assert loader.shuffle_order == "shards" and loader.sampler.shuffle_order == "shards"
    loader.set_epoch(EPOCH)
    assert len({i // 4 for i in loader.indices()}) <= 3


@pytest.mark.parametrize("world,new_world", [(4, 3), (2, 4)])
def test_a_mid_epoch_state_resumes_on_another_world_size_each_remaining_sample_once(packed, world, new_world):
    expected = global_order(packed, world)
    k = 1  # batches each old rank takes
    consumed, state = [], None
    for rank in range(world):
        loader = loader_for(packed, world, rank)
        loader.set_epoch(EPOCH)
        consumed += take(loader, iter(loader), k)
        if rank == 0:
            state = loader.state_dict()
    start = k * 2 * world
    assert sorted(consumed) == sorted(expected[:start])
    assert state["shuffle_order"] == "shards" and state["batches_yielded"] == k
    delivered = []
    for rank in range(new_world):
        loader = loader_for(packed, new_world, rank)
        loader.load_state_dict(state)
        mine = take(loader, iter(loader))
        assert mine == expected[start + rank::new_world]  # the rest, dealt without padding
        delivered += mine
    assert sorted(consumed + delivered) == sorted(expected)
    assert sorted(set(consumed + delivered)) == list(range(N))
    # A state of the shard-aware order does not resume in DistributedSampler's.
    with pytest.raises(ValueError, match="shuffle_order"):
        loader_for(packed, new_world, 0, shuffle_order="exact").load_state_dict(state)


def test_auto_is_shards_for_remote_shards_and_exact_for_local_data(packed, capfd):
    local = loader_for(packed, 1, 0, shuffle_order="auto")
    assert local.shuffle_order == "exact" and local.sampler.shuffle_order == "exact"
    with RangeHTTPServer(packed.parent) as http:
        url = http.url + "/shards/" + PATTERN
        remote = loader_for(url, 2, 1, shuffle_order="auto")
        assert remote.shuffle_order == "shards" and remote.sampler.shuffle_order == "shards"
        remote.set_epoch(EPOCH)
        assert take(remote, iter(remote)) == global_order(packed, 2)[1::2]  # the local shards' order
        capfd.readouterr()
        exact = loader_for(url, 1, 0, shuffle_order="exact")
        assert exact.shuffle_order == "exact"
        err = capfd.readouterr().err
        assert f"about {N} requests (one per sample) over 7 shards" in err
        assert err.count("shuffle_order exact on remote data") == 1
        assert http.url not in err
        assert "remote_shards_in_flight" not in err  # window 2 of 1-unit shards fits 16 in flight
        # A window needing more units than the reader holds at once: said at open, with the cure.
        loader_for(url, 1, 0, shard_window=3, remote_shards_in_flight=2)
        err = capfd.readouterr().err
        assert "a window of 3 shards is about 3 units of remote reads (1.0 per shard" in err
        assert "raise remote_shards_in_flight to 3" in err and err.count("remote_shards_in_flight is 2") == 1


def test_shards_on_a_folder_is_an_error_naming_the_option_and_the_dataset(packed, gpufeed_cli):
    folder = packed.parent / "train"
    with pytest.raises(ValueError, match=r"shuffle_order.*" + re.escape(str(folder))):
        loader_for(folder, 1, 0)
    for command in ("bench", "train"):  # the CLI refuses it too, before any pass
        out = subprocess.run([str(gpufeed_cli), command, "--data", str(folder), "--shuffle-order", "shards",
                              "--epochs", "1"], capture_output=True, text=True, timeout=120)
        assert out.returncode != 0 and "--shuffle-order" in out.stderr and str(folder) in out.stderr, out.stderr
    with pytest.raises(ValueError, match="shuffle_order"):
        loader_for(packed, 1, 0, shuffle_order="sharded")
