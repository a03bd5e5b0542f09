"""decode_device from Python: the package points the C++ library at nvidia-nvimgcodec's copy, the
keyword's refusals, and (on a CUDA machine) batches decoded on the GPU against the CPU path's."""
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest
import torch

import gpufeed


def test_import_points_the_library_at_the_nvimgcodec_wheel():
    env = {k: v for k, v in os.environ.items() if k != "GPUFEED_NVIMGCODEC_LIBRARY"}
    out = subprocess.run([sys.executable, "-c", "import os, gpufeed; print(os.environ.get('GPUFEED_NVIMGCODEC_LIBRARY', ''))"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    spec = importlib.util.find_spec("nvidia.nvimgcodec")
    if spec is None:
        assert out.stdout.strip() == ""
        return
    want = pathlib.Path(list(spec.submodule_search_locations)[0]) / "libnvimgcodec.so.0"
    assert out.stdout.strip() == str(want)
    # A value already set is kept.
    env["GPUFEED_NVIMGCODEC_LIBRARY"] = "/opt/elsewhere/libnvimgcodec.so.0"
    out = subprocess.run([sys.executable, "-c", "import os, gpufeed; print(os.environ['GPUFEED_NVIMGCODEC_LIBRARY'])"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.stdout.strip() == "/opt/elsewhere/libnvimgcodec.so.0"


def test_gpu_decode_needs_a_cuda_device_and_no_augmentations(folder):
    with pytest.raises(ValueError, match="decode_device='gpu' decodes JPEGs on the CUDA device"):
        gpufeed.DataLoader(folder, batch_size=4, decode_device="gpu")
    with pytest.raises(ValueError, match="gpu_decode_budget="):
        gpufeed.DataLoader(folder, batch_size=4, decode_device="cpu", gpu_decode_budget=0)
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="no other augmentation"):
            gpufeed.DataLoader(folder, batch_size=4, device="cuda", decode_device="gpu", color_jitter=0.4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU decode runs on the GPU machine")
def test_gpu_batches_are_the_cpu_paths_within_a_few_levels(folder):
    kw = dict(batch_size=9, image_size=64, device="cuda", dtype=torch.uint8, seed=3)
    cpu = [x for x, _ in gpufeed.DataLoader(folder, decode_device="cpu", **kw)]
    gpu = [x for x, _ in gpufeed.DataLoader(folder, decode_device="gpu", **kw)]
    assert len(cpu) == len(gpu) == 3
    diff = torch.cat([(a.int() - b.int()).abs().flatten() for a, b in zip(cpu, gpu)]).float()
    print(f"GPU decode vs CPU path: max {diff.max().item():.0f}, mean {diff.mean().item():.3f}")
    assert diff.mean().item() <= 2.0
