"""gpufeed.DataLoader as scripts and frameworks use a torch.utils.data.DataLoader: the attributes
they read off it (dataset, sampler, batch_size, ...), the iterator protocol, prefetch depths in a
plain `for` loop."""
import itertools
import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import gpufeed


def indices_of(loader):
    out = []
    for _ in loader:
        out.append(list(loader.last_batch["indices"]))
    return out


# ---- the attributes scripts read ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.uint8])
def test_dataset_items_equal_the_loaders_batches(folder, dtype):
    """loader.dataset[i] is sample i exactly as the loader's batches carry it, for an eval loader
    (dtype, normalisation, [3, S, S] layout) and a train loader (the current epoch's crop)."""
    for train in (False, True):
        loader = gpufeed.DataLoader(folder, batch_size=5, shuffle=True, seed=3, num_workers=2, image_size=24,
                                    train=train, dtype=dtype, memory_format=torch.channels_last)
        ds = loader.dataset
        assert isinstance(ds, torch.utils.data.Dataset) and len(ds) == 27
        assert ds.classes == ["ants", "bees", "cats"] and ds.targets == loader.targets
        loader.set_epoch(2)
        seen = 0
        for images, labels in loader:
            for k, index in enumerate(loader.last_batch["indices"]):
                image, label = ds[index]
                assert label == labels[k].item() == loader.targets[index]
                assert image.dtype == dtype
                expected = images[k] if dtype == torch.uint8 else images[k].contiguous()
                assert image.shape == ((24, 24, 3) if dtype == torch.uint8 else (3, 24, 24))
                assert torch.equal(image, expected), (train, index)
                seen += 1
        assert seen == 27
        with pytest.raises(IndexError):
            ds[27]
        assert torch.equal(ds[-1][0], ds[26][0])


def test_subset_of_the_dataset_through_a_torch_dataloader_with_workers(folder):
    """PyTorch's examples/imagenet/main.py validates the samples a DistributedSampler(drop_last=True)
    left out with Subset(val_loader.dataset, range(a, b)) and a plain DataLoader with workers:
    forked workers (after the parent iterated the loader) and spawned ones (the dataset pickles)."""
    loader = gpufeed.DataLoader(folder, batch_size=4, train=False, image_size=24, num_workers=2)
    direct = torch.cat([images for images, _ in loader])
    for context in ("fork", "spawn"):
        aux = torch.utils.data.DataLoader(torch.utils.data.Subset(loader.dataset, range(20, 27)), batch_size=3,
                                          num_workers=2, multiprocessing_context=context)
        got = list(aux)
        assert torch.equal(torch.cat([b[0] for b in got]), direct[20:27]), context
        assert torch.cat([b[1] for b in got]).tolist() == loader.targets[20:27]


# A program without a main file (python -c) whose DataLoader workers load loader.dataset's samples;
# argv: folder, start method, "notebook" to hold torch in a module the workers cannot import first.
WORKERS_OF_A_MAIN_WITHOUT_FILE = """
import sys, types
if sys.argv[3] == "notebook":
    # A notebook's cell namespace, registered as a module before torch is imported (pickle looks
    # objects it pickles by name up in the first module that holds them).
    cell = sys.modules["notebook_cell"] = types.ModuleType("notebook_cell")
    exec("import torch", cell.__dict__)
import torch, gpufeed
sampler = torch.utils.data.DistributedSampler(range(27), num_replicas=1, rank=0, shuffle=True, seed=9)
loader = gpufeed.DataLoader(sys.argv[1], batch_size=4, sampler=sampler, image_size=24, num_workers=1,
                            dtype=torch.bfloat16, memory_format=torch.channels_last, device=torch.device("cpu"))
sampler.set_epoch(2)
workers = torch.utils.data.DataLoader(loader.dataset, batch_size=None, num_workers=2,
                                      multiprocessing_context=sys.argv[2], timeout=60)
got = list(workers)
want = [loader.dataset[i] for i in range(27)]
same = [torch.equal(g[0], w[0]) and g[0].dtype == w[0].dtype and int(g[1]) == w[1] for g, w in zip(got, want)]
print(len(got), sum(same))
"""


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
@pytest.mark.parametrize("program", ["plain", "notebook"])
def test_spawned_workers_of_a_program_without_a_main_file_load_the_datasets_samples(folder, context, program):
    """torch DataLoader workers (spawn, forkserver) over loader.dataset in a `python -c` program,
    and in one whose torch is first held by a module no worker can import (a notebook's cell):
    every sample equals the parent's dataset[i] (a train crop of the sampler's seed and epoch,
    bfloat16), so what the dataset pickles unpickles in any child."""
    proc = subprocess.run([sys.executable, "-c", WORKERS_OF_A_MAIN_WITHOUT_FILE, str(folder), context, program],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["27", "27"], proc.stdout + proc.stderr[-3000:]


def test_the_dataset_pickles_plain_values_only(folder):
    """What loader.dataset pickles names no global but its own class: no torch.dtype,
    memory_format or device (each pickled by reference to a module that must import in the
    child); its copy loads the same samples."""
    import io
    import pickle

    loader = gpufeed.DataLoader(folder, batch_size=4, image_size=24, dtype=torch.float16, num_workers=1,
                                memory_format=torch.channels_last, extensions=(".jpg",), device=torch.device("cpu"))
    named = []

    class Recording(pickle.Unpickler):
        def find_class(self, module, name):
            named.append((module, name))
            return super().find_class(module, name)

    copy = Recording(io.BytesIO(pickle.dumps(loader.dataset))).load()
    assert named == [("gpufeed._loader", "_SampleDataset")]
    for i in (0, 13, 26):
        image, label = copy[i]
        assert image.dtype == torch.float16 and torch.equal(image, loader.dataset[i][0]) and label == loader.targets[i]
    named.clear()  # a copy pickles the same way (a worker's dataset handed on)
    again = Recording(io.BytesIO(pickle.dumps(copy))).load()
    assert named == [("gpufeed._loader", "_SampleDataset")] and torch.equal(again[5][0], loader.dataset[5][0])


def test_sampler_and_loader_attributes(folder):
    loader = gpufeed.DataLoader(folder, batch_size=4, shuffle=True, seed=5, num_workers=2, image_size=16,
                                rank=1, world_size=2, dtype=torch.uint8)
    reference = torch.utils.data.DistributedSampler(range(27), num_replicas=2, rank=1, shuffle=True, seed=5)
    sampler = loader.sampler
    assert len(sampler) == len(reference) == 14
    for epoch in (0, 3):
        loader.set_epoch(epoch)
        reference.set_epoch(epoch)
        assert list(sampler) == list(reference) == [i for b in indices_of(loader) for i in b]
    sampler.set_epoch(7)  # reaches the loader
    reference.set_epoch(7)
    assert list(sampler) == list(reference) == loader.indices(7)
    assert [i for b in indices_of(loader) for i in b] == list(reference)
    # After the epoch the sampler describes the next one the loader runs (it counts epochs itself).
    reference.set_epoch(8)
    assert list(loader.batch_sampler) == [list(reference)[k:k + 4] for k in range(0, 14, 4)]
    assert (loader.batch_size, loader.drop_last, loader.num_workers, loader.pin_memory, loader.collate_fn) == \
        (4, False, 2, False, None)
    default = gpufeed.DataLoader(folder)
    assert default.num_workers == default.stats()["threads"] >= 1


@pytest.mark.parametrize("world_size,drop_last", [(2, True), (2, False), (4, True)])
def test_a_torch_distributed_sampler_is_followed(folder, world_size, drop_last):
    """sampler=DistributedSampler(...): its num_replicas, rank, shuffle, seed, drop_last and epoch
    (set_epoch on the sampler, as main.py calls it) give the loader's order."""
    for rank in range(world_size):
        sampler = torch.utils.data.DistributedSampler(range(27), num_replicas=world_size, rank=rank,
                                                      shuffle=False, drop_last=drop_last)
        loader = gpufeed.DataLoader(folder, batch_size=4, sampler=sampler, train=False, image_size=16)
        assert loader.sampler is sampler and (loader.rank, loader.world_size) == (rank, world_size)
        assert [i for b in indices_of(loader) for i in b] == list(sampler)
    shuffled = torch.utils.data.DistributedSampler(range(27), num_replicas=2, rank=0, shuffle=True, seed=9)
    loader = gpufeed.DataLoader(folder, batch_size=4, sampler=shuffled, image_size=16)
    for epoch in (0, 4, 4):
        shuffled.set_epoch(epoch)
        assert [i for b in indices_of(loader) for i in b] == list(shuffled)
    with pytest.raises(ValueError, match="mutually exclusive with shuffle"):
        gpufeed.DataLoader(folder, sampler=shuffled, shuffle=True)
    with pytest.raises(ValueError, match="rank=1 contradicts"):
        gpufeed.DataLoader(folder, sampler=shuffled, rank=1)
    with pytest.raises(ValueError, match="DistributedSampler"):
        gpufeed.DataLoader(folder, sampler=torch.utils.data.SequentialSampler(range(27)))
    with pytest.raises(ValueError, match="another dataset"):
        gpufeed.DataLoader(folder, sampler=torch.utils.data.DistributedSampler(range(30), num_replicas=2, rank=0))


# ---- the iterator protocol ------------------------------------------------------------------------


def test_an_exhausted_iterator_keeps_raising_stop_iteration(folder):
    loader = gpufeed.DataLoader(folder, batch_size=10, image_size=16, dtype=torch.uint8)
    it = iter(loader)
    got = []
    while (batch := next(it, None)) is not None:
        got.append(batch[1].tolist())
    assert [len(b) for b in got] == [10, 10, 7]
    for _ in range(3):
        with pytest.raises(StopIteration):
            next(it)
    pairs = [(b is None, k) for b, k in itertools.zip_longest(iter(loader), range(5))]
    assert pairs == [(False, 0), (False, 1), (False, 2), (True, 3), (True, 4)]
    # Still exhausted after a newer epoch started; a running one that was superseded raises.
    running = iter(loader)
    next(running)
    newer = iter(loader)
    with pytest.raises(StopIteration):
        next(it)
    with pytest.raises(RuntimeError, match="superseded"):
        next(running)
    assert len(list(newer)) == 3
    loader.close()
    with pytest.raises(StopIteration):
        next(newer)
    with pytest.raises(RuntimeError, match="closed"):
        iter(loader)


def test_breaking_out_of_an_epoch_starts_the_next_one(folder):
    loader = gpufeed.DataLoader(folder, batch_size=4, shuffle=True, seed=1, image_size=16, dtype=torch.uint8)
    for _ in loader:
        break
    assert [i for b in indices_of(loader) for i in b] == loader.indices(1)


# ---- prefetch_depth ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,depth", [(torch.uint8, 2), (torch.uint8, 3), (torch.float32, 1),
                                         (torch.float32, 2), (torch.bfloat16, 1)])
def test_a_for_loop_holding_its_batch_runs_at_every_accepted_depth(folder, dtype, depth):
    """`for images, labels in loader` keeps the previous batch alive while it asks for the next."""
    loader = gpufeed.DataLoader(folder, batch_size=4, image_size=16, dtype=dtype, prefetch_depth=depth)
    for _ in range(2):
        count = 0
        for images, labels in loader:
            count += images.shape[0]
        assert count == 27


def test_prefetch_depth_1_with_zero_copy_batches_is_refused_saying_why(folder):
    with pytest.raises(ValueError, match="prefetch_depth=1.*views of the loader's slots.*prefetch_depth >= 2"):
        gpufeed.DataLoader(folder, dtype=torch.uint8, prefetch_depth=1)


# ---- a script shaped like PyTorch's examples/imagenet/main.py, under torchrun ----------------------


def test_imagenet_main_shaped_script_counts_every_val_sample_once(tmp_path, folder):
    """torchrun --nproc-per-node 2 (Gloo, CPU): training with set_epoch, distributed validation
    over sampler=DistributedSampler(shuffle=False, drop_last=True), then main.py's auxiliary loader
    over Subset(val_loader.dataset, ...): every val sample counted exactly once per epoch, and the
    training epochs are DistributedSampler's shards."""
    script = pathlib.Path(__file__).with_name("imagenet_main_worker.py")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), str(folder), str(folder), str(tmp_path)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for epoch in range(2):
        runs = [r["epochs"][epoch] for r in ranks]
        main = sorted(runs[0]["val_main"] + runs[1]["val_main"])
        assert main == list(range(26))  # 27 // 2 * 2: disjoint strided shards, nothing padded
        for r in runs:
            assert r["sampler_len"] == 13 and r["val_size"] == 27
            assert r["val_aux"] == [26]
            assert r["top1_count"] == 27  # all_reduce(13 + 13) + the aux sample
        for rank, r in enumerate(runs):
            sampler = torch.utils.data.DistributedSampler(range(27), num_replicas=2, rank=rank, shuffle=True)
            sampler.set_epoch(epoch)
            assert r["train"] == list(sampler)


# ---- what a field trial broke ----------------------------------------------------------------------


def test_bad_keyword_values_raise_naming_the_keyword(folder):
    cases = [(dict(batch_size=2.5), TypeError, "batch_size"), (dict(batch_size=0), ValueError, "batch_size"),
             (dict(seed=2**64), ValueError, "seed"), (dict(seed=1.5), TypeError, "seed"),
             (dict(scale=(1.0, 0.08)), ValueError, "scale"), (dict(scale=(float("nan"), 1)), ValueError, "scale"),
             (dict(scale=(0.1, 0.5, 1)), ValueError, "scale"), (dict(ratio=(0, 0)), ValueError, "ratio"),
             (dict(ratio=(1, float("inf"))), ValueError, "ratio"), (dict(resize_size=0), ValueError, "resize_size"),
             (dict(train=False, image_size=32, resize_size=16), ValueError, "resize_size=.*16"),
             (dict(num_workers=-1), ValueError, "num_workers"), (dict(rank="0", world_size=2), TypeError, "rank")]
    for kwargs, error, text in cases:
        with pytest.raises(error, match=text):
            gpufeed.DataLoader(folder, **kwargs)
    with pytest.raises(TypeError, match="root"):
        gpufeed.DataLoader(3)
    loader = gpufeed.DataLoader(os.fsencode(folder), image_size=16)  # a bytes path, as os.fsencode gives
    assert len(loader.samples) == 27
    for bad in ("1", 1.9):
        with pytest.raises(TypeError, match="epoch"):
            loader.set_epoch(bad)


def test_a_negative_seed_orders_as_torch_does(folder):
    """torch's DistributedSampler takes seed=-1 (manual_seed wraps it mod 2**64)."""
    sampler = torch.utils.data.DistributedSampler(range(27), num_replicas=1, rank=0, shuffle=True, seed=-1)
    sampler.set_epoch(2)
    loader = gpufeed.DataLoader(folder, batch_size=4, shuffle=True, seed=-1, image_size=16)
    assert loader.indices(2) == list(sampler)
    with_sampler = gpufeed.DataLoader(folder, batch_size=4, sampler=sampler, image_size=16)
    assert [i for b in indices_of(with_sampler) for i in b] == list(sampler)


def test_bad_states_raise_clearly_and_another_ranks_state_resumes_this_rank(folder):
    kw = dict(batch_size=4, shuffle=True, seed=2, image_size=8, dtype=torch.uint8, world_size=2)
    rank0, rank1 = gpufeed.DataLoader(folder, rank=0, **kw), gpufeed.DataLoader(folder, rank=1, **kw)
    it = iter(rank0)
    next(it), next(it)
    state = rank0.state_dict()
    # Lightning under DDP saves rank 0's state and loads it on every rank.
    rank1.load_state_dict(state)
    assert [list(rank1.last_batch["indices"]) for _ in rank1] == [rank1.indices(0)[k:k + 4] for k in (8, 12)]
    for bad, error, text in [(None, TypeError, "dict"), ([], TypeError, "dict"),
                             ({"version": 2, "epoch": 0}, ValueError, "lacks batches_yielded"),
                             (dict(state, batches_yielded=-5), ValueError, "batches_yielded"),
                             (dict(state, batches_yielded=99), ValueError, "batches_yielded"),
                             (dict(state, batches_yielded=3.7), TypeError, "batches_yielded"),
                             (dict(state, finished="no"), TypeError, "finished"),
                             (dict(state, world_size=3), ValueError, "world_size"),
                             ({"version": 9}, ValueError, "not a gpufeed.DataLoader state_dict")]:
        with pytest.raises(error, match=text):
            rank1.load_state_dict(bad)


def test_the_sampler_view_follows_set_epoch_at_once(folder):
    """As DistributedSampler: after set_epoch (on the loader or on loader.sampler), even in the
    middle of an epoch, the sampler and batch_sampler show that epoch."""
    loader = gpufeed.DataLoader(folder, batch_size=4, shuffle=True, seed=5, image_size=16, dtype=torch.uint8)
    it = iter(loader)
    next(it)
    assert loader.sampler.epoch == 0
    loader.sampler.set_epoch(3)
    assert loader.sampler.epoch == 3 and list(loader.sampler) == loader.indices(3)
    loader.set_epoch(5)
    assert loader.sampler.epoch == 5 and list(loader.batch_sampler)[0] == loader.indices(5)[:4]
    next(it)  # the running epoch is still 0's
    assert loader.last_batch["indices"] == loader.indices(0)[4:8]
    assert [list(loader.last_batch["indices"]) for _ in loader][0] == loader.indices(5)[:4]


def test_folders_list_what_torchvisions_image_folder_lists(tmp_path, folder):
    """A GIF beside the JPEGs: the default listing is torchvision's ImageFolder's (IMG_EXTENSIONS),
    so a DistributedSampler over the script's ImageFolder fits; gpufeed.IMAGE_EXTENSIONS adds GIF."""
    import shutil
    from PIL import Image
    import torchvision
    root = tmp_path / "train"
    shutil.copytree(folder, root)
    Image.new("RGB", (20, 30), (200, 10, 10)).save(root / "bees" / "bees_004b.gif")
    (root / "cats" / "notes.txt").write_text("not an image")
    reference = torchvision.datasets.ImageFolder(str(root))
    loader = gpufeed.DataLoader(root, batch_size=4, train=False, image_size=16, index_cache="off")
    assert loader.samples == [(p, y) for p, y in reference.samples] and len(loader.dataset) == 27
    sampler = torch.utils.data.DistributedSampler(reference, num_replicas=2, rank=1, shuffle=False)
    assert [i for b in indices_of(gpufeed.DataLoader(root, sampler=sampler, index_cache="off")) for i in b] == \
        list(sampler)
    with_gif = gpufeed.DataLoader(root, extensions=gpufeed.IMAGE_EXTENSIONS, index_cache="off")
    assert len(with_gif.samples) == 28 and ".gif" in gpufeed.IMAGE_EXTENSIONS
    assert [p for p, _ in with_gif.samples if p.endswith(".gif")] == [str(root / "bees" / "bees_004b.gif")]
    with pytest.raises(ValueError, match="extensions"):
        gpufeed.DataLoader(root, extensions=["jpg"])


def test_real_hymenoptera_lists_as_torchvision_does():
    """The shared real ImageFolder (a GIF, a space in a name, a .jpeg): the same samples as
    torchvision's ImageFolder, in the same order."""
    import torchvision
    from conftest import shared_dir
    root = shared_dir() / "data" / "hymenoptera" / "train"
    if not root.is_dir():
        pytest.skip(f"{root} is absent (the shared real data sits beside the checkout)")
    reference = torchvision.datasets.ImageFolder(str(root))
    assert gpufeed.DataLoader(root, index_cache="off").samples == [tuple(s) for s in reference.samples]
