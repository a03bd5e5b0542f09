"""examples/python/train_pipeline.py (torch.distributed.pipelining fed by gpufeed) on the CPU with Gloo,
and gpufeed.DataLoader(labels_only=True), which feeds its last stage.

The pipeline runs must equal one process training the whole model with gradient accumulation over
the same micro-batches; DP x PP pipelines must split each epoch between them.
"""
import math
import os
import pathlib
import socket
import subprocess
import sys

import pytest
import torch

import gpufeed
from conftest import ROOT, make_image_folder

EXAMPLE = ROOT / "examples" / "python" / "train_pipeline.py"
sys.path.insert(0, str(EXAMPLE.parent))
import train_pipeline  # noqa: E402

# float32 on the CPU, one thread per process. The pipeline adds the micro-batches' gradients and
# multiplies by 1/M where the reference adds the gradients of loss / M: the same result for M = 4 (a
# power of two), so with the backward passes in the same order the two agree to the bit (measured:
# 0). The order matters: ScheduleLoopedBFS (both stages in one process) runs the micro-batches'
# backward passes last to first, and adding the same gradients in the other order moves the
# parameters by ~1e-8 after one step, which this tiny-BatchNorm setting (micro-batches of 4, 1x1
# pixels at layer4) grows to ~1e-4 after the next and ~1e-2 after four; so the reference runs its
# backward passes in the schedule's order. The bounds allow for a rounding or two and stay far
# below any real mismatch (a micro-batch out of place, BatchNorm over the whole batch, a missed
# 1/M or an extra BatchNorm update change losses and parameters by > 1e-2).
LOSS_TOL = 1e-5
PARAM_TOL = 1e-5

# 32 images of 3 classes, batch 16 in 4 micro-batches of 4, 32 px: 2 steps per epoch, 2 epochs; SGD at
# lr 0.1 x 16 / 256.
ARGS = ["--arch", "resnet18", "--stages", "2", "--microbatches", "4", "--batch-size", "16", "--image-size", "32",
        "--epochs", "2", "--workers", "1", "--lr", "0.1", "--seed", "3"]


@pytest.fixture(scope="module")
def pipe_data(tmp_path_factory) -> pathlib.Path:
    """ImageFolder of 3 classes: 11 + 11 + 10 = 32 JPEGs (2 batches of 16)."""
    root = tmp_path_factory.mktemp("pipeline") / "train"
    make_image_folder(root, classes=("a", "b"), per_class=11, seed=11)
    make_image_folder(root, classes=("c",), per_class=10, seed=12)
    return root


@pytest.fixture(scope="module")
def dp_data(tmp_path_factory) -> pathlib.Path:
    """ImageFolder of 4 classes x 8 JPEGs: 32 samples, 2 pipelines x 2 batches of 8 per epoch."""
    return make_image_folder(tmp_path_factory.mktemp("pipeline_dp") / "train", classes=("w", "x", "y", "z"),
                             per_class=8, seed=13)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pipeline(data: pathlib.Path, record: pathlib.Path, nproc: int, extra=()) -> str:
    """The example on nproc CPU processes (Gloo): under torchrun, or for one process started with
    torchrun's environment on a free port (no launcher to start); returns its stdout."""
    script = [str(EXAMPLE), "--data", str(data), "--device", "cpu", "--record", str(record), *ARGS, *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if nproc == 1:
        cmd = [sys.executable, *script]
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), *script]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc.stdout


def load_records(record: pathlib.Path, nproc: int):
    return [torch.load(record / f"rank{r}.pt", weights_only=True) for r in range(nproc)]


@pytest.fixture(scope="module")
def reference(pipe_data):
    """reference(order): one process, the whole resnet18, gradient accumulation over the same 4
    micro-batches, BatchNorm in train mode per micro-batch, the backward passes in micro-batch
    order ("forward") or last to first after all forwards ("reverse"). Returns per-micro-batch
    losses [steps][M], each step's dataset indices, and the final state_dict of each of the 2 stages."""
    cache = {}

    def run(order: str):
        if order in cache:
            return cache[order]
        args = train_pipeline.parse_args(["--data", str(pipe_data), *ARGS])
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # as the pipeline's processes (OMP_NUM_THREADS=1)
        loader = gpufeed.DataLoader(args.data, num_workers=1, **train_pipeline.loader_keywords(args, 0, 1))
        model = train_pipeline.make_model(args.arch, len(loader.classes), args.seed)
        parts = train_pipeline.split_stages(model, args.stages)
        whole = torch.nn.Sequential(*parts)
        opt = train_pipeline.make_optimizer(whole.parameters(), args)
        losses, indices = [], []
        M = args.microbatches
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            for images, labels in loader:  # [16, 3, 32, 32] float32, [16] int64
                step = []
                pending = []
                for x, y in zip(torch.tensor_split(images, M), torch.tensor_split(labels, M)):
                    loss = torch.nn.functional.cross_entropy(whole(x), y)  # [4, 3] logits of [4, 3, 32, 32]
                    step.append(loss.item())
                    if order == "forward":
                        (loss / M).backward()
                    else:
                        pending.append(loss)
                for loss in reversed(pending):
                    (loss / M).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                losses.append(step)
                indices.append(loader.last_batch["indices"])
        torch.set_num_threads(threads)
        cache[order] = {"losses": losses, "indices": indices, "state": [p.state_dict() for p in parts]}
        return cache[order]

    return run


def max_state_diff(a, b) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].is_floating_point())


# ScheduleGPipe and Schedule1F1B (a process per stage) run the backward passes in micro-batch
# order; ScheduleLoopedBFS (both stages in one process, as on a single GPU) last to first.
@pytest.mark.parametrize("schedule,nproc,order", [("gpipe", 2, "forward"), ("1f1b", 2, "forward"),
                                                  ("gpipe", 1, "reverse")],
                         ids=["gpipe-2proc", "1f1b-2proc", "gpipe-2stages-1proc"])
def test_pipeline_equals_gradient_accumulation(tmp_path, pipe_data, reference, schedule, nproc, order):
    reference = reference(order)
    out = run_pipeline(pipe_data, tmp_path, nproc, ["--schedule", schedule])
    lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 2, out
    recs = load_records(tmp_path, nproc)
    last = recs[-1]
    assert len(last["losses"]) == 4 and all(len(s) == 4 for s in last["losses"])
    assert recs[0]["indices"] == reference["indices"] and last["indices"] == reference["indices"]
    loss_diff = max(abs(a - b) for sa, sb in zip(last["losses"], reference["losses"]) for a, b in zip(sa, sb))
    states = {i: s for r in recs for i, s in r["state"].items()}
    assert sorted(states) == [0, 1]
    param_diff = max(max_state_diff(states[i], reference["state"][i]) for i in (0, 1))
    print(f"{schedule} x {nproc} process(es): max |loss diff| {loss_diff:.3g}, max |param/buffer diff| "
          f"{param_diff:.3g}")
    assert loss_diff < LOSS_TOL
    assert param_diff < PARAM_TOL
    # The run trained: the weights moved away from the initialisation by far more than the tolerance.
    init = train_pipeline.split_stages(train_pipeline.make_model("resnet18", 3, 3), 2)
    assert max_state_diff(init[1].state_dict(), states[1]) > 100 * PARAM_TOL


def test_dp2_pp2_pipelines_split_the_epoch(tmp_path, dp_data):
    out = run_pipeline(dp_data, tmp_path, 4, ["--dp", "2", "--batch-size", "8"])
    assert "2 stages x 2 pipeline(s), 2 process(es) per pipeline" in out
    assert len([line for line in out.splitlines() if line.startswith("epoch ")]) == 2, out
    recs = load_records(tmp_path, 4)
    assert [(r["pipeline"], r["stages"]) for r in recs] == [(0, [0]), (0, [1]), (1, [0]), (1, [1])]
    for first, last in ((recs[0], recs[1]), (recs[2], recs[3])):
        assert len(first["indices"]) == 4  # 2 epochs x 2 steps of 8
        assert last["indices"] == first["indices"]  # the labels-only loader follows the image loader
        assert last["labels"] == first["labels"]
    for epoch in range(2):
        a = [i for step in recs[0]["indices"][2 * epoch:2 * epoch + 2] for i in step]
        b = [i for step in recs[2]["indices"][2 * epoch:2 * epoch + 2] for i in step]
        assert len(a) == len(b) == 16
        assert not set(a) & set(b)
        assert sorted(a + b) == list(range(32))  # every sample once
    assert recs[0]["indices"][:2] != recs[0]["indices"][2:]  # a new order each epoch
    # Gradients are averaged over the pipelines, so each stage's weights stay identical in both.
    for s, (r0, r1) in enumerate(((recs[0], recs[2]), (recs[1], recs[3]))):
        w0, w1 = r0["state"][s], r1["state"][s]
        for k in w0:
            if not k.endswith(("running_mean", "running_var", "num_batches_tracked")):
                assert torch.equal(w0[k], w1[k]), (s, k)
    for r in (recs[1], recs[3]):
        assert len(r["losses"]) == 4 and all(math.isfinite(v) and v > 0 for step in r["losses"] for v in step)


@pytest.mark.parametrize("drop_last", [False, True])
def test_labels_only_matches_the_image_loader(folder, drop_last):
    kw = dict(batch_size=5, shuffle=True, seed=7, drop_last=drop_last, rank=1, world_size=2, image_size=32)
    images = gpufeed.DataLoader(folder, num_workers=1, **kw)
    labels = gpufeed.DataLoader(folder, labels_only=True, **kw)
    assert labels.num_workers == 0 and len(labels) == len(images) == (2 if drop_last else 3)
    for epoch in (0, 3):
        images.set_epoch(epoch)
        labels.set_epoch(epoch)
        pairs = list(zip(images, labels))
        assert len(pairs) == len(images)
        for (x, y), (none, y2) in pairs:
            assert none is None and y2.dtype == torch.int64
            assert torch.equal(y, y2)
        assert labels.last_batch["indices"] == images.last_batch["indices"]
        assert labels.indices(epoch) == images.indices(epoch)


def test_labels_only_resumes_and_refuses_what_it_cannot_do(folder):
    kw = dict(batch_size=4, shuffle=True, seed=2, image_size=32)
    full = [y for _, y in gpufeed.DataLoader(folder, labels_only=True, **kw)]  # 27 samples: 7 batches
    assert [len(y) for y in full] == [4] * 6 + [3]
    loader = gpufeed.DataLoader(folder, labels_only=True, **kw)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    assert state["batches_yielded"] == 2 and state["num_batches"] == 7
    resumed = gpufeed.DataLoader(folder, labels_only=True, **kw)
    resumed.load_state_dict(state)
    rest = [y for _, y in resumed]
    assert len(rest) == 5 and all(torch.equal(a, b) for a, b in zip(rest, full[2:]))
    with pytest.raises(ValueError, match="on_error='skip'"):
        gpufeed.DataLoader(folder, labels_only=True, on_error="skip")
    with pytest.raises(RuntimeError, match="labels_only"):
        loader.stats()
