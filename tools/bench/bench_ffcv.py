#!/usr/bin/env python3
"""gpufeed beside FFCV 1.0.2 and WebDataset + PyTorch's DataLoader, in one run.

Same files (--data, a flat folder or ImageFolder; default ../shared/data/imagenet-sample), same
thread count (--threads, default 2), batch size, output size and train transform
(RandomResizedCrop(224) + horizontal flip, uint8 HWC out) for every method:

  gpufeed-folder  `gpufeed bench` on the folder itself
  gpufeed-shards  `gpufeed bench` on its tar shards (`gpufeed pack`, original bytes)
  wds             webdataset.WebDataset over those shards + torchvision RandomResizedCrop +
                  RandomHorizontalFlip + PILToTensor, torch DataLoader(num_workers=T)
  ffcv-S          FFCV's Loader on a .beton written with setting S (below):
                  RandomResizedCropRGBImageDecoder((224, 224)) + RandomHorizontalFlip + ToTensor,
                  OrderOption.RANDOM, os_cache=True, num_workers=T, after --ffcv-warmup (2)
                  untimed passes (numba compiles the pipeline during the first)
  gpufeed-S       `gpufeed bench` on shards packed with S's maximum side and no more bytes than
                  S's .beton: `gpufeed pack --max-side N --raw-budget B`, B = the .beton's size
                  minus the size of the same pack without raw samples (tools: raw_budget_for);
                  for FFCV's all-JPEG setting also `--reencode` when this gpufeed has it

Settings S (FFCV's RGBImageField; "500-p50-q90" is the one FFCV's ImageNet example publishes):
  500-p50-q90  write_mode="proportion", max_resolution=500, compress_probability=0.50, jpeg_quality=90
  400-p50-q90  the same with max_resolution=400
  jpg-500-q90  write_mode="jpg", max_resolution=500, jpeg_quality=90 (every image a JPEG)

Writers: each .beton is written by FFCV's DatasetWriter(num_workers=T) and each matching pack by
`gpufeed pack --num-workers T`, interleaved, timed (in-process time of the write, and the whole
process's wall time) --write-rounds times.

Every measurement runs in its own process; the whole set runs --rounds times, interleaved, and
ratios are per round (median over rounds): on a shared machine only same-round ratios mean much.
FFCV runs in its own venv (FFCV pins nothing we can share: numba, llvmlite, opencv-python):
--ffcv-python, default .venv-ffcv/bin/python (tools/bench/setup_ffcv.sh makes it); without it the FFCV
rows and the matched packs are skipped with the reason printed.

  .venv/bin/python tools/bench/bench_ffcv.py --json ffcv.json
  .venv/bin/python tools/bench/bench_ffcv.py --rounds 2 --ffcv-python /path/to/venv/bin/python
"""
import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]

SETTINGS = {
    "500-p50-q90": {"write_mode": "proportion", "max_resolution": 500, "compress_probability": 0.50,
                    "jpeg_quality": 90},
    "400-p50-q90": {"write_mode": "proportion", "max_resolution": 400, "compress_probability": 0.50,
                    "jpeg_quality": 90},
    "jpg-500-q90": {"write_mode": "jpg", "max_resolution": 500, "jpeg_quality": 90},
}
SAMPLES_PER_SHARD = 150  # 900 samples -> 6 equal shards: webdataset splits shards over workers
# What pack's manifest.json may grow by between the pack without raw samples and the one with
# them (the raw counts and budget are a few more digits): kept out of the raw budget.
MANIFEST_SLACK = 4096


def raw_budget_for(target_bytes, base_shard_bytes, base_manifest_bytes, slack=MANIFEST_SLACK):
    """The --raw-budget (extra bytes) that keeps a pack's shards + manifest.json within
    target_bytes, given the same pack without raw samples (its shards' and manifest's bytes).
    pack guarantees shards <= base shards + budget; the manifest gets `slack` bytes of room.
    0 when the pack without raw samples already takes target_bytes or more (no raw samples)."""
    return max(0, int(target_bytes) - int(base_shard_bytes) - int(base_manifest_bytes) - int(slack))


def pack_bytes(out_dir):
    """(bytes of the shards, bytes of manifest.json) of a pack in out_dir, from its manifest."""
    manifest = pathlib.Path(out_dir) / "manifest.json"
    with open(manifest) as f:
        m = json.load(f)
    return sum(s["bytes"] for s in m["shards"]), manifest.stat().st_size


def files_and_labels(data):
    """A flat folder (class = file-name prefix up to '_', as gpufeed's FlatFolder) or an
    ImageFolder (class = sub-folder), sorted as gpufeed lists them."""
    exts = (".jpg", ".jpeg", ".png")
    names = sorted(os.listdir(data))
    if any(os.path.isdir(os.path.join(data, n)) for n in names):
        classes = [n for n in names if os.path.isdir(os.path.join(data, n))]
        files, labels = [], []
        for k, c in enumerate(classes):
            for dirpath, _, fnames in sorted(os.walk(os.path.join(data, c))):
                for n in sorted(fnames):
                    if n.lower().endswith(exts):
                        files.append(os.path.join(dirpath, n))
                        labels.append(k)
        return files, labels
    names = [n for n in names if n.lower().endswith(exts)]
    prefixes = [n.split("_", 1)[0] if "_" in n else os.path.splitext(n)[0] for n in names]
    index = {c: i for i, c in enumerate(sorted(set(prefixes)))}
    return [os.path.join(data, n) for n in names], [index[p] for p in prefixes]


# --- children: FFCV's writer and loader (in FFCV's venv), webdataset (in the project's venv) ------


class PilFiles:
    """What FFCV's writer reads (an indexed dataset of (PIL RGB image, int)); module level so the
    writer's worker processes can pickle it."""

    def __init__(self, data):
        self.files, self.labels = files_and_labels(data)

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        from PIL import Image
        with open(self.files[i], "rb") as f:
            return Image.open(f).convert("RGB"), self.labels[i]


def child_ffcv_write(a):
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    t0 = time.perf_counter()
    ds = PilFiles(a.data)
    writer = DatasetWriter(a.path, {"image": RGBImageField(**json.loads(a.setting)), "label": IntField()},
                           num_workers=a.threads)
    writer.from_indexed_dataset(ds)
    seconds = time.perf_counter() - t0
    return {"samples": len(ds), "seconds": seconds, "images_per_s": len(ds) / seconds,
            "bytes": os.path.getsize(a.path)}


def _timed_passes(batches, warmup, epochs, count):
    """Runs warmup + epochs passes of batches() (a fresh iterator per pass); returns the timed
    passes' samples, wall seconds and process CPU seconds (all threads)."""
    samples = 0
    t0 = c0 = None
    for e in range(warmup + epochs):
        if e == warmup:
            t0, c0 = time.perf_counter(), time.process_time()
        for b in batches():
            if e >= warmup:
                samples += count(b)
    return samples, time.perf_counter() - t0, time.process_time() - c0


def child_ffcv_load(a):
    from ffcv.fields.decoders import IntDecoder, RandomResizedCropRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.transforms import RandomHorizontalFlip, ToTensor

    s = a.image_size
    loader = Loader(a.path, batch_size=a.batch_size, num_workers=a.threads, order=OrderOption.RANDOM,
                    os_cache=True, pipelines={
                        "image": [RandomResizedCropRGBImageDecoder((s, s)), RandomHorizontalFlip(), ToTensor()],
                        "label": [IntDecoder()]})
    first = None
    if a.warmup:  # the first pass compiles (numba): report it apart
        t = time.perf_counter()
        for _ in loader:
            pass
        first = time.perf_counter() - t
    samples, seconds, cpu = _timed_passes(lambda: loader, max(0, a.warmup - 1), a.epochs, lambda b: b[0].shape[0])
    return {"samples": samples, "seconds": seconds, "images_per_s": samples / seconds,
            "cpu_us_per_sample": 1e6 * cpu / samples, "first_pass_s": first}


def child_wds(a):
    import warnings

    import torch
    import torchvision.transforms as T
    import webdataset as wds

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    s = a.image_size
    tf = T.Compose([T.RandomResizedCrop(s), T.RandomHorizontalFlip(), T.PILToTensor()])
    ds = (wds.WebDataset(a.path, shardshuffle=False, empty_check=False).decode("pil")
          .to_tuple("jpg;png;ppm", "cls").map_tuple(tf, int))
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, num_workers=a.threads, pin_memory=True,
                                         persistent_workers=a.threads > 0)
    samples, seconds, _ = _timed_passes(lambda: loader, a.warmup, a.epochs, lambda b: b[0].shape[0])
    return {"samples": samples, "seconds": seconds, "images_per_s": samples / seconds}


# --- the parent -------------------------------------------------------------------------------------


def run(cmd, env=None):
    """Runs cmd, returns (stdout, wall seconds, child CPU seconds); raises with stderr on failure."""
    t0 = time.perf_counter()
    r0 = os.times()
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    r1 = os.times()
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p.stdout, wall, (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system)


def last_json(text):
    return json.loads(text[text.index("{"):])


def ffcv_unavailable(python):
    """None when `python` imports ffcv, else the reason (printed when the FFCV rows are skipped)."""
    if not python or not pathlib.Path(python).exists():
        return (f"no FFCV venv at {python} (tools/bench/setup_ffcv.sh creates .venv-ffcv with ffcv==1.0.2; "
                f"or pass --ffcv-python)")
    p = subprocess.run([str(python), "-c", "import ffcv, importlib.metadata as m; print(m.version('ffcv'))"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return f"{python} cannot import ffcv: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}"
    return None


class Bench:
    def __init__(self, a):
        self.a = a
        self.gpufeed = pathlib.Path(a.build) / "tools" / "gpufeed"
        self.work = pathlib.Path(a.work)

    def pack(self, out, extra):
        a = self.a
        cmd = [self.gpufeed, "pack", a.data, out, "--shard-size", "1e9", "--max-samples-per-shard",
               str(SAMPLES_PER_SHARD), "--num-workers", str(a.threads), "--progress", "off", "--overwrite",
               "--index-cache", "off"] + extra
        out_text, wall, cpu = run(cmd)
        with open(pathlib.Path(out) / "manifest.json") as f:
            m = json.load(f)
        shards, manifest = pack_bytes(out)
        summary = out_text.strip().splitlines()[0]
        # "..., 1.97 s, 457.1 images/s": pack_dataset's own time, without the CLI's start-up.
        secs = float(summary.rsplit(",", 2)[-2].split()[0])
        # cpu_s: the whole process's CPU time (LibTorch's loading included: about 0.3 s here).
        return {"command": " ".join(map(str, cmd)), "wall_s": wall, "seconds": secs, "cpu_s": cpu,
                "images_per_s": m["totals"]["samples"] / secs, "bytes": shards + manifest,
                "shard_bytes": shards, "manifest_bytes": manifest, "totals": m["totals"],
                "data": str(pathlib.Path(out) / m["pattern"]), "summary": summary}

    def bench(self, data):
        a = self.a
        cmd = [self.gpufeed, "bench", "--data", data, "--num-workers", str(a.threads), "--batch-size",
               str(a.batch_size), "--image-size", str(a.image_size), "--epochs", str(a.epochs), "--warmup",
               str(a.warmup), "--seed", "0", "--json", "--index-cache", "off"]
        out, _, _ = run(cmd)
        r = last_json(out)
        return {k: r[k] for k in ("images_per_s", "cpu_us_per_sample", "per_sample_us", "samples", "seconds",
                                  "bytes_read", "decoded_pixels") if k in r}

    def child(self, python, kind, path, extra=()):
        a = self.a
        cmd = [python, __file__, "--child", kind, "--path", path, "--data", a.data, "--threads", str(a.threads),
               "--batch-size", str(a.batch_size), "--image-size", str(a.image_size), "--epochs", str(a.epochs),
               "--warmup", str(a.warmup)] + list(extra)
        out, wall, _ = run(cmd)
        r = last_json(out)
        r["wall_s"] = wall
        return r


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "imagenet-sample"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--epochs", type=int, default=3, help="timed passes per measurement")
    ap.add_argument("--warmup", type=int, default=1, help="untimed passes before them (gpufeed, webdataset)")
    ap.add_argument("--ffcv-warmup", type=int, default=2, help="untimed passes for FFCV (numba compiles in the first)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved repetitions of the loaders")
    ap.add_argument("--write-rounds", type=int, default=1, help="interleaved repetitions of the writers")
    ap.add_argument("--settings", default=",".join(SETTINGS), help="FFCV settings to run: " + ",".join(SETTINGS))
    ap.add_argument("--skip", default="", help="methods to leave out: wds,ffcv,shards")
    ap.add_argument("--build", default=str(ROOT / "build" / "release"))
    ap.add_argument("--ffcv-python", default=os.environ.get("GPUFEED_FFCV_PYTHON", str(ROOT / ".venv-ffcv" / "bin" / "python")))
    ap.add_argument("--work", default="/tmp/gpufeed_bench_ffcv", help="where the .beton files and shards go (removed first)")
    ap.add_argument("--keep", action="store_true", help="keep --work afterwards")
    ap.add_argument("--json", help="write everything measured here")
    ap.add_argument("--self-test", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--path", help=argparse.SUPPRESS)
    ap.add_argument("--setting", help=argparse.SUPPRESS)
    a = ap.parse_args()

    if a.self_test:
        return self_test()
    if a.child:
        r = {"ffcv-write": child_ffcv_write, "ffcv-load": child_ffcv_load, "wds": child_wds}[a.child](a)
        print(json.dumps(r))
        return 0

    b = Bench(a)
    if not b.gpufeed.exists():
        sys.exit(f"bench_ffcv: {b.gpufeed} is missing: build it first (./setup.sh)")
    skip = set(filter(None, a.skip.split(",")))
    settings = [s for s in a.settings.split(",") if s]
    for s in settings:
        if s not in SETTINGS:
            sys.exit(f"bench_ffcv: unknown setting {s} (known: {', '.join(SETTINGS)})")
    unavailable = {}
    if "ffcv" not in skip:
        why = ffcv_unavailable(a.ffcv_python)
        if why:
            unavailable["ffcv"] = why
            print(f"bench_ffcv: FFCV rows skipped: {why}", file=sys.stderr)
    if "wds" not in skip:
        try:
            import webdataset  # noqa: F401
        except ImportError as e:
            unavailable["wds"] = f"webdataset is not installed in {sys.executable} ({e})"
    with_ffcv = "ffcv" not in skip and "ffcv" not in unavailable
    pack_help = run([b.gpufeed, "pack", "--help"])[0]
    has_reencode = "--reencode" in pack_help
    load0 = os.getloadavg()
    t_start = time.perf_counter()

    if b.work.exists():
        shutil.rmtree(b.work)
    b.work.mkdir(parents=True)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    # --- writers: FFCV's DatasetWriter and gpufeed pack, interleaved -----------------------------------
    writes = []  # {"writer", "setting", "round", ...}
    plain = None
    for rnd in range(a.write_rounds):
        r = b.pack(b.work / "shards", [])
        plain = r
        writes.append(dict(r, writer="gpufeed pack", setting="original", round=rnd))
        log(f"  write round {rnd} gpufeed pack (original bytes): {r['images_per_s']:.1f} images/s, {r['bytes'] / 1e6:.1f} MB")
        if not with_ffcv:
            continue
        for s in settings:
            cfg = SETTINGS[s]
            beton = b.work / f"{s}.beton"
            r = b.child(a.ffcv_python, "ffcv-write", beton, ["--setting", json.dumps(cfg)])
            writes.append(dict(r, writer="ffcv DatasetWriter", setting=s, round=rnd, path=str(beton)))
            log(f"  write round {rnd} ffcv {s}: {r['images_per_s']:.1f} images/s, {r['bytes'] / 1e6:.1f} MB")
            side = ["--max-side", str(cfg["max_resolution"])]
            if cfg["write_mode"] == "jpg" and has_reencode:
                side += ["--reencode", "--quality", str(cfg["jpeg_quality"])]
            base = b.pack(b.work / f"{s}.base", side)
            writes.append(dict(base, writer="gpufeed pack (no raw)", setting=s, round=rnd))
            budget = raw_budget_for(r["bytes"], base["shard_bytes"], base["manifest_bytes"])
            extra = side + (["--raw-budget", str(budget)] if budget > 0 else [])
            m = b.pack(b.work / f"{s}.gpufeed", extra)
            m["raw_budget"] = budget
            writes.append(dict(m, writer="gpufeed pack (matched)", setting=s, round=rnd))
            log(f"  write round {rnd} gpufeed pack {' '.join(extra)}: {m['images_per_s']:.1f} images/s, "
                f"{m['bytes'] / 1e6:.1f} MB ({m['totals'].get('raw', 0)} raw)")

    # --- loaders, interleaved rounds -----------------------------------------------------------------
    plan = [("gpufeed-folder", lambda: b.bench(a.data))]
    if "shards" not in skip:
        plan.append(("gpufeed-shards", lambda: b.bench(plain["data"])))
    if "wds" not in skip and "wds" not in unavailable:
        plan.append(("wds", lambda: b.child(sys.executable, "wds", plain["data"])))
    if with_ffcv:
        for s in settings:
            beton = b.work / f"{s}.beton"
            packed = [w for w in writes if w["writer"] == "gpufeed pack (matched)" and w["setting"] == s][-1]
            plan.append((f"ffcv-{s}", lambda beton=beton: b.child(
                a.ffcv_python, "ffcv-load", beton, ["--warmup", str(a.ffcv_warmup)])))
            plan.append((f"gpufeed-{s}", lambda d=packed["data"]: b.bench(d)))
    results = []
    for rnd in range(a.rounds):
        for name, fn in plan:
            try:
                r = fn()
            except RuntimeError as e:
                log(f"bench_ffcv: {name} failed: {e}")
                unavailable.setdefault(name, str(e)[-500:])
                continue
            r.update(method=name, round=rnd)
            results.append(r)
            log(f"  round {rnd} {name:22s} {r['images_per_s']:8.1f} images/s")

    def rates(m):
        return {r["round"]: r["images_per_s"] for r in results if r["method"] == m}

    def ratio(num, den):
        x, y = rates(num), rates(den)
        return median([x[k] / y[k] for k in x if k in y])

    def final_write(writer, setting):
        ws = [w for w in writes if w["writer"] == writer and w["setting"] == setting]
        return ws[-1] if ws else None

    def write_rate(writer, setting):
        return median([w["images_per_s"] for w in writes if w["writer"] == writer and w["setting"] == setting])

    rows = []
    for name, _ in plan:
        rs = [r for r in results if r["method"] == name]
        if not rs:
            continue
        row = {"method": name, "images_per_s": median([r["images_per_s"] for r in rs]),
               "per_round": [r["images_per_s"] for r in rs],
               "cpu_us_per_sample": median([r.get("cpu_us_per_sample") for r in rs])}
        if "per_sample_us" in rs[0]:
            row["per_sample_us"] = {k: median([r["per_sample_us"][k] for r in rs]) for k in rs[0]["per_sample_us"]}
        if name == "gpufeed-folder":
            row["bytes"] = sum(os.path.getsize(f) for f in files_and_labels(a.data)[0])
        elif name in ("gpufeed-shards", "wds"):
            row["bytes"] = plain["bytes"]
        elif name.startswith("ffcv-"):
            row["bytes"] = final_write("ffcv DatasetWriter", name[5:])["bytes"]
            row["first_pass_s"] = median([r.get("first_pass_s") for r in rs])
        else:
            w = final_write("gpufeed pack (matched)", name[8:])
            row.update(bytes=w["bytes"], raw=w["totals"].get("raw", 0), reencoded=w["totals"].get("reencoded", 0),
                       raw_budget=w["raw_budget"], pack_command=w["command"])
        rows.append(row)

    targets = [("gpufeed shards / gpufeed folder >= 0.97", ratio("gpufeed-shards", "gpufeed-folder"), 0.97, None)]
    if rates("wds"):
        targets.append(("gpufeed shards / webdataset + DataLoader >= 2.5", ratio("gpufeed-shards", "wds"), 2.5, None))
    if with_ffcv:
        for s in settings:
            bytes_ok = None
            g, f = final_write("gpufeed pack (matched)", s), final_write("ffcv DatasetWriter", s)
            if g and f:
                bytes_ok = g["bytes"] <= f["bytes"]
            targets.append((f"gpufeed / FFCV {s} >= 1.5 (no more disk bytes)", ratio(f"gpufeed-{s}", f"ffcv-{s}"), 1.5,
                            bytes_ok))
            targets.append((f"gpufeed pack / FFCV writer {s} >= 2 (images/s)",
                            (write_rate("gpufeed pack (matched)", s) or 0) / (write_rate("ffcv DatasetWriter", s) or 1)
                            if write_rate("ffcv DatasetWriter", s) else None, 2.0, None))

    load1 = os.getloadavg()
    mach = machine()
    print(f"\n{mach['cpu']} ({mach['simd']}), {os.cpu_count()} cores; load average {load0[0]:.2f} -> "
          f"{load1[0]:.2f}; {a.data}; {a.threads} threads, batch {a.batch_size}, {a.image_size}px train; "
          f"{a.warmup} warm-up (FFCV {a.ffcv_warmup}) + {a.epochs} timed passes; median of {a.rounds} rounds; "
          f"{time.perf_counter() - t_start:.0f} s")
    print(f"{'method':22s} {'img/s':>8s} {'per round':>22s} {'MB':>7s} {'CPU us/img':>10s}  notes")
    for row in rows:
        notes = ""
        if "per_sample_us" in row:
            notes = "read/decode/resize us " + "/".join(f"{row['per_sample_us'][k]:.0f}" for k in ("read", "decode", "resize"))
        if "raw" in row:
            notes += f"; {row['raw']} raw, {row['reencoded']} re-encoded"
        if row.get("first_pass_s"):
            notes += f"first pass (numba) {row['first_pass_s']:.1f} s"
        cpu = f"{row['cpu_us_per_sample']:.0f}" if row.get("cpu_us_per_sample") else ""
        print(f"{row['method']:22s} {row['images_per_s']:8.1f} {'/'.join(f'{x:.0f}' for x in row['per_round']):>22s} "
              f"{row['bytes'] / 1e6:7.1f} {cpu:>10s}  {notes}")
    # (No CPU time for FFCV's writer: its worker processes are not reaped into RUSAGE_CHILDREN.)
    print("\nwriters (images/s and seconds of the write itself; the whole process's wall time; gpufeed: "
          "the whole process's CPU time per image; MB written):")
    for w in writes:
        n = w["totals"]["samples"] if "totals" in w else w["samples"]
        cpu = f"{1e6 * w['cpu_s'] / n:6.0f} CPU us/img" if w.get("cpu_s") else ""
        print(f"  round {w['round']} {w['writer']:24s} {w['setting']:12s} {w['images_per_s']:7.1f} img/s "
              f"({w['seconds']:.2f} s; process {w['wall_s']:.2f} s) {cpu} {w['bytes'] / 1e6:7.1f} MB")
    for m, why in unavailable.items():
        print(f"{m}: not measured: {why}")
    print("\ntargets:")
    out_targets = []
    for name, value, bar, bytes_ok in targets:
        ok = value is not None and value >= bar and bytes_ok is not False
        out_targets.append({"target": name, "value": value, "met": ok, "bytes_not_more": bytes_ok})
        extra = "" if bytes_ok is None else (" (bytes <= .beton)" if bytes_ok else " (MORE bytes than the .beton)")
        status = "MET " if ok else "--  " if value is None else "MISS"
        print(f"  {status} {name}: {'not measured' if value is None else f'{value:.2f}'}{extra}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"machine": dict(mach, load_average_at_start=load0, load_average_at_end=load1),
                       "args": {k: v for k, v in vars(a).items() if k not in ("child", "path", "setting")},
                       "unavailable": unavailable, "writes": writes, "results": results, "rows": rows,
                       "targets": out_targets}, f, indent=1)
        print(f"\nwrote {a.json}")
    if not a.keep:
        shutil.rmtree(b.work, ignore_errors=True)
    return 0


def machine():
    cpu, flags = "unknown", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and cpu == "unknown":
                    cpu = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    simd = "AVX-512" if "avx512f" in flags else "AVX2 only" if "avx2" in flags else "no AVX2"
    return {"cpu": cpu, "simd": simd, "cores": os.cpu_count()}


def self_test():
    """Checks of the byte matching (no gpufeed, no FFCV needed): ctest's bench_ffcv_selftest."""
    import tempfile
    # The budget keeps shards + manifest within the target, with the manifest's slack.
    assert raw_budget_for(285_000_000, 97_000_000, 15_000) == 285_000_000 - 97_000_000 - 15_000 - MANIFEST_SLACK
    assert raw_budget_for(100, 97, 15) == 0  # the plain pack is already larger: no raw samples
    assert raw_budget_for(97_000_000 + 15_000 + MANIFEST_SLACK, 97_000_000, 15_000) == 0
    # pack's guarantee: shards <= base shards + budget; the manifest grows by less than the slack.
    for target, base, man in [(285_123_456, 100_900_000, 14_663), (176_000_000, 80_000_000, 14_700)]:
        budget = raw_budget_for(target, base, man)
        assert base + budget + man + MANIFEST_SLACK == target
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump({"shards": [{"file": "train-000000.tar", "samples": 2, "bytes": 10240},
                                  {"file": "train-000001.tar", "samples": 1, "bytes": 5120}]}, f)
        assert pack_bytes(d) == (15360, os.path.getsize(os.path.join(d, "manifest.json")))
        # The flat-folder and ImageFolder listings (labels as gpufeed's FlatFolder / ImageFolder).
        for n in ("n02_b.JPEG", "n01_a.jpg", "n01_c.png", "notes.txt"):
            open(os.path.join(d, n), "w").close()
        files, labels = files_and_labels(d)
        assert [os.path.basename(f) for f in files] == ["n01_a.jpg", "n01_c.png", "n02_b.JPEG"], files
        assert labels == [0, 0, 1], labels
        tree = os.path.join(d, "tree")
        for c, n in [("cat", "x.jpg"), ("dog", "y.jpeg"), ("cat", "w.JPEG")]:
            os.makedirs(os.path.join(tree, c), exist_ok=True)
            open(os.path.join(tree, c, n), "w").close()
        files, labels = files_and_labels(tree)
        assert [os.path.relpath(f, tree) for f in files] == ["cat/w.JPEG", "cat/x.jpg", "dog/y.jpeg"], files
        assert labels == [0, 0, 1]
    assert "ffcv" in ffcv_unavailable("/nonexistent/bin/python")
    print("bench_ffcv self-test: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
