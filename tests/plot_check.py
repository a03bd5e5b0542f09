#!/usr/bin/env python3
"""CI check for tools/bench/plot.py: a short real training run writes a metrics file, a short loader
bench writes a thread-scaling JSON, plot.py draws them, and every PNG must exist, be a few KB at
least, and have many distinct colours (not a blank or single-colour image).

  plot_check.py --gpufeed build/release/tools/gpufeed --plot tools/bench/plot.py --work DIR
Prints 'N passed, M failed' and exits non-zero on any failure.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

from PIL import Image


def run(cmd):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def check_png(path, failures):
    if not os.path.isfile(path):
        failures.append(f"{path}: missing")
        return
    size = os.path.getsize(path)
    img = Image.open(path).convert("RGB")
    w, h = img.size
    colours = img.getcolors(maxcolors=1 << 20) or []
    # Non-trivial: a real figure has axes, text and lines in many shades; a blank one has 1 colour.
    ok = size >= 8_000 and w >= 400 and h >= 250 and len(colours) >= 32
    # And the pixels vary across the image, not just in one corner: the image's lower and upper
    # halves both hold more than one colour.
    halves = [img.crop((0, 0, w, h // 2)), img.crop((0, h // 2, w, h))]
    ok = ok and all(len(p.getcolors(maxcolors=1 << 20) or []) > 1 for p in halves)
    print(f"{'ok  ' if ok else 'BAD '} {path}: {size} bytes, {w}x{h}, {len(colours)} colours")
    if not ok:
        failures.append(f"{path}: {size} bytes, {w}x{h}, {len(colours)} colours")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpufeed", required=True)
    ap.add_argument("--plot", required=True)
    ap.add_argument("--work", required=True)
    args = ap.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    data = os.path.join(args.work, "data")
    metrics = os.path.join(args.work, "metrics.jsonl")
    bench = os.path.join(args.work, "bench.json")
    out = os.path.join(args.work, "png")
    run([args.gpufeed, "make-dataset", "--out", data, "--classes", "2", "--per-class", "24",
         "--min-size", "48", "--max-size", "96"])
    run([args.gpufeed, "train", "--data", data, "--arch", "resnet18", "--epochs", "2",
         "--batch-size", "8", "--image-size", "32", "--num-workers", "2", "--metrics", metrics,
         "--metrics-every", "1", "--progress", "lines"])
    with open(bench, "w") as f:
        subprocess.run([args.gpufeed, "bench", "--data", data, "--num-workers", "1,2",
                        "--batch-size", "8", "--image-size", "32", "--json"], check=True, stdout=f)
    with open(bench) as f:
        doc = json.load(f)
    failures = []
    if [p["num_workers"] for p in doc.get("scaling", [])] != [1, 2]:
        failures.append(f"bench --num-workers 1,2 --json gave {doc!r:.200}")
    run([sys.executable, args.plot, metrics, "--bench", bench, "--out", out])
    names = ["throughput.png", "data_wait.png", "gpu.png", "breakdown.png", "summary.png", "scaling.png"]
    for name in names:
        check_png(os.path.join(out, name), failures)
    checks = len(names) + 1
    print(f"{checks - len(failures)} passed, {len(failures)} failed")
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
