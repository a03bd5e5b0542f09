"""examples/python/train_imagenet.py under torchrun, 2 CPU processes with Gloo, with each loader."""
import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT, make_image_folder


@pytest.fixture(scope="module")
def imagenet_like(tmp_path_factory):
    root = tmp_path_factory.mktemp("example")
    make_image_folder(root / "train", classes=("a", "b", "c"), per_class=8, seed=3)
    make_image_folder(root / "val", classes=("a", "b", "c"), per_class=3, seed=4)
    return root


# gpufeed's run also turns on the references' recipe flags (augmentation on gpufeed's threads,
# MixUp/CutMix and label smoothing in the loop); torch's runs the plain recipe.
@pytest.mark.parametrize("loader", ["gpufeed", "torch"])
def test_example_torchrun_gloo(tmp_path, imagenet_like, loader):
    recipe = ["--auto-augment", "ta_wide", "--random-erase", "0.5", "--label-smoothing", "0.1", "--mixup-alpha",
              "0.2", "--cutmix-alpha", "1.0"] if loader == "gpufeed" else []
    metrics = tmp_path / "metrics.jsonl"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "examples" / "python" / "train_imagenet.py"), "--data", str(imagenet_like), "--device", "cpu",
           "--loader", loader, "--arch", "resnet18", "--epochs", "2", "--batch-size", "4", "--image-size", "32",
           "--workers", "1", "--metrics", str(metrics), "--checkpoint", str(tmp_path / "model.pt")] + recipe
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    # 24 training images over 2 ranks of batch 4: 3 steps per epoch per rank.
    assert f"loader {loader}: 3 steps/epoch of 4 x 2 process(es) on cpu" in out
    lines = [line for line in out.splitlines() if line.startswith("epoch ")]
    assert len(lines) == 2, out
    pattern = (r"epoch \d/2  loss [\d.]+  top1 [\d.]+%  images/s [\d.]+  data_wait [\d.]+%  lr [\d.e-]+  "
               r"time [\d.]+s  val_loss [\d.]+  val_top1 [\d.]+%  val_top5 [\d.]+%")
    assert all(re.fullmatch(pattern, line) for line in lines), lines
    assert "verdict: " in out and "steps: 6, per step" in out  # gpufeed.profile's report, rank 0
    assert metrics.exists() and (tmp_path / "model.pt").exists()
