#!/usr/bin/env python3
"""Computes golden values with the venv's PyTorch/torchvision, at test time.

Runs every gen_*.py module beside this file; each has make(out: pathlib.Path) and writes JSON
(or .pt) files that the C++ tests read from GPUFEED_GOLDEN_DIR. Nothing here is committed output:
the references are recomputed by the reference implementations on every test run.
"""
import argparse
import importlib.util
import pathlib
import sys


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
