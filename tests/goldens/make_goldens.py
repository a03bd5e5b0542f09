#!/usr/bin/env python3
"""Computes golden values with the venv's PyTorch/torchvision, at test time.

Runs every gen_*.py module beside this file; each has make(out: pathlib.Path) and writes JSON
(or .pt) files that the C++ tests read from GPUFEED_GOLDEN_DIR. Nothing here is committed output:
the references are recomputed by the reference implementations on every test run.
"""
import argparse
import importlib.util
import os
import pathlib
import sys

# MKL picks its kernels by CPU: on Intel CPUs with AVX-512 its batched matmul (the bmm inside
# torchvision's _affine_grid) fuses the multiply-adds, elsewhere (AVX2, and AMD CPUs, which MKL
# runs on its AVX2 path) it rounds each product. The affine grid differs in the last bit, and
# ShearX/ShearY/Rotate by one level in some pixels. gpufeed computes the AVX2 path's grid on every
# CPU (loader/transforms/src/augment.cpp, AffineGrid), so the goldens come from that path on every
# CPU too. Set before torch is imported; MKL reads it once.
os.environ.setdefault("MKL_ENABLE_INSTRUCTIONS", "AVX2")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, type=pathlib.Path)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    here = pathlib.Path(__file__).resolve().parent
    sys.path.insert(0, str(here))  # the gen_* modules share draw_recorder.py
    for path in sorted(here.glob("gen_*.py")):
        spec = importlib.util.spec_from_file_location(path.stem, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod.make(args.out)
        print(f"{path.name}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
