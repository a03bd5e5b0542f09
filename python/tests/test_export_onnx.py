"""python -m gpufeed.export_onnx: checkpoints in every layout load into torchvision's model, and
onnxruntime's logits equal torch's on the same input."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torchvision

from gpufeed.export_onnx import extract_state_dict

onnxruntime = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed (setup.sh installs it)")


def test_extract_state_dict_layouts():
    sd = {"fc.weight": torch.zeros(2, 3), "fc.bias": torch.zeros(2)}
    ddp = {"module." + k: v for k, v in sd.items()}
    for obj in (sd, ddp, {"state_dict": ddp, "epoch": 3, "optimizer": {"lr": 0.1}}, {"model": sd, "step": 9}):
        assert list(extract_state_dict(obj)) == list(sd)
    with pytest.raises(ValueError):
        extract_state_dict({"epoch": 3, "optimizer": {"lr": 0.1}})


def test_export_ddp_checkpoint_and_compare_with_onnxruntime(tmp_path):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=3)
    for m in model.modules():  # non-trivial batch-norm statistics, so eval mode matters
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    model.eval()
    ckpt = tmp_path / "ddp.pt"
    torch.save({"state_dict": {"module." + k: v for k, v in model.state_dict().items()}, "epoch": 1}, ckpt)
    out = tmp_path / "model.onnx"
    proc = subprocess.run([sys.executable, "-m", "gpufeed.export_onnx", str(ckpt), "--arch", "resnet18",
                           "--num-classes", "3", "--out", str(out), "--image-size", "64"],
                          capture_output=True, text=True, env=dict(os.environ), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    x = torch.randn(4, 3, 64, 64)  # another batch size than the export's example: N is dynamic
    with torch.no_grad():
        ref = model(x).numpy()
    session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["images"]
    got = session.run(["logits"], {"images": x.numpy()})[0]
    assert got.shape == (4, 3)
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_export_rejects_a_mismatched_checkpoint(tmp_path):
    ckpt = tmp_path / "r18.pt"
    torch.save(torchvision.models.resnet18(num_classes=3).state_dict(), ckpt)
    proc = subprocess.run([sys.executable, "-m", "gpufeed.export_onnx", str(ckpt), "--arch", "resnet18",
                           "--num-classes", "5", "--out", str(tmp_path / "m.onnx")], capture_output=True, text=True)
    assert proc.returncode == 2 and "size mismatch" in proc.stderr and str(ckpt) in proc.stderr
