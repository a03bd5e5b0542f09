"""gpufeed.DataLoader: batches equal to the C++ loader's, transforms against torchvision, order
against DistributedSampler, resume, errors, lifetimes."""
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

import gpufeed
from conftest import ROOT, shared_dir


def epoch_batches(loader, clone=True):
    out = []
    for images, labels in loader:
        out.append((images.clone() if clone else images, labels.clone(), list(loader.last_batch["indices"])))
    return out


# ---- the same bytes as the C++ loader -----------------------------------------------------------


@pytest.mark.parametrize("train", [True, False])
def test_batches_equal_cli_loader_byte_for_byte(tmp_path, folder, gpufeed_cli, train):
    """`gpufeed bench --dump` writes the C++ Loader's first-pass samples (sequential order,
    epoch 0); the Python iterator over the same files and options yields the same bytes."""
    dump = tmp_path / "dump.bin"
    subprocess.run([str(gpufeed_cli), "bench", "--data", str(folder), "--num-workers", "2", "--batch-size", "5",
                    "--image-size", "48", "--transform", "train" if train else "eval", "--epochs", "1",
                    "--dump", str(dump)], check=True, capture_output=True)
    meta = json.loads((tmp_path / "dump.bin.json").read_text())
    cpp = np.fromfile(dump, np.uint8).reshape(-1, 48, 48, 3)
    loader = gpufeed.DataLoader(folder, batch_size=5, num_workers=3, train=train, image_size=48, dtype=torch.uint8)
    loader.set_epoch(0)
    batches = epoch_batches(loader)
    py = torch.cat([b[0] for b in batches]).numpy()
    assert py.shape == cpp.shape == (27, 48, 48, 3)
    assert np.array_equal(py, cpp)
    assert [s["index"] for s in meta["samples"]] == [i for b in batches for i in b[2]] == list(range(27))
    assert torch.cat([b[1] for b in batches]).tolist() == [s["label"] for s in meta["samples"]]


@pytest.mark.parametrize("flags,kwargs", [
    (["--auto-augment", "ta_wide", "--random-erase", "0.5"], dict(auto_augment="ta_wide", random_erase=0.5)),
    (["--auto-augment", "ra", "--ra-magnitude", "15", "--ra-num-ops", "3", "--color-jitter", "0.3,0.2,0.4,0.1",
      "--random-erase", "1", "--random-erase-value", "random"],
     dict(auto_augment="ra", ra_magnitude=15, ra_num_ops=3, color_jitter=(0.3, 0.2, 0.4, 0.1), random_erase=1.0,
          random_erase_value="random")),
    (["--auto-augment", "imagenet", "--augment-interpolation", "bilinear", "--color-jitter", "0.4"],
     dict(auto_augment="imagenet", augment_interpolation="bilinear", color_jitter=0.4)),
])
def test_augmented_batches_equal_cli_loader_byte_for_byte(tmp_path, folder, gpufeed_cli, flags, kwargs):
    """The augmentation keywords mean what the CLI's flags of the same names mean: the same bytes
    as `gpufeed bench --dump` with them, and not the plain train transform's."""
    dump = tmp_path / "dump.bin"
    subprocess.run([str(gpufeed_cli), "bench", "--data", str(folder), "--num-workers", "2", "--batch-size", "5",
                    "--image-size", "48", "--transform", "train", "--epochs", "1", "--dump", str(dump)] + flags,
                   check=True, capture_output=True)
    cpp = np.fromfile(dump, np.uint8).reshape(-1, 48, 48, 3)
    loader = gpufeed.DataLoader(folder, batch_size=5, num_workers=3, image_size=48, dtype=torch.uint8, **kwargs)
    loader.set_epoch(0)
    py = torch.cat([b[0] for b in epoch_batches(loader)]).numpy()
    assert np.array_equal(py, cpp)
    plain = gpufeed.DataLoader(folder, batch_size=5, num_workers=3, image_size=48, dtype=torch.uint8)
    plain.set_epoch(0)
    assert not np.array_equal(torch.cat([b[0] for b in epoch_batches(plain)]).numpy(), cpp)


def test_set_image_size_gives_the_next_epochs_the_loader_of_that_size(folder):
    """Progressive resizing: after set_image_size(48) the next epoch equals, byte for byte, the
    same epoch of a loader built at 48 (the crop draws do not depend on the size); the epoch
    before it keeps 32. Above max_image_size is a ValueError naming both sizes."""
    common = dict(batch_size=5, num_workers=2, shuffle=True, seed=7, dtype=torch.uint8, auto_augment="ta_wide")
    ramp = gpufeed.DataLoader(folder, image_size=32, max_image_size=48, **common)
    first = epoch_batches(ramp)
    assert first[0][0].shape == (5, 32, 32, 3)
    ramp.set_image_size(48)
    second = torch.cat([b[0] for b in epoch_batches(ramp)])
    fixed = gpufeed.DataLoader(folder, image_size=48, **common)
    fixed.set_epoch(1)
    assert second.shape == (27, 48, 48, 3)
    assert torch.equal(second, torch.cat([b[0] for b in epoch_batches(fixed)]))
    with pytest.raises(ValueError, match="64.*48|48.*64"):
        ramp.set_image_size(64)
    with pytest.raises(ValueError):
        gpufeed.DataLoader(folder, train=False, image_size=32).set_image_size(40)


def test_bad_augmentation_options_raise_naming_them(folder, gpufeed_cli):
    with pytest.raises(ValueError, match="auto_augment"):
        gpufeed.DataLoader(folder, auto_augment="augmix")
    with pytest.raises(ValueError, match="interpolation.*bicubic"):
        gpufeed.DataLoader(folder, auto_augment="ta_wide", augment_interpolation="bicubic")
    with pytest.raises(ValueError, match="ra_magnitude"):
        gpufeed.DataLoader(folder, auto_augment="ra", ra_magnitude=31)
    with pytest.raises(ValueError, match="color_jitter"):
        gpufeed.DataLoader(folder, color_jitter=(0.1, 0.2))
    with pytest.raises(ValueError, match="hue"):
        gpufeed.DataLoader(folder, color_jitter=(0, 0, 0, 0.7))
    with pytest.raises(ValueError, match="random_erase"):
        gpufeed.DataLoader(folder, random_erase=1.5)
    out = subprocess.run([str(gpufeed_cli), "bench", "--data", str(folder), "--auto-augment", "ra",
                          "--ra-magnitude", "40"], capture_output=True, text=True)
    assert out.returncode != 0 and "--ra-magnitude" in out.stderr
    out = subprocess.run([str(gpufeed_cli), "bench", "--data", str(folder), "--color-jitter", "0.1,x"],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "--color-jitter" in out.stderr


def test_shuffled_batches_equal_load_sample(folder):
    """Shuffled epochs: every sample equals loader::load_sample (the workers' own function) for
    its (index, epoch), labels are the dataset's, and the order is DistributedSampler's."""
    loader = gpufeed.DataLoader(folder, batch_size=4, shuffle=True, seed=7, num_workers=2, image_size=32,
                                dtype=torch.uint8)
    for epoch in (3, 4):
        loader.set_epoch(epoch)
        batches = epoch_batches(loader)
        order = [i for b in batches for i in b[2]]
        sampler = torch.utils.data.DistributedSampler(range(27), num_replicas=1, rank=0, shuffle=True, seed=7)
        sampler.set_epoch(epoch)
        assert order == list(sampler) == loader.indices(epoch)
        assert [len(b[2]) for b in batches] == [4] * 6 + [3]
        for images, labels, indices in batches:
            for k, index in enumerate(indices):
                assert torch.equal(images[k], loader.load_sample(index, epoch))
                assert labels[k].item() == loader.samples[index][1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_normalised_batches(folder, dtype, memory_format):
    """float batches are torchvision's ToTensor + Normalize of the uint8 batch: [N, 3, S, S]."""
    kw = dict(batch_size=8, shuffle=True, seed=1, num_workers=2, image_size=40, train=False)
    raw = epoch_batches(gpufeed.DataLoader(folder, dtype=torch.uint8, **kw))
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
    norm = epoch_batches(gpufeed.DataLoader(folder, dtype=dtype, memory_format=memory_format, mean=mean,
                                            std=std, **kw))
    for (u8, l0, i0), (x, l1, i1) in zip(raw, norm, strict=True):
        assert x.dtype == dtype and x.shape == (u8.shape[0], 3, 40, 40)
        assert x.is_contiguous(memory_format=memory_format)
        ref = (u8.permute(0, 3, 1, 2).float() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
        torch.testing.assert_close(x.float(), ref.to(dtype).float(), rtol=0, atol=1e-5 if dtype == torch.float32 else 1e-2)
        assert torch.equal(l0, l1) and i0 == i1


def eval_reference_files():
    hym = shared_dir() / "data" / "hymenoptera" / "val"
    return hym


def test_eval_matches_torchvision(folder):
    """Eval batches against torchvision's Resize + CenterCrop on the same files: mean absolute
    difference <= 3/255 per image, the bar tests/test_resize.cpp holds real files to. Runs on
    ../shared's hymenoptera val set when present (real photos), else on the generated folder."""
    from PIL import Image
    import torchvision.transforms as T

    root = eval_reference_files()
    if not root.is_dir():
        print(f"({root} is absent: comparing on the generated folder)")
        root = folder
    # 224 from Resize(256), the configuration (and DCT scales) test_resize.cpp measures.
    loader = gpufeed.DataLoader(root, batch_size=16, train=False, image_size=224, num_workers=2, dtype=torch.uint8)
    tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor()])
    worst = 0.0
    count = 0
    for images, _ in loader:
        for k, index in enumerate(loader.last_batch["indices"]):
            with open(loader.samples[index][0], "rb") as f:
                ref = tf(Image.open(f).convert("RGB")).permute(1, 2, 0)
            diff = (images[k].int() - ref.int()).abs().float().mean().item()
            worst = max(worst, diff)
            count += 1
    assert count == len(loader.samples)
    assert worst <= 3.0, worst


# ---- distributed ---------------------------------------------------------------------------------


def test_torchrun_two_ranks_get_distributed_sampler_indices(tmp_path, folder):
    """2 processes under torchrun with a Gloo process group: each rank iterates exactly the
    indices torch's DistributedSampler gives it (rank/world_size taken from the process group),
    for two epochs, with the dataset's labels."""
    script = ROOT / "python" / "tests" / "dist_worker.py"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script), str(folder), str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got["rank"] == rank and got["world_size"] == 2
        for epoch in ("1", "2"):
            sampler = torch.utils.data.DistributedSampler(range(27), num_replicas=2, rank=rank, shuffle=True, seed=5)
            sampler.set_epoch(int(epoch))
            expected = list(sampler)
            assert got["indices"][epoch] == expected
            assert len(expected) == 14  # 27 padded to 28
            assert got["labels"][epoch] == [got["targets"][i] for i in expected]


def test_rank_world_size_from_torchrun_environment(folder, monkeypatch):
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    loader = gpufeed.DataLoader(folder, batch_size=4, shuffle=True)
    assert (loader.rank, loader.world_size) == (2, 3)
    assert len(loader) == 3  # ceil(27 / 3) = 9 samples
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    assert (gpufeed.DataLoader(folder).rank, gpufeed.DataLoader(folder).world_size) == (0, 1)


# ---- resume ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stop_after", [0, 3, 7])
def test_state_dict_resume_equals_uninterrupted_run(folder, stop_after):
    """StatefulDataLoader semantics: a state_dict taken after k batches, loaded into a fresh
    loader, yields exactly the remaining batches of the epoch, then the same next epoch."""
    kw = dict(batch_size=4, shuffle=True, seed=3, num_workers=2, image_size=32, dtype=torch.uint8)
    full = gpufeed.DataLoader(folder, **kw)
    reference = epoch_batches(full) + epoch_batches(full)  # epochs 0 and 1 (auto-advancing)

    first = gpufeed.DataLoader(folder, **kw)
    it = iter(first)
    for _ in range(stop_after):
        next(it)
    state = first.state_dict()
    assert json.loads(json.dumps(state)) == state  # plain Python values
    del it, first

    resumed = gpufeed.DataLoader(folder, **kw)
    resumed.load_state_dict(state)
    rest = epoch_batches(resumed) + epoch_batches(resumed)
    expected = reference[stop_after:] if stop_after else reference
    assert len(rest) == len(expected)
    for (a, la, ia), (b, lb, ib) in zip(rest, expected):
        assert ia == ib and torch.equal(la, lb) and torch.equal(a, b)


def test_state_dict_after_a_finished_epoch_starts_the_next(folder):
    kw = dict(batch_size=8, shuffle=True, seed=3, image_size=32, dtype=torch.uint8)
    a = gpufeed.DataLoader(folder, **kw)
    epoch_batches(a)
    state = a.state_dict()
    expected = epoch_batches(a)
    b = gpufeed.DataLoader(folder, **kw)
    b.load_state_dict(state)
    got = epoch_batches(b)
    assert [g[2] for g in got] == [e[2] for e in expected]
    c = gpufeed.DataLoader(folder, **dict(kw, seed=4))
    with pytest.raises(ValueError, match="seed"):
        c.load_state_dict(state)


# ---- bad files -----------------------------------------------------------------------------------


def test_bad_file_raises_decode_error_naming_it(bad_folder):
    loader = gpufeed.DataLoader(bad_folder, batch_size=4, num_workers=2, image_size=32)
    bad = str(bad_folder / "bees" / "bees_0005_bad.jpg")
    position = [p for p, _ in loader.samples].index(bad)
    seen = 0
    with pytest.raises(gpufeed.DecodeError) as info:
        for _ in loader:
            seen += 1
    err = info.value
    assert isinstance(err, RuntimeError) and isinstance(err, OSError)
    assert err.path == bad and bad in str(err)
    assert err.kind in ("truncated", "corrupt") and err.reason
    assert seen == position // 4  # the batches before the bad one came through
    assert gpufeed.DecodeError.__mro__[1:3] == (RuntimeError, OSError)


def test_iteration_goes_on_after_a_decode_error(bad_folder):
    loader = gpufeed.DataLoader(bad_folder, batch_size=4, image_size=32, dtype=torch.uint8)
    it = iter(loader)
    got = []
    while True:
        try:
            next(it)
            got.append(loader.last_batch["batch_index"])
        except gpufeed.DecodeError:
            got.append("error")
        except StopIteration:
            break
    bad = [p for p, _ in loader.samples].index(str(bad_folder / "bees" / "bees_0005_bad.jpg"))
    expected = list(range(7))
    expected[bad // 4] = "error"
    assert got == expected


def test_bad_file_is_skipped_and_accounted(bad_folder):
    # prefetch_next_epoch=False: stats() counts every decode, the next epoch's planned ahead included
    loader = gpufeed.DataLoader(bad_folder, batch_size=4, num_workers=2, image_size=32, on_error="skip",
                                dtype=torch.uint8, prefetch_next_epoch=False)
    bad = str(bad_folder / "bees" / "bees_0005_bad.jpg")
    batches = epoch_batches(loader)
    assert sum(len(b[2]) for b in batches) == 28 and len(batches) == 7
    summary = loader.epoch_summary()
    assert summary["skipped"] == 1 and summary["complete"]
    (skip,) = summary["skips"]
    assert skip["path"] == bad and skip["kind"] in ("truncated", "corrupt")
    bad_index = [p for p, _ in loader.samples].index(bad)
    assert skip["index"] == bad_index and skip["replaced_by"] == bad_index + 1
    images = torch.cat([b[0] for b in batches])
    assert torch.equal(images[bad_index], loader.load_sample(bad_index + 1, 0))
    assert loader.stats()["skipped"] == 1

    strict = gpufeed.DataLoader(bad_folder, batch_size=4, image_size=32, on_error="skip", max_skips=0)
    with pytest.raises(gpufeed.SkipLimitExceeded) as info:
        epoch_batches(strict)
    assert info.value.max_skips == 0 and info.value.summary["skipped"] == 1


def test_decode_image(tmp_path, folder):
    from PIL import Image

    png = tmp_path / "x.png"
    Image.open(folder / "ants" / "ants_000.jpg").save(png)
    img = gpufeed.decode_image(png)
    ref = torch.from_numpy(np.asarray(Image.open(png).convert("RGB")).copy())
    assert img.dtype == torch.uint8 and torch.equal(img, ref)
    jpg = folder / "ants" / "ants_001.jpg"
    from_bytes = gpufeed.decode_image(jpg.read_bytes())
    assert torch.equal(from_bytes, gpufeed.decode_image(str(jpg)))
    pil = torch.from_numpy(np.asarray(Image.open(jpg).convert("RGB")).copy())
    assert (from_bytes.int() - pil.int()).abs().max().item() <= 1  # both libjpeg-turbo, islow IDCT
    with pytest.raises(gpufeed.DecodeError) as info:
        gpufeed.decode_image(b"GIF89a\x01")
    assert info.value.path == "<bytes>" and info.value.kind in ("truncated", "corrupt")
    with pytest.raises(gpufeed.DecodeError, match="io"):
        gpufeed.decode_image(tmp_path / "missing.jpg")


# ---- lifetimes -----------------------------------------------------------------------------------


def test_batch_outlives_its_loader_and_holds_its_slot(folder):
    loader = gpufeed.DataLoader(folder, batch_size=4, num_workers=2, image_size=32, dtype=torch.uint8,
                                prefetch_depth=2)
    it = iter(loader)
    images, labels = next(it)
    expected = [loader.load_sample(i, 0) for i in loader.last_batch["indices"]]
    assert loader.stats()["slots"]["held"] == 1
    copy = images.clone()
    # The rest of the epoch cycles through the other slot only: ours is not reused while held.
    # (A for loop's variables hold their batch while the next one is asked for: release them.)
    for other, other_labels in it:
        assert other.data_ptr() != images.data_ptr()
        del other, other_labels
    assert torch.equal(images, copy)
    view = images[1:]
    del images
    assert loader.stats()["slots"]["held"] == 1  # the view (and labels) still hold the slot
    del labels
    loader.close()
    del loader, it
    gc.collect()
    assert torch.equal(view, copy[1:])
    assert all(torch.equal(view[k - 1], expected[k]) for k in range(1, 4))


def test_slot_returns_when_the_last_tensor_is_freed(folder):
    loader = gpufeed.DataLoader(folder, batch_size=4, image_size=32, dtype=torch.uint8, prefetch_depth=2)
    it = iter(loader)
    images, labels = next(it)
    assert loader.stats()["slots"]["held"] == 1
    del images
    assert loader.stats()["slots"]["held"] == 1
    del labels
    assert loader.stats()["slots"]["held"] == 0
    # Holding every slot is an error, not a hang.
    held = [next(it), next(it)]
    with pytest.raises(RuntimeError, match="slots are held"):
        next(it)
    del held


def test_keyboard_interrupt_while_waiting(big_folder):
    """Ctrl-C while the loader decodes a slow batch raises KeyboardInterrupt before that batch
    is done (the wait is sliced), and the batch is still delivered afterwards."""
    # 800 px: every 1200x1000 file decodes at full scale (~10 ms each on one thread), so the batch
    # takes ~0.5 s and the interrupt at 50 ms lands well inside it on any machine (at 224 px, DCT
    # scaling made the batch about as fast as the timer on a fast CPU).
    loader = gpufeed.DataLoader(big_folder, batch_size=48, num_workers=1, image_size=800, train=False,
                                dtype=torch.uint8, prefetch_depth=2)
    it = iter(loader)
    timer = threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        next(it)
    timer.join()
    assert loader.stats()["samples"] < 48, loader.stats()["samples"]  # interrupted mid-batch, not after it
    images, labels = next(it)
    assert images.shape[0] == 48 and loader.last_batch["batch_index"] == 0


def test_ctrl_c_after_a_batch_left_the_loader_keeps_it_for_the_next_call(folder):
    """A real SIGINT that lands after the C++ loader handed a batch out, while the CPU float
    conversion runs, raises KeyboardInterrupt, and the next next() returns that batch: the
    iterator yields exactly the uninterrupted run's batches (indices and pixels)."""
    kw = dict(batch_size=4, image_size=24, num_workers=2, shuffle=True, seed=3)
    reference = gpufeed.DataLoader(folder, **kw)
    expected = [(list(reference.last_batch["indices"]), x.clone()) for x, _ in reference]
    loader = gpufeed.DataLoader(folder, **kw)
    convert, calls = loader._convert, []

    def convert_interrupted_once(images):
        calls.append(len(calls))
        if len(calls) == 3:  # the third batch's conversion: Ctrl-C arrives now
            os.kill(os.getpid(), signal.SIGINT)
        return convert(images)

    loader._convert = convert_interrupted_once
    it = iter(loader)
    got = []
    for _ in range(2):
        images, _ = next(it)
        got.append((list(loader.last_batch["indices"]), images))
    with pytest.raises(KeyboardInterrupt):
        next(it)
    assert loader.state_dict()["batches_yielded"] == 2
    got += [(list(loader.last_batch["indices"]), x) for x, _ in it]
    assert [i for i, _ in got] == [i for i, _ in expected]
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(got, expected))


def test_delete_mid_epoch(big_folder):
    """Deleting a loader mid-epoch cancels its pending work; batches already taken stay valid."""
    loader = gpufeed.DataLoader(big_folder, batch_size=8, num_workers=2, image_size=64, dtype=torch.uint8,
                                prefetch_depth=4)
    it = iter(loader)
    images, _ = next(it)
    expected = loader.load_sample(loader.last_batch["indices"][0], 0)
    del loader, it
    gc.collect()
    assert torch.equal(images[0], expected)


def test_a_loader_nobody_refers_to_is_freed_at_once_without_the_garbage_collector(folder):
    """A loader mid-epoch, with a state_dict() taken, a state loaded and its sampler and dataset
    views used, is freed when its last reference (an iterator's included) goes, with the garbage
    collector off: nothing it owns (its epoch state) refers back to it."""
    import weakref

    gc.collect()
    gc.disable()
    try:
        loader = gpufeed.DataLoader(folder, batch_size=4, image_size=16, num_workers=1, shuffle=True)
        freed = weakref.ref(loader)
        state = loader.state_dict()
        it = iter(loader)
        next(it)
        loader.load_state_dict(state)
        assert len(loader.sampler) == 27 and len(loader.dataset) == 27 and loader.state_dict()["epoch"] == 0
        del loader
        assert freed() is not None  # the iterator holds it
        del it
        assert freed() is None
    finally:
        gc.enable()


def test_python_dev_mode_is_clean(folder, bad_folder):
    """The whole API under `python -X dev -W error`: no warning, no leak report, exit 0."""
    code = f"""
import gc, torch, gpufeed
for dtype in (torch.uint8, torch.float32):
    loader = gpufeed.DataLoader({str(folder)!r}, batch_size=4, shuffle=True, image_size=32, dtype=dtype)
    for x, y in loader:
        pass
    it = iter(loader); keep = next(it); del loader, it
try:
    list(gpufeed.DataLoader({str(bad_folder)!r}, batch_size=4, image_size=32))
except gpufeed.DecodeError as e:
    assert 'bad' in e.path
gpufeed.decode_image({str(folder / 'ants' / 'ants_000.jpg')!r})
gc.collect()
print('ok')
"""
    proc = subprocess.run([sys.executable, "-X", "dev", "-W", "error", "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr
    assert proc.stderr == ""


def test_inspect_matches_the_cli(tmp_path, bad_folder, gpufeed_cli):
    """gpufeed.inspect() returns the document `gpufeed inspect --json` prints (the same code)."""
    proc = subprocess.run([str(gpufeed_cli), "inspect", "--json", str(bad_folder / "bees"), str(tmp_path / "nope.jpg")],
                          capture_output=True, text=True)
    assert proc.returncode == 1  # a file failed
    cli = json.loads(proc.stdout)
    doc = gpufeed.inspect(bad_folder / "bees", tmp_path / "nope.jpg")
    assert doc == cli
    assert doc["summary"]["files"] == 11 and doc["summary"]["failed"] == 2
    by_path = {f["path"]: f for f in doc["files"]}
    bad = by_path[str(bad_folder / "bees" / "bees_0005_bad.jpg")]
    assert bad["result"] == "error" and bad["error"]["kind"] in ("truncated", "corrupt") and bad["format"] == "jpeg"
    assert by_path[str(tmp_path / "nope.jpg")]["error"]["kind"] == "io"
    good = by_path[str(bad_folder / "bees" / "bees_000.jpg")]
    img = gpufeed.decode_image(good["path"])
    assert good["result"] == "ok" and (good["output"]["height"], good["output"]["width"]) == tuple(img.shape[:2])


# ---- num_workers="auto" -------------------------------------------------------------------------


def test_num_workers_auto_gives_one_threads_batches_and_reports_its_choices(folder):
    """The thread count follows the loop's pace (each change in stats()["thread_decisions"]),
    the batches do not: they equal num_workers=1's, in an epoch whose loop holds each batch 20 ms
    (one thread is plenty for these small images) and in one that asks again at once (where the
    count may rise again). Which decisions real clocks lead to depends on the machine's load; the
    exact decisions for given measurements are tests/test_loader.cpp's (Loader.AutoNumWorkers...),
    so here only their record is checked: every field, counts within the budget, the last
    decision's count in force."""
    kw = dict(batch_size=1, shuffle=True, seed=5, image_size=32, dtype=torch.uint8, prefetch_depth=2)
    fixed = gpufeed.DataLoader(folder, num_workers=1, **kw)
    want = []
    for epoch in (0, 1):
        fixed.set_epoch(epoch)
        want.append(epoch_batches(fixed))
    fixed.close()
    probe = gpufeed.DataLoader(folder, num_workers=0, **kw)
    budget = probe.num_workers  # 0 = the CPU budget
    probe.close()
    loader = gpufeed.DataLoader(folder, num_workers="auto", **kw)
    assert loader.num_workers == budget  # it starts with the whole budget
    assert loader.stats()["threads"] == budget
    got = []
    for epoch, pause in ((0, 0.02), (1, 0.0)):
        loader.set_epoch(epoch)
        batches = []
        for images, labels in loader:
            batches.append((images.clone(), labels.clone(), list(loader.last_batch["indices"])))
            time.sleep(pause)
        got.append(batches)
    for g, w in zip(got, want):
        assert len(g) == len(w)
        for (gi, gl, gx), (wi, wl, wx) in zip(g, w):
            assert gx == wx
            assert torch.equal(gl, wl)
            assert torch.equal(gi, wi)
    decisions = loader.stats()["thread_decisions"]
    if budget >= 2:
        count = budget
        for d in decisions:
            assert set(d) == {"epoch", "batch", "from", "to", "prefetch_depth_from", "prefetch_depth_to",
                              "sample_cost_us", "demand_per_s", "needed", "wait_fraction", "why"}
            assert d["from"] == count and 1 <= d["to"] <= budget and d["to"] != d["from"], decisions
            assert d["prefetch_depth_from"] == d["prefetch_depth_to"] == 2
            assert d["epoch"] in (0, 1) and 0 <= d["batch"] < len(want[d["epoch"]]) and d["why"]
            count = d["to"]
        assert loader.stats()["threads"] == count
    else:
        print(f"CPU budget {budget}: auto has no choice to make; only the batches are checked")
        assert decisions == []
    # The loop's data wait, as the loader counts it (the iterator waits in wait_ready slices).
    summary = loader.epoch_summary()
    assert summary["wait_s"] >= summary["first_wait_s"] >= 0
    loader.close()


def test_num_workers_refuses_other_words_naming_the_keyword(folder):
    with pytest.raises(ValueError, match=r"num_workers=.*or auto, not 'many'"):
        gpufeed.DataLoader(folder, num_workers="many")
    with pytest.raises(TypeError, match="num_workers"):
        gpufeed.DataLoader(folder, num_workers=2.5)
