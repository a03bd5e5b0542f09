#!/usr/bin/env python3
"""Start-up on a million files: gpufeed's dataset listing vs torchvision.datasets.ImageFolder.

Generates (once) an ImageNet-shaped tree of zero-byte .JPEG files -- CLASSES folders of
PER_CLASS files, 1000 x 1300 by default -- and a file list of the same samples, under
--root (default /tmp/gpufeed_listing; kept between runs, regenerated only when its shape
differs). Nothing is decoded: only the listing is measured. Then, side by side in this one run:

  * torchvision.datasets.ImageFolder(root/train): time, peak RSS growth, and its sample order;
  * `gpufeed index root/train --index-cache off`: the first listing (walks the tree);
  * `gpufeed index root/train --index-cache DIR` twice: the walk that writes the cache, then the
    cached start (no walk: only the folders' mtimes are checked);
  * the 1.3M-line file list: Python reading it as a user would ([line.rsplit(' ', 1)]) vs
    `gpufeed index list.txt`, uncached and cached.

Each measurement runs in a fresh process (`gpufeed index --json` reports its own listing time,
peak RSS growth and the table's bytes). It prints the times, the ratios to torchvision and the
bytes per sample beyond the path bytes, and checks that gpufeed's order is torchvision's.

  tools/bench/bench_listing.py [--gpufeed build/release/tools/gpufeed] [--classes 1000 --per-class 1300]
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time


def generate(root, classes, per_class):
    """root/train/<class>/<class>_<i>.JPEG (zero bytes) and root/list.txt; once per shape."""
    marker = os.path.join(root, "COMPLETE")
    shape = f"{classes}x{per_class}"
    if os.path.exists(marker) and open(marker).read().strip() == shape:
        return
    if os.path.exists(root):
        shutil.rmtree(root)
    train = os.path.join(root, "train")
    t0 = time.perf_counter()
    os.makedirs(train)
    lines = []
    for c in range(classes):
        name = f"n{c:08d}"
        folder = os.path.join(train, name)
        os.mkdir(folder)
        for i in range(per_class):
            path = os.path.join(folder, f"{name}_{i}.JPEG")
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
            lines.append(f"train/{name}/{name}_{i}.JPEG {c}\n")
        if c % 100 == 99:
            print(f"generate: {c + 1}/{classes} classes ({time.perf_counter() - t0:.0f} s)", flush=True)
    with open(os.path.join(root, "list.txt"), "w") as f:
        f.writelines(lines)
    with open(marker, "w") as f:
        f.write(shape + "\n")


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


# Runs in a child process: the measured side of the Python baselines.
CHILD = r"""
import hashlib, json, os, resource, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"): return int(line.split()[1]) * 1024
kind, path = sys.argv[1], sys.argv[2]
import torchvision  # imported before the clock starts, as gpufeed's start-up is not timed either
before = rss()
t0 = time.perf_counter()
if kind == "imagefolder":
    ds = torchvision.datasets.ImageFolder(path)
    samples = ds.samples
else:
    root = os.path.dirname(path)
    samples = []
    with open(path) as f:
        for line in f:
            p, label = line.rstrip("\n").rsplit(" ", 1)
            samples.append((os.path.join(root, p), int(label)))
seconds = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
h = hashlib.sha256("".join(f"{p} {label}\n" for p, label in samples).encode())
print(json.dumps({"seconds": seconds, "samples": len(samples), "rss_growth": peak - before,
                  "order_sha256": h.hexdigest()}))
"""


def python_side(kind, path):
    return run_json([sys.executable, "-c", CHILD, kind, path])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpufeed", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "release",
                                                       "tools", "gpufeed"))
    ap.add_argument("--root", default="/tmp/gpufeed_listing")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--per-class", type=int, default=1300)
    ap.add_argument("--generate-only", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each measurement; the median is reported")
    a = ap.parse_args()

    generate(a.root, a.classes, a.per_class)
    if a.generate_only:
        return 0
    train = os.path.join(a.root, "train")
    listing = os.path.join(a.root, "list.txt")
    cache = os.path.join(a.root, "index-cache")

    def median(f):
        runs = [f() for _ in range(a.repeat)]
        runs.sort(key=lambda r: r["seconds"])
        return runs[len(runs) // 2]

    def gf(path, cache_dir):
        return run_json([a.gpufeed, "index", path, "--index-cache", cache_dir, "--json"])

    def gf_cached(path):
        shutil.rmtree(cache, ignore_errors=True)
        gf(path, cache)  # writes it
        return median(lambda: gf(path, cache))

    # Warm the dentry cache once so no side pays for the first cold walk.
    python_side("imagefolder", train)
    rows = {}
    rows["torchvision ImageFolder"] = median(lambda: python_side("imagefolder", train))
    rows["gpufeed ImageFolder, first listing"] = median(lambda: gf(train, "off"))
    rows["gpufeed ImageFolder, cached start"] = gf_cached(train)
    rows["Python file list (rsplit)"] = median(lambda: python_side("list", listing))
    rows["gpufeed file list, first listing"] = median(lambda: gf(listing, "off"))
    rows["gpufeed file list, cached start"] = gf_cached(listing)

    base = rows["torchvision ImageFolder"]
    n = base["samples"]
    print(f"listing {n} samples ({a.classes} classes x {a.per_class}), median of {a.repeat} runs, "
          f"each in a fresh process")
    print(f"{'':38} {'seconds':>8} {'vs Python':>15} {'peak RSS growth':>16} {'per sample':>11} "
          f"{'table beyond paths':>19}")
    for name, r in rows.items():
        ref = rows["Python file list (rsplit)"] if "file list" in name else base
        ratio = ref["seconds"] / r["seconds"]
        beyond = (f"{(r['table_bytes'] - r['path_bytes']) / r['samples']:.1f} B/sample"
                  if "table_bytes" in r else "")
        print(f"{name:38} {r['seconds']:8.3f} {ratio:14.2f}x {r['rss_growth'] / 2**20:13.1f} MB "
              f"{r['rss_growth'] / r['samples']:9.1f} B {beyond:>19}")
    if "path_bytes" in rows["gpufeed ImageFolder, first listing"]:
        print(f"path bytes per sample: {rows['gpufeed ImageFolder, first listing']['path_bytes'] / n:.1f}")
    # The order check, untimed: gpufeed's samples written out, hashed as the child hashed torchvision's.
    ok = True
    for name, path, ref in (("ImageFolder", train, base), ("file list", listing, rows["Python file list (rsplit)"])):
        out = os.path.join(a.root, "gpufeed_order.txt")
        subprocess.run([a.gpufeed, "index", path, "--index-cache", cache, "--write-list", out, "--json"],
                       check=True, capture_output=True)
        with open(out, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        os.remove(out)
        same = digest == ref["order_sha256"]
        ok = ok and same
        print(f"order: gpufeed's {name} (cached) " + ("equals" if same else "DIFFERS FROM")
              + " the Python side's, sample for sample (sha256 of '<path> <label>' lines)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
