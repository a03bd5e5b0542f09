#!/usr/bin/env python3
"""gpufeed reading tar shards from local disk, over HTTP and over S3, beside WebDataset streaming
the same shards over HTTP and MosaicML streaming reading the same samples from S3, with added
per-request latency, in one run.

Same shards (``gpufeed pack`` output with its ``.gpufeed-idx`` indexes), batch size, output size,
train transform (RandomResizedCrop + horizontal flip, uint8 out) and worker count for every row:

  local       gpufeed.DataLoader on the shards on local disk (page cache warm after the first pass)
  http        gpufeed.DataLoader on http://.../train-{000000..000005}.tar served by nginx
              (tests/remote_servers.NginxServer) through a LatencyProxy adding L ms per request,
              in the default order for remote shards (shuffle_order auto = shards: whole shards,
              one GET each, a window of 8 shards mixed; docs/DATASETS.md, "Shuffle order")
  http-exact  the same with shuffle_order="exact" and remote_read="samples": DistributedSampler's
              order, one ranged GET per sample (what remote_read auto takes for that order once
              it spans more shards than remote_shards_in_flight, 16: on fewer it holds them all)
  http-direct the same straight from nginx (no proxy): what the proxy itself costs, at latency 0
  s3          gpufeed.DataLoader on s3://bucket/shards/train-{...}.tar from moto's S3 server
              (MotoS3, filled with boto3 uploads of the pack output) through a LatencyProxy
  wds         webdataset.WebDataset("pipe:curl -s URL") over the same shard URLs, through the
              same LatencyProxy in front of nginx at the same latency, decoded with PIL +
              torchvision RandomResizedCrop + RandomHorizontalFlip + PILToTensor (uint8), torch
              DataLoader(num_workers, persistent_workers=True), the same batch size
  streaming   MosaicML streaming's StreamingDataset (mosaicml-streaming 0.13.0, in its own venv:
              --streaming-python) over the same samples rewritten as MDS shards, read from
              s3://bucket/mds on moto's S3 server through a LatencyProxy at the same latency, in
              the same torch DataLoader with the same decode and transform as wds

gpufeed runs with shuffle=True and set_epoch each epoch. In the shard-aware order (http, s3) it
fetches whole shards, up to remote_shards_in_flight (16) at once, the next window while the
current one decodes; in the exact order (http-exact) every sample is a separate ranged GET,
issued ahead in the sampler's order up to --max-requests in flight and --read-ahead MiB ahead.
The shards are packed with ``gpufeed pack --shuffle`` (samples in a seeded random order, as
webdataset and MosaicML streaming advise), so the shard-aware order's batches mix classes as the
exact order's do. WebDataset streams each shard with
one GET (in shard order, shards split over its workers), so latency costs it one round trip per
shard. Every configuration runs in its own child process (``--one``: its VmHWM, the peak RSS, is
that configuration's; for wds the sum over the child and its DataLoader workers). The servers
and proxies run in this (parent) process (nginx in its own); their CPU time during each run is
reported as "srv cpu" (seconds per epoch: the proxy and moto, plus nginx), since on a small
machine it comes out of the loader's CPUs. moto's server is pure Python and may itself be the
limit of the s3 rows: their rate is printed as measured, with no target.

MosaicML streaming reads no http(s): its downloaders (streaming/base/storage/download.py) take
s3, gs, oci, azure, azure-dl, hf, sftp, dbfs, dbfs-uc (Unity Catalog), alipan and local paths.
So its row reads S3 from the same MotoS3 as the s3 rows (one is started for it under --skip s3),
through a LatencyProxy of its own (S3_ENDPOINT_URL and AWS_ENDPOINT_URL point at it), not nginx:
compare it with the s3 rows for the same server, with the http rows for the target. The parent
writes the MDS shards with streaming's MDSWriter (columns jpg: bytes, cls: int) from the pack
output: the same samples in the same order, the same JPEG bytes and labels. Its size_limit is
the smallest that splits them into as many MDS shards as there are tar shards (so MDS shards
hold about as many bytes as the tar shards; their sample counts differ a little). The child
opens StreamingDataset(remote=s3://..., local=<a fresh temporary folder per run>, shuffle=True,
shuffle_algo 'py1e' (the default), batch_size) in a torch DataLoader(num_workers,
persistent_workers=True) with wds's decode (PIL, RandomResizedCrop, RandomHorizontalFlip,
PILToTensor). streaming downloads each shard whole into its local folder (boto3 download_file:
a HEAD and a GET) the first time a sample of it is read, and reads samples from there; a second
pass would read the local copies without a request. As gpufeed keeps no disk cache (it holds
shards in memory and reads them again each pass), every timed streaming pass starts from an
empty cache: after each pass the parent process evicts every shard (StreamingDataset.evict_shard,
which updates the workers' shared shard states), outside the timing. Its requests and bytes per
pass are the proxy's (the open's index.json, 2 requests, included); peak RSS sums the child's
and its workers' VmHWM, as for wds.

Each configuration runs --epochs passes per round, --rounds rounds (the whole set again,
interleaved: on a shared machine its load then falls on every configuration alike); the table
gives the best pass's rate (and the mean and the spread, min..max, over all passes). Targets
(PASS/FAIL): at 50 ms, gpufeed http >= 0.9 x gpufeed local, >= 3 x wds and >= 1.5 x streaming,
and its requests per pass <= 2 x the shards. "MB/pass" is what the proxy passed per pass
(response bodies), "x data" that over the shards' bytes: the egress in copies of the dataset. At L ms per request
gpufeed completes at most max_requests / L requests per second (128 / 50 ms: 2560 samples/s),
printed beside the targets.

  .venv/bin/python tools/bench/bench_remote.py
  .venv/bin/python tools/bench/bench_remote.py --epochs 3 --latencies 0,10,50 --out remote.json
  .venv/bin/python tools/bench/bench_remote.py --shards /path/to/pack/output --skip s3

The package is the build's (build/release/python, --build); without --shards, --data is packed
into a temporary folder with ``gpufeed pack --shard-size 20000000`` (and --samples-per-shard,
so WebDataset's workers get equal shares).

streaming's venv: --streaming-python, by default build-streaming/venv/bin/python; when that is
missing the bench creates it (python3 -m venv, then pip install mosaicml-streaming==0.13.0
pillow torch==2.11.0 torchvision==0.26.0 from PyPI: about 5.6 GB with torch's CUDA libraries,
a few minutes; the log in build-streaming/pip.log). It is not the project's venv because
streaming pins numpy < 2.2 and pulls cloud SDKs (boto3, google-cloud-storage, azure, oci,
paramiko) and transformers. When it cannot be had (offline) the streaming row is skipped with
the reason printed.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
TESTS = ROOT / "python" / "tests"
DEFAULT_DATA = pathlib.Path("/work/shared/data/imagenet-sample")
BUCKET = "gpufeed-bench"
S3_PREFIX = "shards"
TARGET_LATENCY_MS = 50.0
TARGET_VS_LOCAL = 0.9
TARGET_VS_WDS = 3.0
TARGET_VS_STREAMING = 1.5
MDS_PREFIX = "mds"
STREAMING_VENV = ROOT / "build-streaming" / "venv"
# streaming's own pins (numpy < 2.2) are not the project's; torch is the project's (setup.sh).
STREAMING_SPEC = ["mosaicml-streaming==0.13.0", "pillow", "torch==2.11.0", "torchvision==0.26.0"]


# --- memory ----------------------------------------------------------------------------------------

def _vm_hwm_kib(pid: int | str = "self") -> int:
    """VmHWM (peak resident set) of a process, KiB; 0 when unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _child_pids(pid: int | str = "self") -> list[int]:
    """The direct children of a process (every thread's), from /proc."""
    out = []
    base = f"/proc/{pid}/task"
    try:
        for tid in os.listdir(base):
            try:
                with open(f"{base}/{tid}/children") as f:
                    out += [int(p) for p in f.read().split()]
            except OSError:
                pass
    except OSError:
        pass
    return sorted(set(out))


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, seconds; 0 when unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _workers_hwm_cpu() -> tuple[int, float]:
    """(sum of VmHWM KiB, sum of CPU s) over this process's children (DataLoader workers)."""
    pids = _child_pids()
    return sum(_vm_hwm_kib(p) for p in pids), sum(_proc_cpu_s(p) for p in pids)


# --- children: one configuration each -------------------------------------------------------------

def child_gpufeed(a, cfg: dict) -> dict:
    import torch

    import gpufeed

    kw = dict(batch_size=a.batch_size, num_workers=a.num_workers, image_size=a.image_size,
              dtype=torch.uint8, index_cache="off", shuffle=True)
    for k in ("shuffle_order", "remote_read"):
        if cfg.get(k):
            kw[k] = cfg[k]
    if cfg["remote"]:
        kw.update(max_requests=a.max_requests, read_ahead=a.read_ahead)
    t0 = time.perf_counter()
    loader = gpufeed.DataLoader(cfg["root"], **kw)
    open_s = time.perf_counter() - t0
    opened = dict(loader.stats().get("remote", {}))
    hwm_open = _vm_hwm_kib()
    epochs = []
    c0 = os.times()
    for e in range(a.epochs):
        loader.set_epoch(e)
        n = 0
        t0 = time.perf_counter()
        for images, _labels in loader:
            n += images.shape[0]
            del images, _labels
        epochs.append({"samples": n, "seconds": time.perf_counter() - t0})
    c1 = os.times()
    stats = loader.stats()
    return {"epochs": epochs, "open_s": open_s, "vm_hwm_kib": _vm_hwm_kib(), "vm_hwm_open_kib": hwm_open,
            "cpu_s": (c1.user + c1.system) - (c0.user + c0.system),
            "num_samples": len(loader.samples), "remote_open": opened, "remote": dict(stats.get("remote", {})),
            "stats": {k: v for k, v in stats.items() if isinstance(v, (int, float, str))}}


def child_wds(a, cfg: dict) -> dict:
    import webdataset as wds

    tf = _train_transform(a.image_size)
    ds = (wds.WebDataset(cfg["root"], shardshuffle=False, empty_check=False).decode("pil")
          .to_tuple("jpg;jpeg;png;ppm", "cls").map_tuple(tf, int))
    return _time_torch_loader(a, ds)


def _time_torch_loader(a, ds, after_pass=lambda: {}) -> dict:
    """--epochs timed passes of a torch DataLoader(ds, num_workers, persistent_workers) in this
    process; after_pass() runs after each pass, untimed, and returns fields for its entry."""
    import warnings

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    loader = torch.utils.data.DataLoader(ds, batch_size=a.batch_size, num_workers=a.num_workers,
                                         persistent_workers=a.num_workers > 0)
    epochs = []
    workers_hwm = 0
    c0 = os.times()
    for _ in range(a.epochs):
        n = 0
        t0 = time.perf_counter()
        for images, _labels in loader:
            n += images.shape[0]
        epochs.append({"samples": n, "seconds": time.perf_counter() - t0, **after_pass()})
        # The DataLoader's workers (persistent: alive between passes); wds's curl children are small.
        workers_hwm = max(workers_hwm, _workers_hwm_cpu()[0])
    c1 = os.times()
    # The workers' CPU (wds's curl children's is not counted: streaming a shard costs curl little).
    workers_cpu = _workers_hwm_cpu()[1]
    own = _vm_hwm_kib()
    return {"epochs": epochs, "vm_hwm_kib": own + workers_hwm, "vm_hwm_self_kib": own,
            "vm_hwm_workers_kib": workers_hwm,
            "cpu_s": (c1.user + c1.system) - (c0.user + c0.system) + workers_cpu}


def _train_transform(image_size: int):
    """The wds and streaming rows' train transform: PIL image -> uint8 CHW tensor."""
    import torchvision.transforms as T

    return T.Compose([T.RandomResizedCrop(image_size), T.RandomHorizontalFlip(), T.PILToTensor()])


def _pil_train_transform(image_size: int):
    """The streaming row's decode + transform: JPEG bytes -> uint8 CHW tensor."""
    import io

    from PIL import Image

    tf = _train_transform(image_size)

    def decode(data: bytes):
        with Image.open(io.BytesIO(data)) as img:  # as webdataset's decode("pil"): load, RGB
            img.load()
            return tf(img.convert("RGB"))

    return decode


def child_streaming(a, cfg: dict) -> dict:
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    decode = _pil_train_transform(a.image_size)

    class Decoded(StreamingDataset):
        def __getitem__(self, i):
            s = super().__getitem__(i)
            return decode(s["jpg"]), int(s["cls"])

    local = tempfile.mkdtemp(prefix="gpufeed-bench-streaming-")
    try:
        t0 = time.perf_counter()
        ds = Decoded(remote=cfg["root"], local=local, shuffle=True, batch_size=a.batch_size)
        open_s = time.perf_counter() - t0

        def empty_cache() -> dict:
            """Every pass from an empty cache, as gpufeed's remote reads (no disk cache)."""
            cached = sum(f.stat().st_size for f in pathlib.Path(local).rglob("*.mds"))
            for shard_id in range(ds.num_shards):
                ds.evict_shard(shard_id)
            return {"cached_bytes": cached}

        # DataLoader's default fork start: the workers inherit the dataset (its class is local).
        return dict(_time_torch_loader(a, ds, empty_cache), open_s=open_s, num_samples=ds.num_samples,
                    num_shards=ds.num_shards)
    finally:
        shutil.rmtree(local, ignore_errors=True)


def run_child(a) -> None:
    cfg = json.loads(a.one)
    child = {"wds": child_wds, "streaming": child_streaming}.get(cfg["kind"], child_gpufeed)
    print("RESULT " + json.dumps(child(a, cfg)), flush=True)


# --- MosaicML streaming: its venv and its MDS shards -----------------------------------------------

def _tar_samples(tar_path: pathlib.Path):
    """(image bytes, label) per sample of a pack shard, in order (webdataset's keys: the name up
    to the first dot)."""
    import tarfile

    samples: dict[str, dict] = {}
    with tarfile.open(tar_path) as tf:
        for m in tf:
            if not m.isfile():
                continue
            base = m.name.rsplit("/", 1)[-1]
            key, _, ext = base.partition(".")
            samples.setdefault(m.name[:len(m.name) - len(base)] + key, {})[ext.lower()] = tf.extractfile(m).read()
    for key, parts in samples.items():
        image = next((parts[e] for e in ("jpg", "jpeg", "png", "ppm") if e in parts), None)
        if image is None or "cls" not in parts:
            raise SystemExit(f"{tar_path}: sample {key} lacks an image or a .cls")
        yield image, int(parts["cls"])


def _mds_size_limit(sizes: list[int], header: int, shards: int) -> int:
    """The smallest size_limit at which MDSWriter's split (a shard starts at `header` bytes and is
    closed when the next sample would take it past the limit) makes at most `shards` shards of
    samples of `sizes` bytes."""
    def count(limit):
        n, cur = 1, header
        for x in sizes:
            if cur + x > limit:
                n, cur = n + 1, header
            cur += x
        return n

    lo, hi = header + max(sizes), header + sum(sizes)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if count(mid) > shards else (lo, mid)
    return lo


def write_mds(src: pathlib.Path, out: pathlib.Path) -> None:
    """(In streaming's venv) the samples of the pack shards in src, in order, as MDS shards in
    out, as many as there are tar shards; prints one line."""
    from streaming import MDSWriter

    tars = sorted(p for p in src.iterdir() if p.name.endswith(".tar"))
    samples = [s for t in tars for s in _tar_samples(t)]
    columns = {"jpg": "bytes", "cls": "int"}
    with MDSWriter(out=str(out), columns=columns) as probe:  # its encoding, to size the shards
        sizes = [len(probe.encode_sample({"jpg": j, "cls": c})) + probe.extra_bytes_per_sample for j, c in samples]
        header = probe.extra_bytes_per_shard
    shutil.rmtree(out)
    limit = _mds_size_limit(sizes, header, len(tars))
    with MDSWriter(out=str(out), columns=columns, size_limit=limit) as w:
        for image, label in samples:
            w.write({"jpg": image, "cls": label})
    with open(out / "index.json") as f:
        n = len(json.load(f)["shards"])
    print(f"wrote {len(samples)} samples from {len(tars)} tar shards into {n} MDS shards (size_limit {limit} bytes)")


def make_streaming_venv(venv: pathlib.Path) -> str | None:
    """Creates venv with STREAMING_SPEC from PyPI; None when done, else why not."""
    log = venv.parent / "pip.log"
    print(f"creating MosaicML streaming's venv {venv}: pip install {' '.join(STREAMING_SPEC)} "
          f"(about 5.6 GB with torch's CUDA libraries, a few minutes; log: {log})", flush=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    base = getattr(sys, "_base_executable", None) or sys.executable
    with open(log, "a") as f:
        for cmd in ([base, "-m", "venv", str(venv)], [str(venv / "bin" / "pip"), "install", *STREAMING_SPEC]):
            f.write(f"$ {' '.join(cmd)}\n")
            f.flush()
            if subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode != 0:
                tail = log.read_text().strip().splitlines()[-1:]
                return f"`{' '.join(cmd)}` failed ({' '.join(tail)}; see {log})"
    return None


def streaming_unavailable(python: str, default: bool) -> str | None:
    """None when `python` imports streaming, torch, torchvision and PIL, else the reason; makes
    (or completes) the default venv when it is missing or lacks them."""
    def check():
        if not pathlib.Path(python).exists():
            return f"no Python at {python}"
        p = subprocess.run([python, "-c", "import streaming, torch, torchvision, PIL; "
                                          "print(streaming.__version__, torch.__version__)"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            last = p.stderr.strip().splitlines()[-1:] or [f"exit {p.returncode}"]
            return f"{python} cannot import streaming, torch, torchvision and PIL ({last[0]})"
        print(f"streaming {p.stdout.split()[0]} (torch {p.stdout.split()[1]}) in {python}")
        return None

    why = check()
    if why and default:
        why = make_streaming_venv(pathlib.Path(python).parents[1]) or check()
    return why


# --- the parent ------------------------------------------------------------------------------------

def shard_pattern(folder: pathlib.Path) -> tuple[str, list[pathlib.Path]]:
    """('<prefix>-{000000..00000N}.tar', the shard paths) of a pack output folder."""
    tars = sorted(p for p in folder.iterdir() if p.name.endswith(".tar"))
    if not tars:
        raise SystemExit(f"no .tar shards in {folder}")
    m = re.fullmatch(r"(.+)-(\d+)\.tar", tars[0].name)
    if not m:
        raise SystemExit(f"{tars[0].name}: expected <prefix>-NNNNNN.tar (gpufeed pack's names)")
    prefix, width = m.group(1), len(m.group(2))
    names = [f"{prefix}-{i:0{width}d}.tar" for i in range(len(tars))]
    if [t.name for t in tars] != names:
        raise SystemExit(f"{folder}: shards are not {names[0]} .. {names[-1]} without gaps")
    missing = [t.name for t in tars if not (folder / (t.name + ".gpufeed-idx")).is_file()]
    if missing:
        raise SystemExit(f"{folder}: no .gpufeed-idx beside {missing[0]} (remote opening needs them: "
                         f"pack with `gpufeed pack ... --index-cache off`)")
    if len(tars) == 1:
        return names[0], tars
    return f"{prefix}-{{{0:0{width}d}..{len(tars) - 1:0{width}d}}}.tar", tars


def machine_info() -> dict:
    try:
        nproc = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip())
    except (OSError, ValueError):
        nproc = len(os.sched_getaffinity(0))
    flags = set()
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
                elif line.startswith("model name") and not model:
                    model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"nproc": nproc, "cpu_count": os.cpu_count(), "avx512f": "avx512f" in flags, "cpu": model,
            "python": sys.version.split()[0]}


class Bench:
    """Runs configurations in child processes and keeps every run, per (source, latency)."""

    def __init__(self, a):
        self.a = a
        self.rows: dict[tuple, dict] = {}  # (source, latency_ms) -> row (runs appended per round)
        self.env = dict(os.environ)
        pkg = str(pathlib.Path(a.build) / "python")
        self.env["PYTHONPATH"] = pkg + (os.pathsep + self.env["PYTHONPATH"] if self.env.get("PYTHONPATH") else "")
        for k in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
            self.env.pop(k, None)
        self.env["no_proxy"] = self.env["NO_PROXY"] = "127.0.0.1,localhost"
        self.server_pids: list[int] = []  # nginx: its CPU counts as the servers'

    def server_cpu_s(self) -> float:
        """CPU seconds of this process (the proxies, moto) and of nginx so far."""
        t = os.times()
        return t.user + t.system + sum(_proc_cpu_s(p) for p in self.server_pids)

    def run(self, c: dict) -> None:
        """One child run of configuration c (see main: source, latency_ms, kind, root, remote,
        env, proxy); its passes join the row of (source, latency_ms)."""
        a = self.a
        source, latency_ms, kind, remote, proxy = c["source"], c["latency_ms"], c["kind"], c["remote"], c.get("proxy")
        if proxy is not None:
            proxy.latency_s = (latency_ms or 0.0) / 1000
        cfg = {"kind": kind, "root": c["root"], "remote": remote, "shuffle_order": c.get("shuffle_order"),
               "remote_read": c.get("remote_read")}
        python = c.get("python", sys.executable)
        cmd = [python, str(pathlib.Path(__file__).resolve()), "--one", json.dumps(cfg),
               "--epochs", str(a.epochs), "--num-workers", str(a.num_workers),
               "--batch-size", str(a.batch_size), "--image-size", str(a.image_size),
               "--max-requests", str(a.max_requests), "--read-ahead", str(a.read_ahead)]
        row = self.rows.setdefault((source, latency_ms), {
            "source": source, "latency_ms": latency_ms, "kind": kind, "root": c["root"],
            "read_ahead_mib": a.read_ahead if remote and kind == "gpufeed" else None,
            "max_requests": a.max_requests if remote and kind == "gpufeed" else None,
            "data_mb": c.get("data_mb"), "runs": []})
        run: dict = {}
        req0, bytes0 = (proxy.requests, proxy.bytes) if proxy is not None else (0, 0)
        cpu0 = self.server_cpu_s()
        print(f"  {source}" + ("" if latency_ms is None else f" @ {latency_ms:g} ms") + " ...", end="", flush=True)
        t0 = time.perf_counter()
        env = dict(self.env, **c.get("env", {}))
        if python != sys.executable:  # another venv: without the build's gpufeed package
            env.pop("PYTHONPATH", None)
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            run["error"] = f"timed out after {a.timeout:g} s"
            print(f" {run['error']}")
            row["runs"].append(run)
            return
        run["wall_s"] = time.perf_counter() - t0
        run["server_cpu_s"] = self.server_cpu_s() - cpu0
        if proxy is not None:
            run["proxy_requests"] = proxy.requests - req0
            run["proxy_body_bytes"] = proxy.bytes - bytes0
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not lines:
            tail = (p.stderr or p.stdout).strip().splitlines()[-8:]
            run["error"] = f"exit {p.returncode}: " + " | ".join(tail)
            print(f" FAILED ({run['error'][:300]})")
            row["runs"].append(run)
            return
        run.update(json.loads(lines[-1][len("RESULT "):]))
        run["rates"] = [e["samples"] / e["seconds"] for e in run["epochs"] if e["seconds"] > 0]
        print(f" {max(run['rates']):.0f} images/s (passes: {', '.join(f'{r:.0f}' for r in run['rates'])})",
              flush=True)
        row["runs"].append(run)
        self._summarise(row)

    @staticmethod
    def _summarise(row: dict) -> None:
        """The row's figures over all its good runs: best/mean/min pass rate, per-pass means."""
        runs = [r for r in row["runs"] if "rates" in r]
        rates = [x for r in runs for x in r["rates"]]
        passes = sum(len(r["epochs"]) for r in runs)
        row["rates"] = rates
        row["best"], row["mean"], row["min"] = max(rates), statistics.fmean(rates), min(rates)
        row["passes"] = passes
        row["vm_hwm_kib"] = max(r["vm_hwm_kib"] for r in runs)
        row["cpu_s_per_epoch"] = sum(r.get("cpu_s", 0.0) for r in runs) / passes
        row["server_cpu_s_per_epoch"] = sum(r["server_cpu_s"] for r in runs) / passes
        if all("proxy_requests" in r for r in runs):
            row["requests_per_epoch"] = sum(r["proxy_requests"] for r in runs) / passes
            row["body_bytes_per_epoch"] = sum(r["proxy_body_bytes"] for r in runs) / passes
        if all(r.get("remote") for r in runs):
            # gpufeed's own counts (RemoteStats), the open's (the shard indexes) apart.
            row["gets_per_epoch"] = sum(r["remote"]["requests"] - r["remote_open"].get("requests", 0)
                                        for r in runs) / passes
            row["open_gets"] = max(r["remote_open"].get("requests", 0) for r in runs)
            row["copies_per_epoch"] = sum((r["remote"]["bytes_fetched"] - r["remote_open"].get("bytes_fetched", 0))
                                          / r["remote"]["dataset_bytes"] for r in runs) / passes
            row["refetched_per_epoch"] = sum(r["remote"].get("chunks_refetched", 0) for r in runs) / passes
        if all("read_s" in r.get("stats", {}) for r in runs):
            row["read_s_per_epoch"] = sum(r["stats"]["read_s"] for r in runs) / passes

    def find(self, source: str, latency_ms: float | None) -> dict | None:
        row = self.rows.get((source, latency_ms))
        return row if row is not None and "best" in row else None


def pack(a, out: pathlib.Path) -> None:
    gpufeed_bin = pathlib.Path(a.build) / "tools" / "gpufeed"
    cmd = [str(gpufeed_bin), "pack", a.data, str(out), "--shuffle", "--shard-size", str(a.shard_size),
           "--max-samples-per-shard", str(a.samples_per_shard), "--index-cache", "off", "--progress", "off"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    first = p.stdout.strip().splitlines()[0] if p.stdout.strip() else ""
    print(f"packed {a.data} -> {out} in {time.perf_counter() - t0:.1f} s: {first}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--data", default=str(DEFAULT_DATA),
                     help="image folder packed into a temporary folder (default: %(default)s)")
    src.add_argument("--shards", help="folder of existing `gpufeed pack` output (with .gpufeed-idx files)")
    ap.add_argument("--epochs", type=int, default=2, help="timed passes per configuration and round (default 2)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the whole set this many times, interleaved (a shared machine's load then "
                         "falls on every configuration alike); rates are over all passes (default 1)")
    ap.add_argument("--num-workers", type=int, default=2,
                    help="gpufeed decode threads / DataLoader worker processes (default 2)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--latencies", default="0,10,50", help="added ms per request, comma-separated (default 0,10,50)")
    ap.add_argument("--max-requests", type=int, default=128, help="gpufeed max_requests (default 128, gpufeed's)")
    ap.add_argument("--read-ahead", type=int, default=256, help="gpufeed read_ahead, MiB (default 256)")
    ap.add_argument("--shard-size", type=int, default=20_000_000, help="pack --shard-size, bytes (default 20000000)")
    ap.add_argument("--samples-per-shard", type=int, default=150,
                    help="pack --max-samples-per-shard (0: no limit); the default splits the 900 "
                         "sample images into 6 equal shards, so WebDataset's 2 workers get equal "
                         "work (with only the 20 MB cap the last shard holds a few samples)")
    ap.add_argument("--skip", default="", help="comma-separated, of: local,http,exact,s3,wds,streaming")
    ap.add_argument("--streaming-python", default=str(STREAMING_VENV / "bin" / "python"),
                    help="a Python with mosaicml-streaming, torch, torchvision and pillow (default "
                         "%(default)s, created when missing)")
    ap.add_argument("--build", default=str(ROOT / "build" / "release"),
                    help="build folder (its python/ package and tools/gpufeed; default %(default)s)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per child run at most (default 900)")
    ap.add_argument("--out", help="write every measurement to this JSON file")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one configuration, print RESULT
    ap.add_argument("--write-mds", nargs=2, help=argparse.SUPPRESS)  # internal: SHARDS MDS_OUT
    a = ap.parse_args(argv)
    if a.one:
        return run_child(a)
    if a.write_mds:
        return write_mds(*map(pathlib.Path, a.write_mds))

    skip = {s.strip() for s in a.skip.split(",") if s.strip()}
    latencies = [float(x) for x in a.latencies.split(",") if x.strip()]
    info = machine_info()
    print(f"machine: nproc {info['nproc']} (os.cpu_count {info['cpu_count']}), "
          f"avx512f {'yes' if info['avx512f'] else 'no'}, {info['cpu']}, Python {info['python']}")
    sys.path.insert(0, str(TESTS))
    import remote_servers as rs

    skipped: dict[str, str] = {}
    if ("http" not in skip or "wds" not in skip) and not rs.NginxServer.available():
        for what in ("http", "wds"):
            if what not in skip:
                skipped[what] = f"nginx is not available ({rs.NGINX} not found)"
    if "wds" not in skip and "wds" not in skipped:
        if shutil.which("curl") is None:
            skipped["wds"] = "curl is not on PATH (webdataset's pipe:curl reader)"
        else:
            try:
                import webdataset  # noqa: F401
            except ImportError as e:
                skipped["wds"] = f"webdataset is not installed in {sys.executable} ({e})"
    if "s3" not in skip:
        try:
            import boto3  # noqa: F401
            import moto.server  # noqa: F401
        except ImportError as e:
            skipped["s3"] = f"moto[server] and boto3 are needed ({e})"
    if "streaming" not in skip:
        if "s3" in skipped:
            skipped["streaming"] = skipped["s3"] + " (streaming reads S3, not http)"
        else:
            default = a.streaming_python == str(STREAMING_VENV / "bin" / "python")
            why = streaming_unavailable(a.streaming_python, default)
            if why:
                skipped["streaming"] = why
    skip |= set(skipped)

    with tempfile.TemporaryDirectory(prefix="gpufeed-bench-remote-") as tmp, contextlib.ExitStack() as stack:
        if a.shards:
            shards = pathlib.Path(a.shards).resolve()
        else:
            shards = pathlib.Path(tmp) / "shards"
            pack(a, shards)
        pattern, tars = shard_pattern(shards)
        total_mb = sum(t.stat().st_size for t in tars) / 1e6
        print(f"shards: {shards}/{pattern} ({len(tars)} shards, {total_mb:.1f} MB); batch {a.batch_size}, "
              f"image {a.image_size}, {a.num_workers} workers, {a.epochs} passes per run, {a.rounds} round(s), "
              f"gpufeed max_requests {a.max_requests}, read_ahead {a.read_ahead} MiB")
        b = Bench(a)
        configs: list[dict] = []
        if "local" not in skip:
            configs.append({"source": "gpufeed local", "latency_ms": None, "kind": "gpufeed",
                            "root": str(shards / pattern), "remote": False})
        if "http" not in skip or "wds" not in skip:
            ng = stack.enter_context(rs.NginxServer(shards))
            px = stack.enter_context(rs.LatencyProxy(ng.url))
            if ng._proc is not None:
                b.server_pids.append(ng._proc.pid)
            print(f"nginx {ng.url} serving {shards}; LatencyProxy {px.url} in front of it")
            if "http" not in skip:
                configs.append({"source": "gpufeed http-direct", "latency_ms": 0.0, "kind": "gpufeed",
                                "root": f"{ng.url}/{pattern}", "remote": True})
            for lat in latencies:
                if "http" not in skip:
                    configs.append({"source": "gpufeed http", "latency_ms": lat, "kind": "gpufeed",
                                    "root": f"{px.url}/{pattern}", "remote": True, "proxy": px})
                if "http" not in skip and "exact" not in skip:
                    configs.append({"source": "gpufeed http-exact", "latency_ms": lat, "kind": "gpufeed",
                                    "root": f"{px.url}/{pattern}", "remote": True, "proxy": px,
                                    "shuffle_order": "exact", "remote_read": "samples"})
                if "wds" not in skip:
                    configs.append({"source": "webdataset http", "latency_ms": lat, "kind": "wds",
                                    "root": f"pipe:curl -s {px.url}/{pattern}", "remote": True, "proxy": px})
        if "s3" not in skip or "streaming" not in skip:
            s3 = stack.enter_context(rs.MotoS3())
            s3.make_bucket(BUCKET)
        if "s3" not in skip:
            t0 = time.perf_counter()
            keys = s3.upload_tree(BUCKET, S3_PREFIX, shards)
            spx = stack.enter_context(rs.LatencyProxy(s3.endpoint_url))
            print(f"moto S3 {s3.endpoint_url}: {len(keys)} objects uploaded to s3://{BUCKET}/{S3_PREFIX}/ in "
                  f"{time.perf_counter() - t0:.1f} s; LatencyProxy {spx.url} in front of it")
            env = dict(s3.env(spx.url), AWS_EC2_METADATA_DISABLED="true")
            for lat in latencies:
                configs.append({"source": "gpufeed s3 (moto)", "latency_ms": lat, "kind": "gpufeed",
                                "root": f"s3://{BUCKET}/{S3_PREFIX}/{pattern}", "remote": True, "env": env,
                                "proxy": spx})
        if "streaming" not in skip:
            configs += streaming_configs(a, s3, stack, pathlib.Path(tmp) / MDS_PREFIX, shards, latencies, skipped)
        for rnd in range(a.rounds):
            if a.rounds > 1:
                print(f"round {rnd + 1} of {a.rounds}")
            for c in configs:
                b.run(c)
        for what, why in skipped.items():
            print(f"skipped {what}: {why}")
        report(b, a, info, latencies, skipped, f"{shards}/{pattern}", len(tars), total_mb)


def streaming_configs(a, s3, stack, mds: pathlib.Path, shards: pathlib.Path, latencies, skipped) -> list[dict]:
    """The streaming rows: MDS shards written in streaming's venv, uploaded to s3 under MDS_PREFIX,
    read through a LatencyProxy of their own; none (and skipped['streaming'] says why) on failure."""
    import remote_servers as rs

    t0 = time.perf_counter()
    p = subprocess.run([a.streaming_python, str(pathlib.Path(__file__).resolve()), "--write-mds", str(shards),
                        str(mds)], capture_output=True, text=True)
    if p.returncode != 0:
        skipped["streaming"] = f"writing MDS shards failed: {(p.stderr or p.stdout).strip().splitlines()[-1:]}"
        return []
    mds_mb = sum(f.stat().st_size for f in mds.iterdir()) / 1e6
    keys = s3.upload_tree(BUCKET, MDS_PREFIX, mds)
    px = stack.enter_context(rs.LatencyProxy(s3.endpoint_url))
    print(f"{p.stdout.strip()}, {mds_mb:.1f} MB, {len(keys)} objects uploaded to s3://{BUCKET}/{MDS_PREFIX}/ in "
          f"{time.perf_counter() - t0:.1f} s; LatencyProxy {px.url} in front of moto for streaming")
    env = dict(s3.env(px.url), S3_ENDPOINT_URL=px.url, AWS_EC2_METADATA_DISABLED="true")
    return [{"source": "streaming s3 (moto)", "latency_ms": lat, "kind": "streaming", "remote": True,
             "root": f"s3://{BUCKET}/{MDS_PREFIX}", "env": env, "proxy": px, "python": a.streaming_python,
             "data_mb": mds_mb} for lat in latencies]


def report(b: Bench, a, info: dict, latencies, skipped: dict, shards: str, num_shards: int, total_mb: float):
    local = b.find("gpufeed local", None)
    print()
    hdr = (f"{'source':<22}{'lat ms':>7}{'images/s':>10}{'mean':>8}{'spread':>13}{'x local':>9}"
           f"{'x wds':>7}{'peak RSS':>10}{'read_ahead':>11}{'GETs/pass':>10}{'open':>6}{'x data':>7}{'refetch':>8}"
           f"{'cpu/pass':>9}{'srv cpu':>9}"
           f"{'read wait':>10}")
    print(hdr)
    print("-" * len(hdr))
    for r in b.rows.values():
        lat = "-" if r["latency_ms"] is None else f"{r['latency_ms']:g}"
        if "best" not in r:
            err = next((x["error"] for x in r["runs"] if "error" in x), "failed")
            print(f"{r['source']:<22}{lat:>7}  {err[:100]}")
            continue
        wds = b.find("webdataset http", r["latency_ms"] if r["latency_ms"] is not None else
                     (latencies[0] if latencies else None))
        r["x_local"] = r["best"] / local["best"] if local else None
        r["x_wds"] = r["best"] / wds["best"] if wds else None
        x_local = f"{r['x_local']:.2f}" if local else "-"
        x_wds = f"{r['x_wds']:.2f}" if wds else "-"
        spread = f"{r['min']:.0f}..{r['best']:.0f}"
        rss = f"{r['vm_hwm_kib'] / 1024:.0f} MiB"
        ra = f"{r['read_ahead_mib']} MiB" if r.get("read_ahead_mib") else "-"
        if "gets_per_epoch" in r:  # gpufeed's own counts
            gets, opened = f"{r['gets_per_epoch']:.0f}", f"{r['open_gets']}"
            copies, refetch = f"{r['copies_per_epoch']:.2f}", f"{r['refetched_per_epoch']:.1f}"
        elif "requests_per_epoch" in r:  # webdataset: the proxy's
            gets, opened, refetch = f"{r['requests_per_epoch']:.0f}", "-", "-"
            copies = f"{r['body_bytes_per_epoch'] / 1e6 / (r.get('data_mb') or total_mb):.2f}"
        else:
            gets = opened = copies = refetch = "-"
        cpu = f"{r['cpu_s_per_epoch']:.2f} s"
        srv = f"{r['server_cpu_s_per_epoch']:.2f} s" if r["source"] != "gpufeed local" else "-"
        wait = f"{r['read_s_per_epoch']:.2f} s" if "read_s_per_epoch" in r else "-"
        print(f"{r['source']:<22}{lat:>7}{r['best']:>10.0f}{r['mean']:>8.0f}{spread:>13}{x_local:>9}"
              f"{x_wds:>7}{rss:>10}{ra:>11}{gets:>10}{opened:>6}{copies:>7}{refetch:>8}{cpu:>9}{srv:>9}{wait:>10}")
    print()
    print("images/s: the best pass; mean and spread (min..best) over the passes. x local: / gpufeed local; "
          "x wds: / webdataset at the same latency (local: at the first latency). peak RSS: VmHWM of the "
          "configuration's process (webdataset, streaming: + its workers', shared pages counted in each). "
          f"GETs/pass: requests per pass ({num_shards} shards; gpufeed's own count, RemoteStats, without the "
          "open's, which 'open' gives: the shard indexes; webdataset, streaming: the proxy's count, for "
          "streaming a HEAD and a GET per MDS shard, and its open's 2 for index.json). x data: bytes fetched "
          f"per pass over the shards' {total_mb:.1f} MB (streaming: over its MDS shards'), the egress in copies "
          "of the dataset (webdataset, streaming: the proxy's bytes). refetch: chunks_refetched per pass (whole "
          "shards or chunks fetched again after being dropped to keep remote_shards_in_flight). cpu/pass: CPU s per pass "
          "of the loader (its process; webdataset, streaming: + its workers). srv cpu: CPU s per pass of the "
          f"proxy, moto and nginx, on the same {info['nproc']} CPUs as the loader. read wait: gpufeed's "
          "stats()['read_s'] per pass, its decode threads' time in reads (waiting for sample bytes).")
    print(f"machine: nproc {info['nproc']}, avx512f {'yes' if info['avx512f'] else 'no'}")
    direct = b.find("gpufeed http-direct", 0.0)
    via0 = b.find("gpufeed http", 0.0)
    if direct and via0:
        print(f"proxy cost at 0 ms: gpufeed http through the LatencyProxy {via0['best']:.0f} images/s vs "
              f"straight from nginx {direct['best']:.0f} ({via0['best'] / direct['best']:.2f}x)")
    http_rows = [r for r in b.rows.values() if r["source"] in ("gpufeed http-direct", "gpufeed http") and "best" in r]
    if local and http_rows:
        print(f"loader CPU per pass: gpufeed local {local['cpu_s_per_epoch']:.2f} s; " + "; ".join(
            f"{r['source'].split()[-1]} @ {r['latency_ms']:g} ms {r['cpu_s_per_epoch']:.2f} s "
            f"({r['cpu_s_per_epoch'] / local['cpu_s_per_epoch']:.2f}x) + servers {r['server_cpu_s_per_epoch']:.2f} s"
            for r in http_rows))

    for lat in latencies:
        if lat > 0 and "http" not in skipped:
            print(f"in-flight cap at {lat:g} ms: max_requests {a.max_requests} / {lat / 1000:g} s = "
                  f"{a.max_requests / (lat / 1000):.0f} requests/s (one sample each) before any transfer time")

    targets = []
    http50 = b.find("gpufeed http", TARGET_LATENCY_MS)
    wds50 = b.find("webdataset http", TARGET_LATENCY_MS)
    if TARGET_LATENCY_MS not in latencies:
        print(f"targets: not measured (--latencies lacks {TARGET_LATENCY_MS:g})")
    else:
        for name, num, den, need in (
                (f"gpufeed http @ {TARGET_LATENCY_MS:g} ms >= {TARGET_VS_LOCAL} x gpufeed local", http50, local,
                 TARGET_VS_LOCAL),
                (f"gpufeed http @ {TARGET_LATENCY_MS:g} ms >= {TARGET_VS_WDS:g} x webdataset @ "
                 f"{TARGET_LATENCY_MS:g} ms", http50, wds50, TARGET_VS_WDS),
                (f"gpufeed http @ {TARGET_LATENCY_MS:g} ms >= {TARGET_VS_STREAMING:g} x streaming s3 (moto) @ "
                 f"{TARGET_LATENCY_MS:g} ms", http50, b.find("streaming s3 (moto)", TARGET_LATENCY_MS),
                 TARGET_VS_STREAMING)):
            if num is None or den is None:
                print(f"SKIP {name}: not measured")
                targets.append({"target": name, "status": "SKIP"})
                continue
            ratio = num["best"] / den["best"]
            ok = ratio >= need
            print(f"{'PASS' if ok else 'FAIL'} {name}: {ratio:.2f} ({num['best']:.0f} / {den['best']:.0f} images/s)")
            targets.append({"target": name, "status": "PASS" if ok else "FAIL", "ratio": ratio})
        name = f"gpufeed http @ {TARGET_LATENCY_MS:g} ms requests per pass <= 2 x {num_shards} shards"
        if http50 is None or "gets_per_epoch" not in http50:
            print(f"SKIP {name}: not measured")
            targets.append({"target": name, "status": "SKIP"})
        else:
            ok = http50["gets_per_epoch"] <= 2 * num_shards
            print(f"{'PASS' if ok else 'FAIL'} {name}: {http50['gets_per_epoch']:.1f} "
                  f"(and {http50['open_gets']} on opening)")
            targets.append({"target": name, "status": "PASS" if ok else "FAIL",
                            "gets_per_epoch": http50["gets_per_epoch"], "open_gets": http50["open_gets"]})
    s3rows = [r for r in b.rows.values() if r["source"].startswith("gpufeed s3") and "best" in r]
    if s3rows:
        print("s3 (moto, pure Python, no target): " + ", ".join(
            f"{r['latency_ms']:g} ms {r['best']:.0f} images/s (servers {r['server_cpu_s_per_epoch']:.1f} CPU s per pass)"
            for r in s3rows))
    report_streaming(b)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"machine": info, "args": vars(a), "shards": shards, "skipped": skipped,
                       "results": list(b.rows.values()), "targets": targets}, f, indent=1)
        print(f"wrote {a.out}")


def report_streaming(b: Bench) -> None:
    """streaming's cache per pass, and streaming beside gpufeed on the same moto server."""
    rows = [r for r in b.rows.values() if r["kind"] == "streaming" and "best" in r]
    for r in rows:
        cached = [e["cached_bytes"] / 1e6 for run in r["runs"] if "epochs" in run for e in run["epochs"]]
        s3 = b.find("gpufeed s3 (moto)", r["latency_ms"])
        print(f"streaming @ {r['latency_ms']:g} ms: local cache at the end of each pass "
              f"{', '.join(f'{c:.1f}' for c in cached)} MB of {r['data_mb']:.1f} MB (emptied after each pass)"
              + (f"; gpufeed s3 (moto) / streaming: {s3['best'] / r['best']:.2f}" if s3 else ""))


if __name__ == "__main__":
    sys.exit(main())
