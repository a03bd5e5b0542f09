"""examples/python/train_dino.py under torchrun, 2 CPU processes with Gloo, a few steps."""
import math
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, make_image_folder, shared_dir


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """The shared ImageNet sample (real JPEGs) when it is there, else 24 generated ones."""
    real = shared_dir() / "data" / "imagenet-sample"
    if real.is_dir():
        return real
    print(f"{real} is absent (the shared real data sits beside the checkout): generated JPEGs instead")
    return make_image_folder(tmp_path_factory.mktemp("dino") / "train", classes=("a", "b", "c"), per_class=8, seed=5)


def test_dino_example_torchrun_gloo(images):
    # Small views (64 and 32 px, 2 local crops) and a small head keep 2 epochs of 3 steps on a
    # 2-core machine well under a minute; the views are the dinov2 preset's otherwise.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "examples" / "python" / "train_dino.py"), "--data", str(images), "--device", "cpu",
           "--views", "dinov2", "--local-crops-number", "2", "--global-size", "64", "--local-size", "32",
           "--epochs", "2", "--max-steps", "3", "--batch-size", "4", "--num-workers", "1", "--out-dim", "1024"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert "views dinov2: 4 per image; 3 steps/epoch of 4 x 2 process(es) on cpu" in out, out
    lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    pattern = r"epoch (\d)/2  steps 3  loss ([-\d.naif]+)  images/s [\d.]+  data_wait [\d.]+%  time [\d.]+s"
    matches = [re.fullmatch(pattern, line) for line in lines]
    assert len(lines) == 2 and all(matches), out
    assert [m.group(1) for m in matches] == ["1", "2"]
    for m in matches:
        loss = float(m.group(2))
        # a cross-entropy against the teacher's softmax over 1024 prototypes: positive, and
        # below log(1024) + a margin while the student is near uniform
        assert math.isfinite(loss) and 0 < loss < 2 * math.log(1024), lines
