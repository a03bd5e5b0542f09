#!/usr/bin/env python3
"""Multi-crop views (DINOv2's 2 global + 8 local crops) from gpufeed, PyTorch and DALI, in one run.

Same files (--data, a flat folder: the class is the file-name prefix), same CPU threads (--threads
decode threads for gpufeed, worker processes for PyTorch's DataLoader, DALI's num_threads), same
batch size, every method's batches float32 ``[N, 3, S, S]`` per view normalised with ImageNet's
mean/std:

  reference   dinov2's DataAugmentationDINO (facebookresearch/dinov2, dinov2/data/augmentations.py,
              copied below: torchvision on PIL, RandomResizedCrop bicubic + flip, RandomApply(
              ColorJitter(0.4, 0.4, 0.2, 0.1), 0.8), RandomGrayscale(0.2), its GaussianBlur(p)
              (RandomApply with 1 - p), RandomSolarize(128, 0.2) on global 2, ToTensor + Normalize)
              in torch.utils.data.DataLoader(num_workers=T, persistent_workers=True), a collate
              giving a list of [N, 3, S, S] per view (dinov2's collate_data_and_cast then
              concatenates the global and the local ones)
  gpufeed     gpufeed.DataLoader(views="dinov2", local_crops_number=8, num_workers=T)
  dali        DALI's CPU pipeline (device_id=None): readers.file, decoders.image, then per view
              random_resized_crop (INTERP_CUBIC, antialias), color_twist (brightness, contrast,
              saturation, hue with identity values when the 0.8 coin says no; saturation 0 for the
              0.2 grayscale coin: one fused colour transform, DALI's order and arithmetic rather
              than torchvision's random order), gaussian_blur (window 9, sigma 0.1..2) under a per-sample coin
              (conditionals), lookup_table solarize on global 2, crop_mirror_normalize (flip,
              mean/std, CHW float32); its batches stay DALI TensorLists (no torch conversion)

The per-view cost split is gpufeed's rate and CPU time with the 2 global views alone (also the
reference's), the 8 local views alone, and all 10 without the colour ops (geometry: crop, bicubic
resize, flip), plus gpufeed's stats() seconds per sample (read, decode, resize: the resize and the
views' augmentations) and its decodes per sample.
The single-crop rows are the bicubic train transform: gpufeed ``interpolation="bicubic"`` against
torchvision RandomResizedCrop(224, BICUBIC) + RandomHorizontalFlip + ToTensor + Normalize on PIL
in a DataLoader.

Each measurement runs in its own process: --warmup-batches untimed batches, then --batches timed
ones (epochs wrap), samples counted as delivered. Source images/s: each image with all its views.
Also CPU ms per image: the user + system time of the measuring process and its workers over the
timed batches (gpufeed's uint8 -> float conversion on the loop's thread included), which other
load on a shared machine disturbs less than the rate. Ratios are per round, median over rounds.

  PYTHONPATH=build/release/python .venv/bin/python tools/bench/bench_views.py --threads 2
"""
import argparse
import json
import math
import os
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from bench_compare import _files_and_labels, _last_json, _tree, machine, pil_files, run_measured  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# (method, variant): variant names the views (a gpufeed preset name, or a part of dinov2's views)
PLAN = [("reference", "dinov2"), ("gpufeed", "dinov2"), ("dali", "dinov2"),
        ("reference", "global2"), ("gpufeed", "global2"), ("gpufeed", "local8"),
        ("gpufeed", "geometry"), ("reference_single", "bicubic"), ("gpufeed_single", "bicubic")]


# --- the reference: dinov2/data/augmentations.py, as its code runs ---------------------------------


def dinov2_reference(local_crops_number=8, global_crops_scale=(0.32, 1.0), local_crops_scale=(0.05, 0.32),
                     global_crops_size=224, local_crops_size=96, parts=("global", "local")):
    """DataAugmentationDINO of facebookresearch/dinov2: a callable PIL image -> list of view tensors
    (global 1, global 2, then the local crops). `parts` keeps the global or local views only."""
    import torchvision.transforms as T

    class GaussianBlur(T.RandomApply):
        # dinov2's own class: "torchvision is applying 1 - probability to return the original image"
        def __init__(self, *, p=0.5, radius_min=0.1, radius_max=2.0):
            super().__init__(transforms=[T.GaussianBlur(kernel_size=9, sigma=(radius_min, radius_max))], p=1 - p)

    bicubic = T.InterpolationMode.BICUBIC
    geometric_global = T.Compose([T.RandomResizedCrop(global_crops_size, scale=global_crops_scale,
                                                      interpolation=bicubic), T.RandomHorizontalFlip(p=0.5)])
    geometric_local = T.Compose([T.RandomResizedCrop(local_crops_size, scale=local_crops_scale,
                                                     interpolation=bicubic), T.RandomHorizontalFlip(p=0.5)])
    color_jittering = T.Compose([
        T.RandomApply([T.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)], p=0.8),
        T.RandomGrayscale(p=0.2)])
    normalize = T.Compose([T.ToTensor(), T.Normalize(mean=MEAN, std=STD)])
    global_transfo1 = T.Compose([color_jittering, GaussianBlur(p=1.0), normalize])
    global_transfo2 = T.Compose([color_jittering, GaussianBlur(p=0.1), T.RandomSolarize(threshold=128, p=0.2),
                                 normalize])
    local_transfo = T.Compose([color_jittering, GaussianBlur(p=0.5), normalize])

    def __call__(image):
        views = []
        if "global" in parts:
            views += [global_transfo1(geometric_global(image)), global_transfo2(geometric_global(image))]
        if "local" in parts:
            views += [local_transfo(geometric_local(image)) for _ in range(local_crops_number)]
        return views

    return __call__


def dinov2_views(local_crops_number=8):
    """The reference's views in gpufeed.views_preset's keys (what DALI's pipeline is built from)."""
    common = dict(ratio=(3 / 4, 4 / 3), interpolation="bicubic", hflip_p=0.5, color_jitter=(0.4, 0.4, 0.2, 0.1),
                  color_jitter_p=0.8, grayscale_p=0.2, gaussian_blur_kernel=9, gaussian_blur_sigma=(0.1, 2.0),
                  solarize_p=0.0, solarize_threshold=128)
    globals_ = [dict(common, image_size=224, scale=(0.32, 1.0), gaussian_blur_p=p) for p in (0.0, 0.9)]
    globals_[1]["solarize_p"] = 0.2
    return globals_ + [dict(common, image_size=96, scale=(0.05, 0.32), gaussian_blur_p=0.5)] * local_crops_number


def collate_views(samples):
    """[(views, label)] -> ([N, 3, S, S] per view, [N] labels): DINO's batch layout."""
    import torch
    views = [torch.stack([s[0][k] for s in samples]) for k in range(len(samples[0][0]))]
    return views, torch.tensor([s[1] for s in samples])


def cpu_seconds():
    """User + system CPU time of this process and its descendants alive now (DataLoader's
    persistent workers, gpufeed's and DALI's threads): per image, robust to other load."""
    total = 0
    for pid in _tree(os.getpid()):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
        except (OSError, IndexError, ValueError):
            pass
    return total / os.sysconf("SC_CLK_TCK")


def timed(batches, warmup, timed_batches, count, set_epoch=None, on_start=None):
    """Iterates epochs of `batches()` (set_epoch(e) before each) for warmup + timed_batches batches;
    returns {samples, seconds, cpu_seconds} of the timed ones. `count(batch)`: its source images."""
    done, samples, t0, c0, epoch = 0, 0, time.perf_counter(), cpu_seconds(), 0
    while True:
        if set_epoch:
            set_epoch(epoch)
        for batch in batches():
            done += 1
            if done == warmup:
                if on_start:
                    on_start()
                t0, c0 = time.perf_counter(), cpu_seconds()
            elif done > warmup:
                samples += count(batch)
            if done == warmup + timed_batches:
                return {"samples": samples, "seconds": time.perf_counter() - t0, "cpu_seconds": cpu_seconds() - c0}
        epoch += 1


def child_reference(args):
    import torch
    import torchvision.transforms as T

    torch.set_num_threads(1)
    files, labels = _files_and_labels(args.data)
    if args.variant == "bicubic":
        tf = T.Compose([T.RandomResizedCrop(args.image_size, interpolation=T.InterpolationMode.BICUBIC),
                        T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    else:
        tf = dinov2_reference(args.local_crops_number, parts=("global",) if args.variant == "global2" else
                              ("global", "local"))

    loader = torch.utils.data.DataLoader(
        pil_files(files, labels, tf), batch_size=args.batch_size, num_workers=args.threads, persistent_workers=True,
        collate_fn=None if args.variant == "bicubic" else collate_views)
    return timed(lambda: loader, args.warmup_batches, args.batches, lambda b: b[1].shape[0])


def gpufeed_views(variant, local_crops_number):
    """The views= value of a variant: dinov2's preset, a part of it, or it without colour ops."""
    import gpufeed
    if variant == "dinov2":
        return "dinov2"
    views = gpufeed.views_preset("dinov2", local_crops_number=local_crops_number)
    if variant == "global2":
        return views[:2]
    if variant == "local8":
        return views[2:]
    assert variant == "geometry", variant
    return [dict(v, color_jitter_p=0.0, grayscale_p=0.0, gaussian_blur_p=0.0, solarize_p=0.0) for v in views]


def child_gpufeed(args):
    import torch
    import gpufeed

    torch.set_num_threads(1)
    common = dict(batch_size=args.batch_size, num_workers=args.threads, shuffle=False, seed=0,
                  dtype=torch.float32, prefetch_depth=3)
    if args.variant == "bicubic":
        loader = gpufeed.DataLoader(args.data, train=True, image_size=args.image_size, interpolation="bicubic",
                                    **common)
    else:
        views = gpufeed_views(args.variant, args.local_crops_number)
        extra = {"local_crops_number": args.local_crops_number} if views == "dinov2" else {}
        loader = gpufeed.DataLoader(args.data, views=views, **extra, **common)
    before = {}  # stats() counts since the loader started: the difference over the timed batches
    r = timed(lambda: loader, args.warmup_batches, args.batches, lambda b: b[1].shape[0],
              set_epoch=loader.set_epoch, on_start=lambda: before.update(loader.stats()))
    after = loader.stats()
    n = after["samples"] - before.get("samples", 0)
    if n > 0:
        r["per_sample_us"] = {k[:-2]: 1e6 * (after[k] - before.get(k, 0)) / n
                              for k in after if k.endswith("_s") and isinstance(after[k], float)}
        if "decodes" in after:
            r["decodes_per_sample"] = (after["decodes"] - before.get("decodes", 0)) / n
    return r


def child_dali(args):
    from nvidia.dali import fn, pipeline_def, types

    files, labels = _files_and_labels(args.data)
    views = dinov2_views(args.local_crops_number)
    solarized = [x if x < 128 else 255 - x for x in range(256)]  # RandomSolarize(128)

    def coin(p):
        return fn.cast(fn.random.coin_flip(probability=p), dtype=types.FLOAT)

    def jitter(x, v):
        """ColorJitter(b, c, s, h) with p (identity factors when the coin says no), then
        RandomGrayscale as saturation 0: one color_twist (DALI's fixed order, not torchvision's
        random one)."""
        b, c, s, h = v["color_jitter"]
        on, gray = coin(v["color_jitter_p"]), coin(v["grayscale_p"])

        def factor(r):
            return on * fn.random.uniform(range=[1 - r, 1 + r]) + (1 - on)
        hue = on * fn.random.uniform(range=[-360 * h, 360 * h])  # degrees
        return fn.color_twist(x, brightness=factor(b), contrast=factor(c), saturation=factor(s) * (1 - gray),
                              hue=hue)

    @pipeline_def(batch_size=args.batch_size, num_threads=args.threads, device_id=None, prefetch_queue_depth=2,
                  enable_conditionals=True, seed=0)
    def pipe():
        jpegs, label = fn.readers.file(files=files, labels=labels, name="reader")
        images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        outs = []
        for v in views:
            size = v["image_size"]
            x = fn.random_resized_crop(images, size=[size, size], random_area=list(v["scale"]),
                                       random_aspect_ratio=list(v["ratio"]), interp_type=types.INTERP_CUBIC,
                                       antialias=True)
            x = jitter(x, v)
            lo, hi = v["gaussian_blur_sigma"]
            if v["gaussian_blur_p"] > 0:
                if fn.random.coin_flip(probability=v["gaussian_blur_p"]):
                    x = fn.gaussian_blur(x, window_size=v["gaussian_blur_kernel"],
                                         sigma=fn.random.uniform(range=[lo, hi]))
            if v["solarize_p"] > 0:
                if fn.random.coin_flip(probability=v["solarize_p"]):
                    x = fn.lookup_table(x, keys=list(range(256)), values=solarized, dtype=types.UINT8)
            outs.append(fn.crop_mirror_normalize(
                x, dtype=types.FLOAT, output_layout="CHW", mean=[255 * m for m in MEAN],
                std=[255 * s for s in STD], mirror=fn.random.coin_flip(probability=v["hflip_p"])))
        return (*outs, label)

    p = pipe()
    p.build()

    def batches():
        for _ in range(math.ceil(len(files) / args.batch_size)):
            yield p.run()
    # DALI's reader wraps into the next epoch: every batch is full
    return timed(batches, args.warmup_batches, args.batches, lambda b: len(b[-1]))


CHILDREN = {"reference": child_reference, "reference_single": child_reference, "gpufeed": child_gpufeed,
            "gpufeed_single": child_gpufeed, "dali": child_dali}


def measure(args, method, variant):
    cmd = [sys.executable, __file__, "--child", method, "--variant", variant, "--data", args.data,
           "--threads", str(args.threads), "--batch-size", str(args.batch_size), "--local-crops-number",
           str(args.local_crops_number), "--image-size", str(args.image_size), "--warmup-batches",
           str(args.warmup_batches), "--batches", str(args.batches)]
    out, tree_rss, maxrss = run_measured(cmd)
    r = _last_json(out)
    r.update({"method": method, "variant": variant, "images_per_s": r["samples"] / r["seconds"],
              "cpu_ms_per_image": 1e3 * r["cpu_seconds"] / r["samples"],
              "peak_tree_rss_bytes": max(tree_rss, maxrss)})
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "imagenet-sample"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--local-crops-number", type=int, default=8)
    ap.add_argument("--image-size", type=int, default=224, help="the single-crop rows' output side")
    ap.add_argument("--warmup-batches", type=int, default=4)
    ap.add_argument("--batches", type=int, default=28, help="timed batches (28 x 64: 2 epochs of 900 files)")
    ap.add_argument("--rounds", type=int, default=1, help="repetitions of everything, interleaved")
    ap.add_argument("--skip", default="", help="methods to leave out: reference,dali,gpufeed,...")
    ap.add_argument("--json", help="write everything measured here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(CHILDREN[args.child](args)))
        return 0

    skip = set(filter(None, args.skip.split(",")))
    plan = [(m, v) for m, v in PLAN if m not in skip and m.split("_")[0] not in skip]
    results, failed = [], {}
    for rnd in range(args.rounds):
        for m, v in plan:
            try:
                r = measure(args, m, v)
            except RuntimeError as e:
                print(f"bench_views: {m} {v} failed: {e}", file=sys.stderr)
                failed[(m, v)] = str(e).strip().splitlines()[-1][-300:]
                continue
            r["round"] = rnd
            results.append(r)
            print(f"  round {rnd} {m:16s} {v:9s} {r['images_per_s']:8.1f} images/s", file=sys.stderr, flush=True)

    def median_of(m, v, key):
        rs = [r[key] for r in results if r["method"] == m and r["variant"] == v]
        return statistics.median(rs) if rs else float("nan")

    def ratio(m, v, ref_m, ref_v, key="images_per_s"):
        """Median over rounds of the per-round ratio (rounds measured side by side); for CPU time
        the reference's over the method's, so > 1 means faster in both columns."""
        a = {r["round"]: r[key] for r in results if r["method"] == m and r["variant"] == v}
        b = {r["round"]: r[key] for r in results if r["method"] == ref_m and r["variant"] == ref_v}
        rs = [(a[k] / b[k]) if key == "images_per_s" else (b[k] / a[k]) for k in a if k in b]
        return statistics.median(rs) if rs else float("nan")

    mach = machine()
    load = os.getloadavg()
    print(f"\n{mach['cpu']}, {mach['cores']} cores, load average {mach['load_average_at_start'][0]:.1f} "
          f"-> {load[0]:.1f}; {args.data}; {args.threads} threads, batch {args.batch_size}, "
          f"{args.warmup_batches} warm-up + {args.batches} timed batches, median of {args.rounds} round(s)\n")
    k = 2 + args.local_crops_number
    labels = {"dinov2": f"DINOv2 {k} views (2x224 + {args.local_crops_number}x96)",
              "global2": "2 global views (224)", "local8": f"{args.local_crops_number} local views (96)",
              "geometry": f"{k} views, no colour ops", "bicubic": "single crop 224, bicubic + flip"}
    names = {"reference": "PyTorch DataLoader + dinov2 transform (PIL)", "gpufeed": "gpufeed",
             "dali": "DALI CPU", "reference_single": "PyTorch DataLoader + torchvision (PIL)",
             "gpufeed_single": "gpufeed"}
    print("| method | views | source images/s | vs reference | CPU ms per image | vs reference (CPU) | peak RSS |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for m, v in plan:
        if (m, v) in failed:
            print(f"| {names[m]} | {labels[v]} | failed: {failed[(m, v)]} | | | | |")
            continue
        ref = ("reference_single", v) if v == "bicubic" else ("reference", v if v in ("dinov2", "global2") else "dinov2")
        rt, rc = ratio(m, v, *ref), ratio(m, v, *ref, key="cpu_ms_per_image")
        rss = max(r["peak_tree_rss_bytes"] for r in results if r["method"] == m and r["variant"] == v)
        same = (m, v) == ref
        print(f"| {names[m]} | {labels[v]} | {median_of(m, v, 'images_per_s'):.1f} | {'' if same else f'{rt:.2f}x'} | "
              f"{median_of(m, v, 'cpu_ms_per_image'):.2f} | {'' if same else f'{rc:.2f}x'} | {rss / 2**20:.0f} MiB |")
    print()
    for r in results:
        if r["method"] == "gpufeed" and "per_sample_us" in r and r["round"] == 0:
            parts = ", ".join(f"{s} {us:.0f} us" for s, us in r["per_sample_us"].items())
            dec = f"; decodes per sample {r['decodes_per_sample']:.2f}" if "decodes_per_sample" in r else ""
            print(f"gpufeed {labels[r['variant']]}, round 0: stats() per sample {parts}{dec}")
    if "gpufeed" not in skip:
        c = {v: median_of("gpufeed", v, "cpu_ms_per_image") for v in ("dinov2", "global2", "local8", "geometry")}
        print(f"gpufeed per-view split, CPU ms per source image: all {k} views {c['dinov2']:.2f}; 2 global "
              f"{c['global2']:.2f}; {args.local_crops_number} local {c['local8']:.2f}; all {k} without colour ops "
              f"{c['geometry']:.2f} (the colour ops: {100 * (1 - c['geometry'] / c['dinov2']):.0f}% of the CPU time)")
    target = ratio("gpufeed", "dinov2", "reference", "dinov2")
    if not math.isnan(target):
        print(f"target gpufeed DINOv2 >= 5x the reference at {args.threads} threads: {target:.2f}x images/s "
              f"({'met' if target >= 5 else 'missed'}), "
              f"{ratio('gpufeed', 'dinov2', 'reference', 'dinov2', key='cpu_ms_per_image'):.2f}x in CPU time per image")
    print("\ncommand: " + " ".join([os.path.relpath(sys.executable, ROOT) if sys.executable.startswith(str(ROOT))
                                     else sys.executable, os.path.relpath(__file__, ROOT)] + sys.argv[1:]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": dict(mach, load_average_at_end=list(load)), "args": vars(args),
                       "results": results, "failed": {f"{m}/{v}": e for (m, v), e in failed.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
