#!/usr/bin/env python3
"""gpufeed's CPU pipeline against PyTorch, DALI, LibTorch and the decode floor, in one run.

Same files (--data, a flat folder: the class is the file-name prefix), same thread counts, batch
size, output size and transform for every method:

  gpufeed      `gpufeed bench` (train: RandomResizedCrop + flip; eval: Resize + CenterCrop)
  python       "gpufeed (Python)": gpufeed.DataLoader, the same loader through the Python
               iterator (dtype=torch.uint8: zero-copy tensors of the slots), in a plain
               `for images, labels in loader` loop; the build's package (<build>/python) when built
  pytorch      torchvision + DataLoader(num_workers=T, pin_memory=True, persistent_workers=True)
               over a Dataset of the same files, PIL transforms ending in PILToTensor (uint8,
               like gpufeed's output: no float conversion is charged to anyone)
  dali         NVIDIA DALI's CPU pipeline (device_id=None): readers.file,
               decoders.image_random_crop / decoders.image, resize, crop_mirror_normalize (uint8 HWC)
  libtorch     tools/bench/baselines/libtorch_dataloader: torch::data DataLoader, OpenCV decode + resize
  floor        `gpufeed bench --mode floor`: libjpeg-turbo doing exactly the decode work of the
               gpufeed run (same plans, DCT scales and crops), files in memory, nothing else
  full         `gpufeed bench --mode full`: whole-image decode of the same files (8/8)
  before       (--before BUILD) `gpufeed bench` of another build, e.g. the commit before a
               change, run like the gpufeed rows and interleaved with them: the table adds
               this build over that one (images/s and CPU time per sample), per transform

The train_aug rows (gpufeed and pytorch only) add the torchvision references' augmentations
after RandomResizedCrop + flip: TrivialAugmentWide + RandomErasing(p=0.1) (`gpufeed bench
--auto-augment ta_wide --random-erase 0.1`; torchvision.transforms.v2 for PyTorch, PIL path,
RandomErasing on the uint8 tensor). Reported: gpufeed train_aug / PyTorch train_aug, and
gpufeed train_aug / gpufeed train (what the augmentation costs gpufeed), per round.

Every measurement runs in its own process (its peak memory is the process tree's), after
--warmup untimed passes, over --epochs timed passes. The machine may be shared, so the whole set
runs --rounds times, interleaved, and the report uses per-round ratios (median over rounds):
ratios measured side by side are what the targets are about, never absolute rates.

Also reported: where gpufeed's time goes per sample (read, decode, resize, other), CPU time per
sample of gpufeed and of the floor (robust to other load on the machine), RSS after each pass,
and (--quality) the mean absolute pixel difference of gpufeed's eval (and train) output against
torchvision's on every file.

  .venv/bin/python tools/bench/bench_compare.py --json bench.json
  .venv/bin/python tools/bench/bench_compare.py --threads 2 --rounds 1 --skip dali,libtorch
  .venv/bin/python tools/bench/bench_compare.py --before ../old/build/release --skip pytorch,dali,libtorch,python

Prints a table; --json writes everything measured. --ffcv then runs tools/bench/bench_ffcv.py (gpufeed
on its tar shards, beside FFCV 1.0.2 and WebDataset + DataLoader) with the same
data, the largest thread count, rounds and passes (its JSON beside --json as *-ffcv.json).
"""
import argparse
import json
import math
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRANSFORMS = ("train", "eval")
# The augmented train row: torchvision's classification references' recipe
# (--auto-augment ta_wide --random-erase 0.1) after RandomResizedCrop + flip, for gpufeed
# (`gpufeed bench` with those flags) and PyTorch (torchvision.transforms.v2) only.
AUGMENTED = "train_aug"
AUGMENT_FLAGS = ["--auto-augment", "ta_wide", "--random-erase", "0.1"]


def transforms_of(method):
    base = ("train",) if method == "full" else TRANSFORMS
    return base + ((AUGMENTED,) if method in ("gpufeed", "before", "pytorch") else ())

# --- the baselines, run in a child process: `bench_compare.py --child METHOD ...` --------------------


def _files_and_labels(data):
    names = sorted(n for n in os.listdir(data)
                   if n.lower().endswith((".jpg", ".jpeg", ".png")))
    prefixes = [n.split("_", 1)[0] if "_" in n else os.path.splitext(n)[0] for n in names]
    classes = sorted(set(prefixes))
    index = {c: i for i, c in enumerate(classes)}
    return [os.path.join(data, n) for n in names], [index[p] for p in prefixes]


def pil_files(files, labels, transform):
    """A map-style torch Dataset of (transform(image), label), each file read as torchvision's
    pil_loader reads it (PIL, converted to RGB)."""
    import torch
    from PIL import Image

    class Files(torch.utils.data.Dataset):
        def __len__(self):
            return len(files)

        def __getitem__(self, i):
            with open(files[i], "rb") as f:
                img = Image.open(f).convert("RGB")
            return transform(img), labels[i]

    return Files()


def child_pytorch(args):
    import torch
    import torchvision.transforms as T

    torch.set_num_threads(1)
    files, labels = _files_and_labels(args.data)
    size = args.image_size
    if args.transform == "train":
        tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.PILToTensor()])
    elif args.transform == AUGMENTED:
        # The references' PIL path with --auto-augment ta_wide --random-erase 0.1, kept uint8
        # (no ToDtype/Normalize, as in the other rows): RandomErasing(value 0) on the uint8 tensor.
        import torchvision.transforms.v2 as T2
        tf = T2.Compose([T2.RandomResizedCrop(size, antialias=True), T2.RandomHorizontalFlip(),
                         T2.TrivialAugmentWide(), T2.PILToTensor(), T2.RandomErasing(p=0.1)])
    else:
        tf = T.Compose([T.Resize(round(size * 256 / 224)), T.CenterCrop(size), T.PILToTensor()])

    import warnings
    warnings.filterwarnings("ignore", message=".*pin_memory.*")  # no accelerator here
    loader = torch.utils.data.DataLoader(
        pil_files(files, labels, tf), batch_size=args.batch_size, num_workers=args.threads, pin_memory=True,
        persistent_workers=args.threads > 0)
    samples, t0 = 0, time.perf_counter()
    for e in range(args.warmup + args.epochs):
        if e == args.warmup:
            t0 = time.perf_counter()
        for images, _ in loader:
            if e >= args.warmup:
                samples += images.shape[0]
    seconds = time.perf_counter() - t0
    return {"samples": samples, "seconds": seconds, "images_per_s": samples / seconds}


def child_python(args):
    """gpufeed.DataLoader over the files `gpufeed bench` reads, with its options (sequential
    order, seed 0, prefetch depth 3, epochs numbered from 0, warm-up passes first)."""
    import torch
    import gpufeed

    loader = gpufeed.DataLoader(args.data, batch_size=args.batch_size, shuffle=False, num_workers=args.threads,
                                seed=0, train=args.transform == "train", image_size=args.image_size,
                                dtype=torch.uint8, prefetch_depth=3)
    samples, t0 = 0, time.perf_counter()
    for e in range(args.warmup + args.epochs):
        if e == args.warmup:
            t0 = time.perf_counter()
        loader.set_epoch(e)
        for images, _ in loader:
            if e >= args.warmup:
                samples += images.shape[0]
    seconds = time.perf_counter() - t0
    return {"samples": samples, "seconds": seconds, "images_per_s": samples / seconds}


def child_dali(args):
    from nvidia.dali import fn, pipeline_def, types

    files, labels = _files_and_labels(args.data)
    size = args.image_size

    @pipeline_def(batch_size=args.batch_size, num_threads=args.threads, device_id=None,
                  prefetch_queue_depth=2)
    def pipe():
        jpegs, label = fn.readers.file(files=files, labels=labels, name="reader")
        if args.transform == "train":
            images = fn.decoders.image_random_crop(
                jpegs, device="cpu", output_type=types.RGB, random_area=[0.08, 1.0],
                random_aspect_ratio=[3 / 4, 4 / 3], num_attempts=10)
            images = fn.resize(images, resize_x=size, resize_y=size)
            images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="HWC",
                                              mirror=fn.random.coin_flip())
        else:
            images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
            images = fn.resize(images, resize_shorter=round(size * 256 / 224))
            images = fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="HWC",
                                              crop=(size, size))
        return images, label

    p = pipe()
    p.build()
    per_epoch = math.ceil(len(files) / args.batch_size)
    for _ in range(args.warmup * per_epoch):
        p.run()
    iters = math.ceil(args.epochs * len(files) / args.batch_size)
    t0 = time.perf_counter()
    for _ in range(iters):
        out = p.run()
    seconds = time.perf_counter() - t0
    samples = iters * args.batch_size  # DALI's reader wraps into the next epoch: full batches
    assert len(out[0]) == args.batch_size
    return {"samples": samples, "seconds": seconds, "images_per_s": samples / seconds}


# --- the parent: runs each measurement as a child process and watches its memory ------------------


def _tree(pid):
    """pid and all its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for t in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{t}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def _rss_kib(pids):
    """Summed VmRSS of pids (/proc/PID/status: a counter, cheap to read; smaps_rollup would walk
    the page tables of a process that maps LibTorch and slow it down)."""
    total = 0
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            pass
    return total


def run_measured(cmd, env=None):
    """Runs cmd; returns (stdout, peak RSS of its process tree in bytes (sampled every 0.2 s),
    peak RSS of the process itself in bytes (the kernel's maxrss))."""
    errfile = tempfile.TemporaryFile(mode="w+")  # a pipe could fill while stdout is read
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errfile, text=True, env=env,
                            cwd=ROOT)
    peak = [0]
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_kib(_tree(proc.pid)))
            done.wait(0.2)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    t.join()
    errfile.seek(0)
    err = errfile.read()
    errfile.close()
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{err[-3000:]}")
    return out, peak[0] * 1024, usage.ru_maxrss * 1024


def _last_json(text):
    start = text.index("{")
    return json.loads(text[start:])


class Runner:
    def __init__(self, args):
        self.args = args
        self.gpufeed = pathlib.Path(args.build) / "tools" / "gpufeed"
        self.libtorch = pathlib.Path(args.build) / "tools" / "libtorch_dataloader"
        self.before = pathlib.Path(args.before) / "tools" / "gpufeed" if args.before else None

    def common(self):
        a = self.args
        return ["--data", a.data, "--batch-size", str(a.batch_size), "--image-size",
                str(a.image_size), "--epochs", str(a.epochs), "--warmup", str(a.warmup)]

    def measure(self, method, transform, threads):
        a = self.args
        if method in ("gpufeed", "before", "floor", "full"):
            mode = "loader" if method in ("gpufeed", "before") else method
            cmd = [str(self.before if method == "before" else self.gpufeed), "bench", "--mode", mode, "--num-workers", str(threads),
                   "--transform", "train" if transform == AUGMENTED else transform, "--json",
                   "--seed", "0"] + self.common() + (AUGMENT_FLAGS if transform == AUGMENTED else [])
        elif method == "libtorch":
            cmd = [str(self.libtorch), "--num-workers", str(threads), "--transform", transform,
                   "--data", a.data, "--batch-size", str(a.batch_size), "--image-size",
                   str(a.image_size), "--epochs", str(a.epochs), "--warmup", str(a.warmup)]
        else:
            cmd = [sys.executable, __file__, "--child", method, "--threads", str(threads),
                   "--transform", transform] + self.common()
        env = None
        if method == "python" and (pathlib.Path(a.build) / "python" / "gpufeed").is_dir():
            env = dict(os.environ, PYTHONPATH=str(pathlib.Path(a.build) / "python"))
        out, tree_rss, maxrss = run_measured(cmd, env=env)
        r = _last_json(out)
        r.update({"method": method, "transform": transform, "threads": threads,
                  "peak_tree_rss_bytes": max(tree_rss, maxrss), "peak_main_rss_bytes": maxrss})
        return r


def quality(args, runner):
    """Mean |gpufeed - torchvision| per image over every file, eval (the bar) and train."""
    import numpy as np
    import torchvision.transforms as T
    import torchvision.transforms.functional as F
    from PIL import Image

    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        for transform in TRANSFORMS:
            raw = os.path.join(tmp, f"{transform}.raw")
            subprocess.run([str(runner.gpufeed), "bench", "--data", args.data, "--num-workers", "2",
                            "--transform", transform, "--image-size", str(args.image_size),
                            "--batch-size", str(args.batch_size), "--dump", raw, "--json"],
                           check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
            with open(raw + ".json") as f:
                meta = json.load(f)
            s = meta["size"]
            samples = meta["samples"]
            ours = np.memmap(raw, np.uint8, "r", shape=(len(samples), s, s, 3))
            evaluate = T.Compose([T.Resize(round(s * 256 / 224)), T.CenterCrop(s)])
            diffs, by_scale = [], {}
            for k, m in enumerate(samples):
                with open(m["path"], "rb") as f:
                    img = Image.open(f).convert("RGB")
                if transform == "eval":
                    ref = evaluate(img)
                else:
                    x, y, w, h = m["box"]
                    ref = F.resized_crop(img, y, x, h, w, [s, s], T.InterpolationMode.BILINEAR,
                                         antialias=True)
                    if m["flip"]:
                        ref = F.hflip(ref)
                d = float(np.abs(np.asarray(ref, np.int16) - ours[k].astype(np.int16)).mean())
                diffs.append(d)
                by_scale.setdefault(f"{m['scale']}/8", []).append(d)
            report[transform] = {
                "images": len(diffs), "mean": statistics.fmean(diffs),
                "median": statistics.median(diffs), "p99": float(np.percentile(diffs, 99)),
                "max": max(diffs),
                "by_scale": {k: {"images": len(v), "mean": statistics.fmean(v), "max": max(v)}
                             for k, v in sorted(by_scale.items())},
            }
    return report


def machine():
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    os_name = platform.platform()
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    os_name = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    flags = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    simd = "avx512" if {"avx512f", "avx512bw"} <= flags else "avx2" if "avx2" in flags else "scalar"
    # The resize kernel gpufeed's loader runs: the widest this CPU has, or the narrower one
    # GPUFEED_RESIZE_KERNEL names (to measure an AVX2-only CPU's path on an AVX-512 machine).
    kernel = os.environ.get("GPUFEED_RESIZE_KERNEL", "") or "auto"
    return {"cpu": cpu, "cores": os.cpu_count(), "os": os_name, "simd": simd,
            "resize_kernel": simd if kernel == "auto" else kernel,
            "load_average_at_start": list(os.getloadavg())}


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "imagenet-sample"))
    ap.add_argument("--threads", default="1,2", help="thread counts, e.g. 1,2")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--epochs", type=int, default=3, help="timed passes per measurement")
    ap.add_argument("--warmup", type=int, default=1, help="untimed passes before them")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved repetitions of everything")
    ap.add_argument("--build", default=str(ROOT / "build" / "release"),
                    help="build folder with tools/gpufeed and tools/libtorch_dataloader")
    ap.add_argument("--before", help="another build folder whose `gpufeed bench` runs beside this build's "
                    "(method `before`): this build over it, per transform")
    ap.add_argument("--skip", default="", help="methods to leave out: pytorch,dali,libtorch,...")
    ap.add_argument("--no-quality", action="store_true", help="skip the pixel-difference report")
    ap.add_argument("--json", help="write everything measured here")
    ap.add_argument("--ffcv", action="store_true",
                    help="then run tools/bench/bench_ffcv.py: shards, FFCV 1.0.2 (its own venv) and WebDataset side by side")
    ap.add_argument("--ffcv-python", help="bench_ffcv.py --ffcv-python (default .venv-ffcv/bin/python)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--transform", default="train", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        args.threads = int(args.threads)
        r = {"pytorch": child_pytorch, "dali": child_dali, "python": child_python}[args.child](args)
        print(json.dumps(r))
        return 0

    threads = [int(t) for t in args.threads.split(",")]
    skip = set(filter(None, args.skip.split(",")))
    runner = Runner(args)
    if not runner.gpufeed.exists():
        sys.exit(f"bench_compare: {runner.gpufeed} is missing: build it first (./setup.sh)")
    methods = ["gpufeed"] + (["before"] if args.before else []) + ["python", "floor", "full", "pytorch", "dali",
                                                                    "libtorch"]
    if args.before and not runner.before.exists():
        sys.exit(f"bench_compare: {runner.before} is missing: build the --before folder's CLI first")
    unavailable = {}
    if "libtorch" not in skip and not runner.libtorch.exists():
        unavailable["libtorch"] = f"{runner.libtorch} is not built"
    if "dali" not in skip:
        try:
            import nvidia.dali  # noqa: F401
        except ImportError as e:
            unavailable["dali"] = f"nvidia-dali-cuda130 is not installed ({e})"
    methods = [m for m in methods if m not in skip and m not in unavailable]

    plan = []  # (method, transform, threads); full decode does not depend on the transform
    for t in threads:
        for m in methods:
            for tf in transforms_of(m):
                plan.append((m, tf, t))
    results = []
    for rnd in range(args.rounds):
        for m, tf, t in plan:
            try:
                r = runner.measure(m, tf, t)
            except RuntimeError as e:
                print(f"bench_compare: {m} {tf} {t} threads failed: {e}", file=sys.stderr)
                unavailable.setdefault(m, str(e)[-500:])
                continue
            r["round"] = rnd
            results.append(r)
            print(f"  round {rnd} {m:8s} {tf:5s} {t} threads: {r['images_per_s']:8.1f} images/s",
                  file=sys.stderr, flush=True)

    def rates(m, tf, t):
        return {r["round"]: r["images_per_s"] for r in results
                if r["method"] == m and r["transform"] == tf and r["threads"] == t}

    def ratio(num, den, tf, t, tf_den=None):
        a, b = rates(num, tf, t), rates(den, tf_den or tf, t)
        return median([a[k] / b[k] for k in a if k in b])

    summary = {"rates": {}, "ratios": {}, "scaling": {}, "memory": {}, "cpu_us_per_sample": {}}
    for m in methods:
        for tf in transforms_of(m):
            for t in threads:
                summary["rates"][f"{m}/{tf}/{t}"] = median(list(rates(m, tf, t).values()))
                rs = [r for r in results if r["method"] == m and r["transform"] == tf and r["threads"] == t]
                if rs:
                    summary["memory"][f"{m}/{tf}/{t}"] = max(r["peak_tree_rss_bytes"] for r in rs)
                    cpu = [r["cpu_us_per_sample"] for r in rs if "cpu_us_per_sample" in r]
                    if cpu:
                        summary["cpu_us_per_sample"][f"{m}/{tf}/{t}"] = median(cpu)
            if len(threads) > 1 and tf in TRANSFORMS:
                lo, hi = min(threads), max(threads)
                summary["scaling"][f"{m}/{tf}/{hi}v{lo}"] = median(
                    [rates(m, tf, hi)[k] / rates(m, tf, lo)[k]
                     for k in rates(m, tf, hi) if k in rates(m, tf, lo)])
    for t in threads:
        for tf in TRANSFORMS:
            for other in ("before", "python", "pytorch", "dali", "libtorch", "floor"):
                if other in methods:
                    summary["ratios"][f"gpufeed/{other}/{tf}/{t}"] = ratio("gpufeed", other, tf, t)
            if "full" in methods:
                summary["ratios"][f"gpufeed/full/{tf}/{t}"] = ratio("gpufeed", "full", tf, t, "train")
            # What the decode floor allows: gpufeed/x can reach floor/x only by decoding faster.
            if "floor" in methods:
                for other in ("pytorch", "dali", "libtorch"):
                    if other in methods:
                        summary["ratios"][f"floor/{other}/{tf}/{t}"] = ratio("floor", other, tf, t)
            if "floor" in methods and tf != AUGMENTED:
                cg = summary["cpu_us_per_sample"].get(f"gpufeed/{tf}/{t}")
                cf = summary["cpu_us_per_sample"].get(f"floor/{tf}/{t}")
                if cg and cf:
                    summary["ratios"][f"gpufeed/floor_cpu_time/{tf}/{t}"] = cf / cg
    # The augmented row: against PyTorch's, and against gpufeed's own plain train row (per round).
    for t in threads:
        if "before" in methods:
            summary["ratios"][f"gpufeed/before/{AUGMENTED}/{t}"] = ratio("gpufeed", "before", AUGMENTED, t)
        if "gpufeed" in methods:
            summary["ratios"][f"gpufeed/gpufeed/{AUGMENTED}_vs_train/{t}"] = ratio("gpufeed", "gpufeed", AUGMENTED, t, "train")
            if "pytorch" in methods:
                summary["ratios"][f"gpufeed/pytorch/{AUGMENTED}/{t}"] = ratio("gpufeed", "pytorch", AUGMENTED, t)
                summary["ratios"][f"pytorch/pytorch/{AUGMENTED}_vs_train/{t}"] = ratio("pytorch", "pytorch", AUGMENTED, t, "train")
    # CPU time per sample at the most threads over that at the fewest: 1.0 means no parallel
    # overhead (no contention, no spinning); wall-clock scaling can still fall short when other
    # work on the machine takes the cores.
    if len(threads) > 1:
        lo, hi = min(threads), max(threads)
        for m in ("gpufeed", "floor"):
            for tf in TRANSFORMS:
                a = summary["cpu_us_per_sample"].get(f"{m}/{tf}/{lo}")
                b = summary["cpu_us_per_sample"].get(f"{m}/{tf}/{hi}")
                if a and b:
                    summary["scaling"][f"{m}/{tf}/cpu_time_per_sample_{hi}v{lo}"] = b / a
    # RSS across passes: growth of the last pass's RSS over the first pass's.
    growth = []
    for r in results:
        if r["method"] == "gpufeed" and len(r.get("rss_after_pass_bytes", [])) >= 2:
            p = r["rss_after_pass_bytes"]
            growth.append((max(p[1:]) - p[0]) / p[0])
    summary["rss_growth_after_first_pass"] = max(growth) if growth else float("nan")
    breakdown = {}
    for r in results:
        if r["method"] == "gpufeed":
            key = f"{r['transform']}/{r['threads']}"
            breakdown.setdefault(key, []).append(r["per_sample_us"])
    summary["gpufeed_per_sample_us"] = {
        k: {s: median([v[s] for v in vs]) for s in ("read", "decode", "resize", "other")}
        for k, vs in breakdown.items()}
    floor_scales = next((r["scale_histogram"] for r in results
                         if r["method"] == "floor" and r["transform"] == "train"), {})
    summary["floor_train_scale_histogram"] = floor_scales

    report = {"machine": dict(machine(), load_average_at_end=list(os.getloadavg())), "args": {k: v for k, v in vars(args).items() if k != "child"},
              "unavailable": unavailable, "results": results, "summary": summary}
    if not args.no_quality:
        report["quality"] = quality(args, runner)

    # --- the table ---
    t2 = max(threads)
    mach = report["machine"]
    print(f"\n{mach['cpu']} ({mach['simd']}; gpufeed resize kernel {mach['resize_kernel']}), "
          f"{mach['cores']} cores, load average {mach['load_average_at_start'][0]:.1f}"
          f" -> {mach['load_average_at_end'][0]:.1f}; {args.data}; batch {args.batch_size}, "
          f"{args.image_size}px; {args.warmup} warm-up + {args.epochs} timed passes; median of "
          f"{args.rounds} rounds")
    head = f"{'method':10s} {'transform':9s}" + "".join(f" {t:>2d} thr img/s" for t in threads)
    head += f"  {'gpufeed/x':>9s}  {'peak RSS':>9s}"
    print(head)
    for m in methods:
        for tf in transforms_of(m):
            label = "gpufeed-py" if m == "python" else m
            row = f"{label:10s} {tf:9s}" + "".join(
                f" {summary['rates'].get(f'{m}/{tf}/{t}', float('nan')):13.1f}" for t in threads)
            rt = summary["ratios"].get(f"gpufeed/{m}/{tf}/{t2}") if m != "gpufeed" else None
            row += f"  {rt:9.2f}" if rt else f"  {'':9s}"
            row += f"  {summary['memory'].get(f'{m}/{tf}/{t2}', 0) / 2**20:7.0f} MiB"
            print(row)
    for m, why in unavailable.items():
        print(f"{m}: not measured: {why}")
    for k, v in summary["gpufeed_per_sample_us"].items():
        print(f"gpufeed {k} threads per sample: " + ", ".join(f"{s} {v[s]:.0f} us" for s in v))
    for k, v in summary["scaling"].items():
        print(f"thread scaling {k}: {v:.2f}x" if "cpu_time" not in k else
              f"{k.replace('/cpu_time_per_sample_', ': CPU time per sample ')}: {v:.2f}x")
    print(f"RSS growth after the first pass: {summary['rss_growth_after_first_pass'] * 100:.2f}%")
    for tf in TRANSFORMS:
        k = f"gpufeed/floor_cpu_time/{tf}/{t2}"
        if k in summary["ratios"]:
            print(f"CPU time per sample, floor/gpufeed ({tf}, {t2} threads): "
                  f"{summary['ratios'][k]:.3f}")
    if "before" in methods:
        # This build over --before's, per transform: images/s (per-round ratio, median) and CPU
        # time per sample (before's over this build's: above 1 means this build spends less).
        for t in threads:
            parts = []
            for tf in transforms_of("gpufeed"):
                cb = summary["cpu_us_per_sample"].get(f"before/{tf}/{t}")
                cg = summary["cpu_us_per_sample"].get(f"gpufeed/{tf}/{t}")
                parts.append(f"{tf} {summary['ratios'].get(f'gpufeed/before/{tf}/{t}', float('nan')):.3f}x"
                             + (f" (CPU time per sample {cb / cg:.3f}x)" if cb and cg else ""))
            print(f"this build / --before ({args.before}), {t} threads: " + ", ".join(parts))
    if "quality" in report:
        for tf, q in report["quality"].items():
            print(f"quality {tf}: mean |gpufeed - torchvision| {q['mean']:.3f} "
                  f"(median {q['median']:.3f}, p99 {q['p99']:.3f}, max {q['max']:.3f}) "
                  f"over {q['images']} images; by scale " +
                  ", ".join(f"{k}: {v['images']} @ {v['mean']:.2f}" for k, v in q["by_scale"].items()))

    # --- the targets (2 threads, this machine) ---
    r = summary["ratios"]
    targets = [
        ("train >= 2.5x PyTorch DataLoader", r.get(f"gpufeed/pytorch/train/{t2}"), 2.5),
        ("train >= 1.25x DALI CPU", r.get(f"gpufeed/dali/train/{t2}"), 1.25),
        ("train >= 2x LibTorch torch::data", r.get(f"gpufeed/libtorch/train/{t2}"), 2.0),
        ("train >= 90% of the decode floor", r.get(f"gpufeed/floor/train/{t2}"), 0.90),
        ("train above full-size decode rate", r.get(f"gpufeed/full/train/{t2}"), 1.0),
        ("eval >= 2.0x PyTorch DataLoader", r.get(f"gpufeed/pytorch/eval/{t2}"), 2.0),
        ("gpufeed (Python) train within 3% of the C++ loader",
         1 / r[f"gpufeed/python/train/{t2}"] if r.get(f"gpufeed/python/train/{t2}") else None, 0.97),
        ("gpufeed (Python) eval within 3% of the C++ loader",
         1 / r[f"gpufeed/python/eval/{t2}"] if r.get(f"gpufeed/python/eval/{t2}") else None, 0.97),
        (f"{AUGMENTED} (TrivialAugmentWide + RandomErasing 0.1) >= 2.5x PyTorch DataLoader (v2)",
         r.get(f"gpufeed/pytorch/{AUGMENTED}/{t2}"), 2.5),
        (f"augmentation costs <= 15%: gpufeed {AUGMENTED}/train >= 0.85",
         r.get(f"gpufeed/gpufeed/{AUGMENTED}_vs_train/{t2}"), 0.85),
        (f"train {t2} threads >= 1.85x 1 thread",
         summary["scaling"].get(f"gpufeed/train/{t2}v{min(threads)}"), 1.85),
    ]
    summary["targets"] = []
    bounds = {"train >= 2.5x PyTorch DataLoader": r.get(f"floor/pytorch/train/{t2}"),
              "train >= 1.25x DALI CPU": r.get(f"floor/dali/train/{t2}"),
              "train >= 2x LibTorch torch::data": r.get(f"floor/libtorch/train/{t2}"),
              "eval >= 2.0x PyTorch DataLoader": r.get(f"floor/pytorch/eval/{t2}")}
    print("\ntargets:")
    for name, value, bar in targets:
        ok = value is not None and not math.isnan(value) and value >= bar
        bound = bounds.get(name)
        summary["targets"].append({"target": name, "value": value, "met": ok,
                                   "decode_floor_bound": bound})
        print(f"  {'MET ' if ok else 'MISS'} {name}: {value if value is None else round(value, 3)}"
              + (f" (the decode floor alone would reach {bound:.2f})" if bound else ""))
    g = summary["rss_growth_after_first_pass"]
    ok = not math.isnan(g) and g < 0.05
    summary["targets"].append({"target": "RSS growth after the first pass < 5%", "value": g,
                               "met": ok})
    print(f"  {'MET ' if ok else 'MISS'} RSS growth after the first pass < 5%: {g * 100:.2f}%")
    if "quality" in report:
        q = report["quality"]["eval"]["mean"]
        summary["targets"].append({"target": "eval mean |diff| <= 3.0", "value": q,
                                   "met": q <= 3.0})
        print(f"  {'MET ' if q <= 3.0 else 'MISS'} eval mean |gpufeed - torchvision| <= 3.0: {q:.3f}")

    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
        print(f"\nwrote {args.json}")
    if args.ffcv:
        cmd = [sys.executable, str(ROOT / "tools" / "bench" / "bench_ffcv.py"), "--data", args.data, "--threads", str(t2),
               "--batch-size", str(args.batch_size), "--image-size", str(args.image_size), "--epochs",
               str(args.epochs), "--warmup", str(args.warmup), "--rounds", str(args.rounds), "--build", args.build]
        if args.ffcv_python:
            cmd += ["--ffcv-python", args.ffcv_python]
        if args.json:
            cmd += ["--json", str(pathlib.Path(args.json).with_suffix("")) + "-ffcv.json"]
        print("\n" + " ".join(cmd), flush=True)
        return subprocess.run(cmd, cwd=ROOT).returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
