"""Loads gpufeed._C from an unpacked wheel in a Python without torch or numpy (an aarch64 CPython
under qemu: tools/wheel/qemu_smoke.sh) and decodes one image: prints its shape and the sha256 of
its pixels, which must equal the same run's on another architecture.

  python smoke_extension.py UNPACKED_WHEEL_DIR IMAGE

_C hands tensors to torch.utils.dlpack.from_dlpack (nanobind's pytorch export); a stand-in
module returns nanobind's own array, whose buffer is read here. The package's __init__ (which
imports torch) is not run: _C is imported as a top-level module.
"""
import hashlib
import sys
import types

root, image = sys.argv[1:3]
torch = types.ModuleType("torch")
torch.utils = types.ModuleType("torch.utils")
torch.utils.dlpack = types.ModuleType("torch.utils.dlpack")
torch.utils.dlpack.from_dlpack = lambda array: array
sys.modules.update({"torch": torch, "torch.utils": torch.utils, "torch.utils.dlpack": torch.utils.dlpack})
sys.path.insert(0, f"{root}/gpufeed")
import _C  # noqa: E402

with open(image, "rb") as f:
    pixels = memoryview(_C.decode_image(f.read()))
print(f"smoke_extension: {_C.__file__.rsplit('/', 1)[-1]} decoded {image.rsplit('/', 1)[-1]}: "
      f"shape {tuple(pixels.shape)} format {pixels.format} sha256 {hashlib.sha256(pixels.tobytes()).hexdigest()}")
