"""gpufeed.DataLoader over remote shards (docs/SCALING.md, "Remote data"): HTTP from our own range
server and from nginx, S3 from moto's server, all on 127.0.0.1 and started here; faults injected by
remote_servers.FaultProxy. Remote batches equal the same shards' batches from the local disk, byte
for byte; every fault kind is retried or fails naming the URL; secrets stay out of every output."""
import contextlib
import faulthandler
import gc
import io
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time

import pytest
import torch

import gpufeed
from conftest import make_image_folder
from remote_servers import FaultProxy, MotoS3, NginxServer, RangeHTTPServer

PATTERN = "train-{000000..000003}.tar"
# DistributedSampler's order (remote shards default to the shard-aware one, shuffle_order="auto"):
# these tests compare remote batches and reads with the local disk's in that order.
# remote_read="samples": most tests here check per-sample ranged GETs (their ranges, the cache's
# ranges per sample); shard-granular reads are test_shard_reads_* and tests/test_remote_reads.cpp.
COMMON = dict(batch_size=5, image_size=32, dtype=torch.uint8, index_cache="off", num_workers=2,
              shuffle_order="exact", remote_read="samples")


@pytest.fixture(scope="module")
def packed(tmp_path_factory, gpufeed_cli) -> pathlib.Path:
    """27 generated JPEGs packed by `gpufeed pack` into 4 shards with their indexes beside them."""
    root = tmp_path_factory.mktemp("remote")
    make_image_folder(root / "train", per_class=9, seed=11)
    subprocess.run([str(gpufeed_cli), "pack", str(root / "train"), str(root / "shards"), "--max-samples-per-shard",
                    "7", "--index-cache", "off", "--progress", "off"], check=True, capture_output=True)
    assert sorted(p.name for p in (root / "shards").glob("*.gpufeed-idx")) == \
        [f"train-{i:06d}.tar.gpufeed-idx" for i in range(4)]
    return root / "shards"


@pytest.fixture(scope="module")
def tar_only(tmp_path_factory) -> pathlib.Path:
    """The same kind of shards written by Python's tarfile, without indexes (a WebDataset not
    written by gpufeed pack): 4 shards of 7, 7, 7, 6 samples."""
    root = tmp_path_factory.mktemp("tar-only")
    folder = make_image_folder(root / "train", per_class=9, seed=12)
    files = sorted((p.parent.name, p) for p in folder.rglob("*.jpg"))
    classes = sorted({c for c, _ in files})
    (root / "shards").mkdir()
    for s in range(4):
        with tarfile.open(root / "shards" / f"train-{s:06d}.tar", "w") as tar:
            for c, p in files[s * 7:(s + 1) * 7]:
                for name, data in ((f"{c}/{p.stem}.jpg", p.read_bytes()), (f"{c}/{p.stem}.cls", str(classes.index(c)).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return root / "shards"


def shard_path(suffix):
    """A FaultProxy match: requests of shards (not of their indexes) whose path ends with `suffix`."""
    return lambda path: path.split("?")[0].endswith(suffix)


def epoch(data, epoch_=1, **kw):
    """One epoch's batches as [(indices, labels, images)] and the loader."""
    loader = gpufeed.DataLoader(data, shuffle=True, seed=3, **{**COMMON, **kw})
    loader.set_epoch(epoch_)
    out = [(list(loader.last_batch["indices"]), y.clone(), x.clone()) for x, y in loader]
    return out, loader


def assert_same(a, b):
    assert len(a) == len(b) > 0
    for (ia, ya, xa), (ib, yb, xb) in zip(a, b):
        assert ia == ib
        assert torch.equal(ya, yb)
        assert torch.equal(xa, xb)


@pytest.mark.parametrize("server", ["range", "nginx", "s3"])
def test_remote_shards_give_the_local_disks_batches(packed, server, monkeypatch):
    local, local_loader = epoch(str(packed / PATTERN))
    if server == "nginx" and not NginxServer.available():
        pytest.skip("nginx is not installed (setup.sh installs Debian's nginx-light)")
    if server == "s3":
        with MotoS3() as s3:
            s3.make_bucket("data")
            s3.upload_tree("data", "imagenet/train", packed)
            for k, v in s3.env().items():
                monkeypatch.setenv(k, v)
            remote, loader = epoch("s3://data/imagenet/train/" + PATTERN)
            prefix = "s3://data/imagenet/train/"
    else:
        with (RangeHTTPServer(packed.parent) if server == "range" else NginxServer(packed.parent)) as http:
            remote, loader = epoch(http.url + "/shards/" + PATTERN)
            prefix = http.url + "/shards/"
    assert_same(local, remote)
    assert [label for _, label in loader.samples] == [label for _, label in local_loader.samples]
    # A sample is named "<shard URL>:<member>".
    assert loader.samples[0][0] == prefix + "train-000000.tar:" + local_loader.samples[0][0].split(".tar:")[1]


def test_shards_without_an_index_are_indexed_from_their_headers_once(tar_only, tmp_path):
    local, _ = epoch(str(tar_only / PATTERN))
    with RangeHTTPServer(tar_only.parent) as http:
        url = http.url + "/shards/" + PATTERN
        cache = str(tmp_path / "index-cache")
        first, _ = epoch(url, index_cache=cache)
        assert_same(local, first)
        assert len(list((tmp_path / "index-cache" / "remote").glob("*.gpufeed-idx"))) == 4
        before = len(http.requests.snapshot())
        gpufeed.DataLoader(url, **{**COMMON, "index_cache": cache})  # opened from the index cache
        opened = http.requests.snapshot()[before:]
        # Per shard: a HEAD and a GET of the (missing) index beside it; no read of its headers (the
        # 1 MiB blocks from offset 0; samples' reads, ahead of the loaders, start past a header).
        assert sorted((m, p.rsplit("/", 1)[1], s) for m, p, r, s in opened if not (r and m == "GET")) == sorted(
            [("HEAD", f"train-{i:06d}.tar", 200) for i in range(4)] +
            [("GET", f"train-{i:06d}.tar.gpufeed-idx", 404) for i in range(4)])
        assert not [r for _, _, r, _ in opened if r and r.startswith("bytes=0-")]
        # The shard changes: its ETag differs, the cached index is not used, the headers are read again.
        shard = tar_only / "train-000002.tar"
        data = shard.read_bytes()
        shard.write_bytes(data)
        os.utime(shard, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
        before = len(http.requests.snapshot())
        gpufeed.DataLoader(url, **{**COMMON, "index_cache": cache})
        headers = [p for m, p, r, _ in http.requests.snapshot()[before:] if r and r.startswith("bytes=0-")]
        assert headers == ["/shards/train-000002.tar"]


def sample_ranges(shards):
    """(shard name, first byte, last byte) of each sample, in dataset order, from the indexes."""
    out = []
    for idx in sorted(shards.glob("*.gpufeed-idx")):
        lines = idx.read_text().splitlines()
        assert lines[0] == "gpufeed-shard-index 2"
        start = next(i for i, line in enumerate(lines) if line.startswith("samples ")) + 1
        for line in lines[start:]:
            offset, size, _label, _member = line.split(" ", 3)
            out.append((idx.name[:-len(".gpufeed-idx")], int(offset), int(offset) + int(size) - 1))
    return out


def is_trailer_read(range_header):
    """Whether a Range header asks for a shard's trailer: 512 bytes (no sample is that small here)."""
    m = re.fullmatch(r"bytes=(\d+)-(\d+)", range_header or "")
    return bool(m) and int(m.group(2)) - int(m.group(1)) + 1 == 512


def requested(requests, ranges):
    """The samples a server's ranged GETs covered, in request order."""
    by_start = {(shard, first): i for i, (shard, first, _) in enumerate(ranges)}
    out = []
    for method, path, rng, status in requests:
        if method != "GET" or not path.endswith(".tar") or is_trailer_read(rng):
            continue
        assert status == 206 and rng.startswith("bytes=")
        first, last = (int(v) for v in rng[len("bytes="):].split("-"))
        shard = path.rsplit("/", 1)[1]
        out += [i for i, (s, a, b) in enumerate(ranges) if s == shard and first <= a and b <= last]
        assert (shard, first) in by_start
    return out


def test_reads_are_ranged_gets_ahead_in_sampler_order_and_coalesced_when_adjacent(packed):
    ranges = sample_ranges(packed)
    with RangeHTTPServer(packed.parent) as http:
        kw = dict(num_workers=1, max_requests=1, prefetch_next_epoch=False)
        shuffled, loader = epoch(http.url + "/shards/" + PATTERN, **kw)
        # A ranged GET per sample, each sample fetched once, the first the DistributedSampler's first
        # (the workers' reads may overtake the read-ahead's by a few: they are fetched on demand).
        order = [i for idx, _, _ in shuffled for i in idx]
        got = requested(http.requests.snapshot(), ranges)
        assert sorted(got) == sorted(order) and got[0] == order[0]
        del loader
        before = len(http.requests.snapshot())
        # In order, each shard's samples are one request. With room for the 4 requests, all are issued
        # when the epoch is announced, before any sample is read (with fewer, a worker's read that
        # overtakes the read-ahead is fetched alone, and how often depends on timing).
        kw["max_requests"] = 4
        sequential = gpufeed.DataLoader(http.url + "/shards/" + PATTERN, shuffle=False, **{**COMMON, **kw})
        assert sum(1 for _ in sequential) == 6
        gets = shard_gets(http.requests.snapshot()[before:])
        assert len(gets) == 4  # issued together: the server may log them in any order
        assert requested(sorted(gets, key=lambda r: r[1]), ranges) == list(range(27))


def test_faults_are_retried_and_the_batches_are_unchanged(packed):
    local, _ = epoch(str(packed / PATTERN))
    with RangeHTTPServer(packed.parent) as http, FaultProxy(http.url) as proxy:
        for kind, count in (("503", 3), ("500", 2), ("reset", 2), ("short", 2), ("stall", 1)):
            proxy.inject(kind, count=count, match=shard_path(".tar"), methods=("GET",))
        proxy.stall_s = 20
        remote, _ = epoch(proxy.url + "/shards/" + PATTERN, request_timeout=1, max_requests=4)
        assert_same(local, remote)
        stats = proxy.stats()
        assert (stats["503"], stats["500"], stats["reset"], stats["short"], stats["stall"]) == (3, 2, 2, 2, 1)


def test_retries_run_out_with_an_error_naming_the_url_status_and_attempts(packed):
    with RangeHTTPServer(packed.parent) as http, FaultProxy(http.url) as proxy:
        loader = gpufeed.DataLoader(proxy.url + "/shards/" + PATTERN + "?X-Amz-Signature=abcdef0123456789",
                                    max_retries=2, **COMMON)
        proxy.inject("503", count=10**6, match=shard_path(".tar"), methods=("GET",))
        with pytest.raises(gpufeed.DecodeError) as e:
            next(iter(loader))
        message = str(e.value)
        assert e.value.kind == "io"
        assert proxy.url + "/shards/train-000000.tar?<redacted>" in message
        assert "HTTP 503 SlowDown" in message and "after 3 attempts" in message
        assert "abcdef0123456789" not in message


def test_skip_counts_the_samples_of_an_unreadable_shard(packed):
    local, local_loader = epoch(str(packed / PATTERN))
    bad = {i for i, (path, _) in enumerate(local_loader.samples) if "train-000001.tar:" in path}
    with RangeHTTPServer(packed.parent) as http, FaultProxy(http.url) as proxy:
        # Opened first (opening reads each shard's trailer: a shard unreadable then fails the open).
        loader = gpufeed.DataLoader(proxy.url + "/shards/" + PATTERN, shuffle=True, seed=3, on_error="skip",
                                    max_skips=100, max_retries=0, **COMMON)
        proxy.inject("500", count=10**6, match=shard_path("train-000001.tar"), methods=("GET",))
        loader.set_epoch(1)
        remote = [len(y) for _, y in loader]
        summary = loader.epoch_summary()
        order = [i for idx, _, _ in local for i in idx]
        assert summary["skipped"] == sum(1 for i in order if i in bad) == 7
        assert summary["skipped_by_kind"] == {"io": 7}
        assert all("HTTP 500" in s["reason"] for s in summary["skips"])
        assert {s["index"] for s in summary["skips"]} == bad
        assert len(remote) == len(local) and all(s["replaced_by"] not in bad for s in summary["skips"])


@pytest.mark.parametrize("fault", ["404", "403", "redirect"])
def test_a_missing_forbidden_or_redirected_shard_fails_at_open_naming_it(packed, fault):
    forbidden = ["shards/train-000002.tar"] if fault == "403" else []
    with RangeHTTPServer(packed.parent, forbidden=forbidden) as http, FaultProxy(http.url) as proxy:
        url = proxy.url + "/shards/" + PATTERN
        if fault == "404":
            url = proxy.url + "/shards/train-{000000..000004}.tar"
        if fault == "redirect":
            proxy.inject("redirect", match="train-000001.tar", methods=("HEAD",))
        with pytest.raises(RuntimeError) as e:
            gpufeed.DataLoader(url, **COMMON)
        failing = {"404": "train-000004.tar", "403": "train-000002.tar", "redirect": "train-000001.tar"}[fault]
        asked = sorted(r["method"] for r in proxy.log.snapshot() if failing in r["path"])
        # Not retried: one HEAD (and the open's one GET of the shard, when it went out alongside).
        assert asked in (["HEAD"], ["GET", "HEAD"]), f"{failing} was requested {asked}"
        message = str(e.value)
        if fault == "404":
            assert "train-000004.tar: HTTP 404" in message and "no such object" in message
        elif fault == "403":
            assert "train-000002.tar: HTTP 403" in message and "access denied" in message
        else:
            assert "train-000001.tar: HTTP 302" in message and "http://example.invalid/elsewhere" in message
            assert "not followed" in message


def test_a_shard_that_changed_after_opening_is_an_error_not_decoded(packed, tmp_path):
    copy = tmp_path / "shards"
    copy.mkdir()
    for p in packed.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    with RangeHTTPServer(tmp_path) as http:
        loader = gpufeed.DataLoader(http.url + "/shards/" + PATTERN, **COMMON)
        shard = copy / "train-000000.tar"
        shard.write_bytes(shard.read_bytes())
        os.utime(shard, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
        with pytest.raises(gpufeed.DecodeError, match="HTTP 412.*changed since it was indexed"):
            next(iter(loader))


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/shards/train-000000.tar", "file:///tmp/train-000000.tar",
                                 "gopher://127.0.0.1/x.tar"])
def test_only_http_https_and_s3_are_accepted(url):
    with pytest.raises(ValueError, match="unsupported URL scheme"):
        gpufeed.DataLoader(url, **COMMON)


@contextlib.contextmanager
def ctrl_c_after(seconds: float):
    """A KeyboardInterrupt raised in the main thread `seconds` from now (as Ctrl-C's SIGINT
    handler raises it); yields the start time."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        with pytest.raises(KeyboardInterrupt):
            yield time.monotonic()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_ctrl_c_and_destruction_return_promptly_while_requests_stall(packed):
    with RangeHTTPServer(packed.parent) as http, FaultProxy(http.url) as proxy:
        loader = gpufeed.DataLoader(proxy.url + "/shards/" + PATTERN, request_timeout=60, **COMMON)
        proxy.stall_s = 60
        proxy.inject("stall", count=10**6, match=shard_path(".tar"), methods=("GET",))
        it = iter(loader)
        with ctrl_c_after(1.0) as started:
            next(it)
        # Hang guards: the stalled requests would hold each for 60 s.
        assert time.monotonic() - started < 20
        started = time.monotonic()
        del it, loader
        gc.collect()
        assert time.monotonic() - started < 20


def test_ctrl_c_while_opening_returns_promptly_while_the_heads_stall(packed):
    with RangeHTTPServer(packed.parent) as http, FaultProxy(http.url) as proxy:
        proxy.stall_s = 60
        proxy.inject("stall", count=10**6, match=shard_path(".tar"), methods=("HEAD",))
        with ctrl_c_after(1.0) as started:
            gpufeed.DataLoader(proxy.url + "/shards/" + PATTERN, request_timeout=60, **COMMON)
        assert 0.9 < time.monotonic() - started < 20  # the interrupt's time; not the 60 s stall
        assert proxy.stats().get("stall", 0) >= 1  # the opening did wait on a stalled HEAD


@contextlib.contextmanager
def sigint_after(seconds: float, bound_s: float = 120):
    """A real SIGINT sent to this process `seconds` from now by a timer thread (Python's own
    handler raises KeyboardInterrupt in the main thread); the body must raise it. The process
    dumps its threads and exits if the body has not ended `bound_s` from now: a hang fails the run
    instead of stalling it. Yields the start time."""
    timer = threading.Timer(seconds, os.kill, (os.getpid(), signal.SIGINT))
    faulthandler.dump_traceback_later(bound_s, exit=True)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            yield time.monotonic()
    finally:
        timer.cancel()
        timer.join()
        faulthandler.cancel_dump_traceback_later()


@contextlib.contextmanager
def bounded(bound_s: float = 120):
    """The process dumps its threads and exits if the body has not ended `bound_s` from now."""
    faulthandler.dump_traceback_later(bound_s, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def test_ctrl_c_while_a_read_stalls_then_next_returns_the_pending_batch(packed):
    """A real SIGINT while next() waits on a stalled server raises KeyboardInterrupt; once the server
    answers again, the same iterator yields exactly the uninterrupted run's batches (indices and
    pixels), from the pending one on."""
    local, _ = epoch(str(packed / PATTERN))
    with RangeHTTPServer(packed.parent) as http, FaultProxy(http.url) as proxy:
        loader = gpufeed.DataLoader(proxy.url + "/shards/" + PATTERN, shuffle=True, seed=3, request_timeout=1,
                                    **COMMON)
        loader.set_epoch(1)
        proxy.stall_s = 60
        proxy.inject("stall", count=10**6, match=shard_path(".tar"), methods=("GET",))
        it = iter(loader)
        with sigint_after(1.0):
            next(it)
        assert proxy.stats()["stall"] >= 1  # the read did wait on a stalled GET
        proxy.clear_faults()
        with bounded():
            rest = [(list(loader.last_batch["indices"]), y.clone(), x.clone()) for x, y in it]
        assert_same(local, rest)


def test_ctrl_c_while_load_sample_stalls_raises_at_once_and_the_loader_goes_on(packed):
    """A real SIGINT while load_sample (loader.dataset[i]) waits on a stalled server raises
    KeyboardInterrupt within seconds, not after the stall's retries; once the server answers, the
    same sample and a whole epoch equal the local disk's."""
    local, local_loader = epoch(str(packed / PATTERN))
    with RangeHTTPServer(packed.parent) as http, FaultProxy(http.url) as proxy:
        loader = gpufeed.DataLoader(proxy.url + "/shards/" + PATTERN, shuffle=True, seed=3, request_timeout=30,
                                    max_retries=0, **COMMON)
        loader.set_epoch(1)
        proxy.stall_s = 60
        proxy.inject("stall", count=10**6, match=shard_path(".tar"), methods=("GET",))
        with sigint_after(1.0) as started:
            loader.load_sample(11, 1)
        assert time.monotonic() - started < 10  # the stalled GET times out only after 30 s
        assert proxy.stats()["stall"] == 1
        proxy.clear_faults()
        with bounded():
            assert torch.equal(loader.load_sample(11, 1), local_loader.load_sample(11, 1))
            local_loader.set_epoch(1)  # both datasets' samples of epoch 1
            assert torch.equal(loader.dataset[11][0], local_loader.dataset[11][0])
            remote = [(list(loader.last_batch["indices"]), y.clone(), x.clone()) for x, y in loader]
        assert_same(local, remote)


def test_secrets_stay_out_of_every_output(packed, monkeypatch, capfd, tmp_path, gpufeed_cli):
    secrets = [MotoS3.SECRET_KEY, MotoS3.SESSION_TOKEN, MotoS3.ACCESS_KEY, "sigsecret0123"]
    with MotoS3() as s3, FaultProxy(s3.endpoint_url) as proxy:
        s3.make_bucket("private")
        s3.upload_tree("private", "train", packed)
        for k, v in s3.env(endpoint_url=proxy.url).items():
            monkeypatch.setenv(k, v)
        outputs = []
        # A passing run, and its state and summary.
        remote, loader = epoch("s3://private/train/" + PATTERN, on_error="skip", max_retries=1)
        outputs += [repr(loader.state_dict()), repr(loader.epoch_summary()), repr(loader.samples)]
        # The requests were signed with the access key and carried the session token.
        signed = [e["headers"] for e in proxy.log if e["path"].startswith("/private/train/train-000000.tar")]
        assert signed and all("Credential=" + MotoS3.ACCESS_KEY in h["Authorization"] for h in signed)
        assert all(h.get("x-amz-security-token") == MotoS3.SESSION_TOKEN for h in signed)
        # Failing runs: retries exhausted (skip policy: each failure logged), then raised; opened
        # before the faults begin, then failing at open (the shard's trailer cannot be read).
        skipping, raising = (gpufeed.DataLoader("s3://private/train/" + PATTERN, on_error=policy, max_retries=1, **COMMON)
                             for policy in ("skip", "raise"))
        proxy.inject("503", count=10**6, match=shard_path("train-000003.tar"), methods=("GET",))
        assert sum(1 for _ in skipping) > 0
        outputs.append(repr(skipping.epoch_summary()))
        assert skipping.epoch_summary()["skipped"] > 0
        with pytest.raises(gpufeed.DecodeError) as e:
            for _ in raising:
                pass
        outputs.append(str(e.value))
        with pytest.raises(RuntimeError) as e:
            gpufeed.DataLoader("s3://private/train/" + PATTERN, max_retries=1, **COMMON)
        outputs.append(str(e.value))
        with pytest.raises(RuntimeError) as e:
            gpufeed.DataLoader("s3://private/train/train-{000000..000009}.tar", **COMMON)
        outputs.append(str(e.value))
        with pytest.raises(RuntimeError) as e:  # a presigned-style URL: its query is never printed
            gpufeed.DataLoader(proxy.url + "/private/train/missing.tar?X-Amz-Signature=sigsecret0123", **COMMON)
        outputs.append(str(e.value))
        # The CLI, passing and failing, with its JSON record.
        cli = subprocess.run([str(gpufeed_cli), "bench", "--data", "s3://private/train/" + PATTERN, "--batch-size",
                              "5", "--image-size", "32", "--index-cache", "off", "--json"],
                             capture_output=True, text=True, timeout=120)
        assert cli.returncode != 0 or cli.stdout  # it ran (the 503s may end it)
        outputs += [cli.stdout, cli.stderr]
        proxy.clear_faults()
        ok = subprocess.run([str(gpufeed_cli), "bench", "--data", "s3://private/train/" + PATTERN, "--batch-size",
                             "5", "--image-size", "32", "--index-cache", "off", "--json"],
                            capture_output=True, text=True, timeout=120)
        assert ok.returncode == 0, ok.stderr
        outputs += [ok.stdout, ok.stderr]
    captured = capfd.readouterr()
    outputs += [captured.out, captured.err]
    text = "\n".join(outputs)
    assert "s3://private/train/train-000003.tar" in text  # the failures were reported ...
    for secret in secrets:
        assert secret not in text  # ... without a secret


def shard_gets(requests):
    """GETs of shards' bytes, but the trailers' (the last 512 bytes, read at open)."""
    return [r for r in requests if r[0] == "GET" and r[1].endswith(".tar") and not is_trailer_read(r[2])]


def test_the_local_cache_serves_a_second_run_and_never_a_changed_object(packed, tmp_path):
    local, _ = epoch(str(packed / PATTERN))
    copy = tmp_path / "shards"
    copy.mkdir()
    for p in packed.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    cache = tmp_path / "cache"
    with RangeHTTPServer(tmp_path) as http:
        url = http.url + "/shards/" + PATTERN
        first, loader = epoch(url, cache_dir=str(cache), prefetch_next_epoch=False)
        del loader
        assert_same(local, first)
        assert len(list(cache.glob("*.data"))) == 4 and len(list(cache.glob("*.ranges"))) == 4
        before = len(http.requests.snapshot())
        second, loader = epoch(url, cache_dir=str(cache), prefetch_next_epoch=False)
        del loader
        assert_same(local, second)
        assert shard_gets(http.requests.snapshot()[before:]) == []  # every sample from the cache
        # A shard replaced on the server (same bytes, a new ETag): its cached bytes are dropped and
        # fetched again; the other shards' stay.
        shard = copy / "train-000001.tar"
        shard.write_bytes(shard.read_bytes())
        os.utime(shard, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))
        before = len(http.requests.snapshot())
        third, loader = epoch(url, cache_dir=str(cache), prefetch_next_epoch=False)
        del loader
        assert_same(local, third)
        assert {p for _, p, _, _ in shard_gets(http.requests.snapshot()[before:])} == {"/shards/train-000001.tar"}


def test_the_cache_stays_within_its_limit(packed, tmp_path):
    local, _ = epoch(str(packed / PATTERN))
    cache = tmp_path / "cache"
    limit = 40000  # bytes: about two of the four shards
    with RangeHTTPServer(packed.parent) as http:
        for _ in range(2):
            run, loader = epoch(http.url + "/shards/" + PATTERN, cache_dir=str(cache), cache_limit=limit / 2**30,
                                prefetch_next_epoch=False)
            del loader
            assert_same(local, run)
            on_disk = sum(p.stat().st_blocks * 512 for p in cache.glob("*.data"))
            assert on_disk <= limit + 64 * 1024  # checked after each 1/16 of the limit written
            assert len(list(cache.glob("*.data"))) < 4


def test_processes_share_one_cache(packed, tmp_path):
    cache = tmp_path / "cache"
    script = f"""
import sys, torch, gpufeed
loader = gpufeed.DataLoader(sys.argv[1], shuffle=True, seed=3, batch_size=5, image_size=32, dtype=torch.uint8,
                            index_cache="off", remote_read="samples", num_workers=1, cache_dir={str(cache)!r}, rank=int(sys.argv[2]),
                            world_size=2, prefetch_next_epoch=False, shuffle_order="exact")
loader.set_epoch(1)
print(sum(int(y.sum()) for _, y in loader))
"""
    with RangeHTTPServer(packed.parent) as http:
        url = http.url + "/shards/" + PATTERN
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [os.path.dirname(gpufeed.__path__[0])] if p))
        runs = [subprocess.Popen([__import__("sys").executable, "-c", script, url, str(r)], stdout=subprocess.PIPE,
                                 env=env, text=True) for r in (0, 1, 0, 1)]
        outs = [p.communicate(timeout=120)[0].strip() for p in runs]
        assert all(p.returncode == 0 for p in runs)
        expected = []
        for rank in (0, 1):
            loader = gpufeed.DataLoader(str(packed / PATTERN), shuffle=True, seed=3, batch_size=5, image_size=32,
                                        dtype=torch.uint8, index_cache="off", rank=rank, world_size=2)
            loader.set_epoch(1)
            expected.append(str(sum(int(y.sum()) for _, y in loader)))
        assert outs == expected * 2
        before = len(http.requests.snapshot())
        for rank in (0, 1):  # everything is cached now
            assert subprocess.run([__import__("sys").executable, "-c", script, url, str(rank)], env=env,
                                  capture_output=True, text=True, timeout=120).stdout.strip() == expected[rank]
        assert shard_gets(http.requests.snapshot()[before:]) == []


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), bit by bit: the checksum the cache records per range."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def cache_records(cache):
    """{.data file: [(offset, size, crc32c)]} as the cache's .ranges files (version 2) list them."""
    out = {}
    for ranges in sorted(cache.glob("*.ranges")):
        lines = ranges.read_text().splitlines()
        assert lines[0].startswith("gpufeed-cache 2 ")
        out[ranges.with_suffix(".data")] = [(int(a), int(b), int(c, 16)) for a, b, c in (x.split() for x in lines[1:])]
    return out


def warm_cache(http, cache):
    """The shards' URL pattern on `http` (serving the packed shards' parent), after one epoch read
    through the local cache `cache`, which it fills."""
    url = http.url + "/shards/" + PATTERN
    _, loader = epoch(url, cache_dir=str(cache), prefetch_next_epoch=False)
    del loader
    return url


def test_damaged_cached_bytes_are_dropped_fetched_again_and_counted(packed, tmp_path, capfd):
    local, _ = epoch(str(packed / PATTERN))
    cache = tmp_path / "cache"
    kw = dict(cache_dir=str(cache), prefetch_next_epoch=False)
    with RangeHTTPServer(packed.parent) as http:
        url = warm_cache(http, cache)
        records = cache_records(cache)
        assert sum(len(r) for r in records.values()) == 27  # a range per sample, each with its checksum
        for data, recs in records.items():
            blob = data.read_bytes()
            assert all(crc32c(blob[o:o + n]) == c for o, n, c in recs)
        # What a power loss (zeroed blocks) and a bad disk (a flipped bit) leave behind while
        # .ranges still lists the bytes: two samples of one shard.
        data = next(d for d, r in records.items() if len(r) >= 2)
        (zero_at, zero_n, _), (flip_at, flip_n, _) = sorted(records[data])[:2]
        blob = bytearray(data.read_bytes())
        blob[zero_at:zero_at + zero_n] = bytes(zero_n)
        blob[flip_at + flip_n // 2] ^= 0x10
        data.write_bytes(bytes(blob))
        capfd.readouterr()
        before = len(http.requests.snapshot())
        second, loader = epoch(url, **kw)
        assert_same(local, second)
        gets = shard_gets(http.requests.snapshot()[before:])
        assert len({path for _, path, _, _ in gets}) == 1
        assert sorted(rng for _, _, rng, _ in gets) == sorted(
            [f"bytes={zero_at}-{zero_at + zero_n - 1}", f"bytes={flip_at}-{flip_at + flip_n - 1}"])
        stats = loader.stats()["remote"]
        assert (stats["cache_checksum_failures"], stats["cache_read_errors"], stats["cache_hits"]) == (2, 0, 25)
        del loader
        err = capfd.readouterr().err
        assert err.count(f"of {data} failed their checksum") == 2 and "fetching them again" in err
        # Fetched again, and cached again: the third run reads everything from the cache.
        before = len(http.requests.snapshot())
        third, loader = epoch(url, **kw)
        assert_same(local, third)
        assert shard_gets(http.requests.snapshot()[before:]) == []
        assert (loader.stats()["remote"]["cache_checksum_failures"], loader.stats()["remote"]["cache_hits"]) == (0, 27)


def test_an_error_after_damaged_cached_bytes_names_the_cache_file(packed, tmp_path):
    cache = tmp_path / "cache"
    with RangeHTTPServer(packed.parent) as http, FaultProxy(http.url) as proxy:
        url = proxy.url + "/shards/" + PATTERN
        _, loader = epoch(url, cache_dir=str(cache), prefetch_next_epoch=False)
        del loader
        for data, recs in cache_records(cache).items():
            blob = bytearray(data.read_bytes())
            for offset, size, _ in recs:
                blob[offset:offset + size] = bytes(size)
            data.write_bytes(bytes(blob))
        loader = gpufeed.DataLoader(url, cache_dir=str(cache), max_retries=0, **COMMON)
        proxy.inject("503", count=10**6, match=shard_path(".tar"), methods=("GET",))
        with pytest.raises(gpufeed.DecodeError) as e:
            next(iter(loader))
        message = str(e.value)
        assert e.value.kind == "io"
        assert "HTTP 503" in message and "the local cache's copy was unusable" in message
        assert re.search(re.escape(str(cache)) + r"/[0-9a-f]{16}\.data failed their checksum", message), message


def test_a_warm_cache_on_a_read_only_mount_is_read_not_fetched_again(packed, tmp_path):
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("no user and mount namespace here (unshare -rm)")
    cache = tmp_path / "cache"
    script = f"""
import json, os, sys, torch, gpufeed
try:
    open(os.path.join({str(cache)!r}, "probe"), "w")
    print("writable")
except OSError as e:
    print("not writable:", e.strerror)
loader = gpufeed.DataLoader(sys.argv[1], shuffle=True, seed=3, batch_size=5, image_size=32, dtype=torch.uint8,
                            index_cache="off", remote_read="samples", num_workers=2, cache_dir={str(cache)!r}, prefetch_next_epoch=False)
loader.set_epoch(1)
print(sum(int(y.sum()) for _, y in loader))
print(json.dumps(loader.stats()["remote"]))
"""
    local, _ = epoch(str(packed / PATTERN))
    with RangeHTTPServer(packed.parent) as http:
        url = warm_cache(http, cache)
        files = {p.name: p.read_bytes() for p in cache.iterdir()}
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [os.path.dirname(gpufeed.__path__[0])] if p))
        # The cache folder bind-mounted read-only over itself in a private mount namespace: not
        # even root writes there (chmod alone would not stop root).
        mount = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
        before = len(http.requests.snapshot())
        run = subprocess.run(["unshare", "-rm", "sh", "-c", mount, "sh", str(cache), sys.executable, "-c", script, url],
                             env=env, capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        probe, labels, stats = run.stdout.strip().splitlines()
        assert probe == "not writable: Read-only file system"
        assert int(labels) == sum(int(y.sum()) for _, y, _ in local)
        assert shard_gets(http.requests.snapshot()[before:]) == []  # every sample from the read-only cache
        assert json.loads(stats)["cache_hits"] == 27
        assert {p.name: p.read_bytes() for p in cache.iterdir()} == files


def test_a_cache_without_checksums_is_not_trusted(packed, tmp_path):
    """A cache written before ranges carried checksums (version 1) cannot be verified: its shards
    are emptied when opened and fetched again."""
    local, _ = epoch(str(packed / PATTERN))
    cache = tmp_path / "cache"
    kw = dict(cache_dir=str(cache), prefetch_next_epoch=False)
    with RangeHTTPServer(packed.parent) as http:
        url = warm_cache(http, cache)
        for ranges in cache.glob("*.ranges"):
            header, *lines = ranges.read_text().splitlines()
            old = [header.replace("gpufeed-cache 2 ", "gpufeed-cache 1 ", 1)] + [" ".join(x.split()[:2]) for x in lines]
            ranges.write_text("\n".join(old) + "\n")
        before = len(http.requests.snapshot())
        second, loader = epoch(url, **kw)
        assert_same(local, second)
        assert len(shard_gets(http.requests.snapshot()[before:])) == 27
        assert loader.stats()["remote"]["cache_hits"] == 0
        del loader
        assert sum(len(r) for r in cache_records(cache).values()) == 27


def pack_list(gpufeed_cli, images, labels, out):
    """`gpufeed pack` of a file list of `images` with `labels` into `out` (7 samples a shard)."""
    listing = out.parent / (out.name + ".txt")
    listing.write_text("".join(f"{p} {label}\n" for p, label in zip(images, labels)))
    subprocess.run([str(gpufeed_cli), "pack", str(listing), str(out), "--max-samples-per-shard", "7", "--index-cache",
                    "off", "--progress", "off", "--overwrite"], check=True, capture_output=True)


def header_reads(requests):
    """Shards whose tar headers were read (the 1 MiB blocks from offset 0)."""
    return sorted(p.rsplit("/", 1)[1] for m, p, r, _ in requests if m == "GET" and r and r.startswith("bytes=0-"))


@pytest.fixture
def relabelled(tmp_path, gpufeed_cli):
    """27 images packed twice into tmp_path/shards, the second time with 9 labels corrected (one
    digit for another: same sizes); returns (the shards folder, a folder holding the first pack's
    shards and indexes, the first labels, the corrected labels)."""
    images = sorted(make_image_folder(tmp_path / "train", per_class=9, seed=11).rglob("*.jpg"))
    old = [i % 3 for i in range(27)]
    new = [(label + 1) % 3 if i % 3 == 0 else label for i, label in enumerate(old)]
    shards = tmp_path / "shards"
    pack_list(gpufeed_cli, images, old, shards)
    (tmp_path / "old").mkdir()
    for p in shards.iterdir():
        (tmp_path / "old" / p.name).write_bytes(p.read_bytes())
    pack_list(gpufeed_cli, images, new, shards)
    for i in range(4):
        name = f"train-{i:06d}.tar"
        assert (shards / name).stat().st_size == (tmp_path / "old" / name).stat().st_size
        assert (shards / name).read_bytes() != (tmp_path / "old" / name).read_bytes()
    return shards, tmp_path / "old", old, new


def test_an_old_index_beside_a_relabelled_shard_is_not_trusted(relabelled, capfd):
    shards, old_folder, old, new = relabelled
    # The old index put back beside the corrected shard: the same size, other labels.
    index = shards / "train-000001.tar.gpufeed-idx"
    index.write_bytes((old_folder / index.name).read_bytes())
    with RangeHTTPServer(shards.parent) as http:
        capfd.readouterr()
        loader = gpufeed.DataLoader(http.url + "/shards/" + PATTERN, **COMMON)
        assert [label for _, label in loader.samples] == new
        assert header_reads(http.requests.snapshot()) == ["train-000001.tar"]
        err = capfd.readouterr().err
        assert f"the index beside {http.url}/shards/train-000001.tar cannot be trusted: it describes another " \
               "version of the shard" in err and "reading its headers instead" in err
        assert err.count("cannot be trusted") == 1


def test_a_half_finished_upload_is_read_from_its_headers(relabelled, capfd):
    shards, old_folder, old, new = relabelled
    # The new indexes are up, shard 2 is still the old one (same size): its own headers say old.
    (shards / "train-000002.tar").write_bytes((old_folder / "train-000002.tar").read_bytes())
    with RangeHTTPServer(shards.parent) as http:
        capfd.readouterr()
        loader = gpufeed.DataLoader(http.url + "/shards/" + PATTERN, **COMMON)
        assert [label for _, label in loader.samples] == new[:14] + old[14:21] + new[21:]
        assert header_reads(http.requests.snapshot()) == ["train-000002.tar"]
        assert f"{http.url}/shards/train-000002.tar cannot be trusted: it describes another version" in capfd.readouterr().err
        # Half of shard 3 is up: no trailer, a size that differs from its index's; its headers say
        # it is cut short.
        whole = (shards / "train-000003.tar").read_bytes()
        (shards / "train-000003.tar").write_bytes(whole[:len(whole) // 2])
        with pytest.raises(RuntimeError, match=r"train-000003\.tar: truncated archive"):
            gpufeed.DataLoader(http.url + "/shards/" + PATTERN, **COMMON)


def test_an_index_without_a_digest_is_not_trusted(packed, tmp_path, capfd):
    """An index of version 1 (before digests) cannot prove which shard it describes: the headers
    are read, with a warning."""
    local, local_loader = epoch(str(packed / PATTERN))
    copy = tmp_path / "shards"
    copy.mkdir()
    for p in packed.iterdir():
        text = p.read_bytes()
        if p.name == "train-000000.tar.gpufeed-idx":
            lines = text.decode().splitlines(keepends=True)
            text = "".join(["gpufeed-shard-index 1\n"] + [x for x in lines[1:] if not x.startswith("sha256 ")]).encode()
        (copy / p.name).write_bytes(text)
    with RangeHTTPServer(tmp_path) as http:
        capfd.readouterr()
        remote, loader = epoch(http.url + "/shards/" + PATTERN)
        assert_same(local, remote)
        assert header_reads(http.requests.snapshot()) == ["train-000000.tar"]
        assert f"{http.url}/shards/train-000000.tar cannot be trusted: it records no digest" in capfd.readouterr().err


@pytest.mark.parametrize("server", ["range", "s3"])
def test_keys_holding_a_question_mark_find_their_index(packed, server, monkeypatch, tmp_path):
    """In an s3:// URL a '?' is part of the key; in an http(s) URL it starts the query, so such a
    key is written %3F (and the index URL keeps the query after the suffix)."""
    local, _ = epoch(str(packed / PATTERN))
    if server == "s3":
        with MotoS3() as s3, FaultProxy(s3.url) as proxy:
            s3.make_bucket("data")
            s3.upload_tree("data", "odd?keys/train", packed)
            for k, v in s3.env(endpoint_url=proxy.url).items():
                monkeypatch.setenv(k, v)
            remote, loader = epoch("s3://data/odd?keys/train/" + PATTERN)
            log = [(e["method"], e["path"], e["headers"].get("Range"), e["status"]) for e in proxy.log.snapshot()]
    else:
        (tmp_path / "odd?keys").mkdir()
        for p in packed.iterdir():
            (tmp_path / "odd?keys" / p.name).write_bytes(p.read_bytes())
        with RangeHTTPServer(tmp_path) as http:
            remote, loader = epoch(http.url + "/odd%3Fkeys/" + PATTERN + "?X-Amz-Signature=abc")
            log = http.requests.snapshot()
    assert_same(local, remote)
    assert header_reads(log) == []
    indexes = sorted(p.split("?X-Amz")[0] for m, p, _, status in log if m == "GET" and ".gpufeed-idx" in p and status == 200)
    assert indexes == [f"/{'data/' if server == 's3' else ''}odd%3Fkeys/{'train/' if server == 's3' else ''}"
                       f"train-{i:06d}.tar.gpufeed-idx" for i in range(4)]
    assert loader.samples[0][0].startswith(("s3://data/odd?keys/train/train-000000.tar:" if server == "s3"
                                            else "http://"))


def test_a_server_that_ignores_ranges_is_an_error_saying_so(packed, capfd):
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(packed.parent))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # no Range support
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # At open, from the first ranged GET (a shard's trailer), once: not a warning per shard and
        # a failure at the first sample read.
        url = f"http://127.0.0.1:{server.server_port}/shards/" + PATTERN
        with pytest.raises(RuntimeError, match=r"ignored the Range request.*honours them") as raised:
            gpufeed.DataLoader(url, **COMMON)
        assert "train-00000" in str(raised.value) and "cannot be trusted" not in capfd.readouterr().err
    finally:
        server.shutdown()
        server.server_close()


# --------------------------------------------------------------------------------------------
# S3 credentials, region and CA bundle as boto3 finds them (botocore is the oracle)

AWS_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_DEFAULT_PROFILE",
            "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CA_BUNDLE",
            "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def aws_home(monkeypatch, home: pathlib.Path, credentials: str, config: str, **env):
    """A private HOME with ~/.aws/credentials and ~/.aws/config, every AWS_* variable unset but `env`."""
    (home / ".aws").mkdir(parents=True, exist_ok=True)
    (home / ".aws" / "credentials").write_text(credentials)
    (home / ".aws" / "config").write_text(config)
    for name in AWS_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def sigv4_signed_with(entry: dict, access_key: str, secret_key: str, token: str | None, region: str) -> bool:
    """Whether a request FaultProxy logged carries an AWS SigV4 signature (S3, UNSIGNED-PAYLOAD) made
    with these credentials in this region: the signature recomputed from the headers it signed."""
    import hashlib
    import hmac
    import re

    headers = {k.lower(): v for k, v in entry["headers"].items()}
    m = re.fullmatch(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/s3/aws4_request, ?"
                     r"SignedHeaders=([^,]+), ?Signature=([0-9a-f]{64})", headers.get("authorization", ""))
    if not m:
        return False
    key, date, scope_region, signed, signature = m.groups()
    if key != access_key or scope_region != region or headers.get("x-amz-security-token") != token:
        return False
    path, _, query = entry["path"].partition("?")
    canonical = "\n".join([entry["method"], path, query,
                           "".join(f"{n}:{' '.join(headers[n].split())}\n" for n in signed.split(";")),
                           signed, headers["x-amz-content-sha256"]])
    scope = f"{date}/{region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", headers["x-amz-date"], scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    k = ("AWS4" + secret_key).encode()
    for part in (date, region, "s3", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return hmac.compare_digest(hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest(), signature)


CREDENTIALS_FILE = """[default]
aws_access_key_id = AKIDDEFAULT000000001
aws_secret_access_key = defaultSecret/0001
[work]
aws_access_key_id = AKIDWORK000000000001
aws_secret_access_key = workSecret+0001
aws_session_token = workSessionToken0001
[ci]
aws_access_key_id = AKIDCI00000000000001
aws_secret_access_key = ciSecret0001
[helper]
credential_process = {python} "{script}" helper-from-credentials-file
"""
CONFIG_FILE = """[default]
region = us-east-1
[profile work]
region = eu-west-1
[profile ci]
region = ap-south-1
[profile sso]
region = us-west-2
credential_process = {python} "{script}" 'sso profile'
[profile helper]
region = eu-central-1
"""
HELPER = """import json, pathlib, sys
calls = pathlib.Path(__file__).with_name("calls")
n = int(calls.read_text()) + 1 if calls.exists() else 1
calls.write_text(str(n))
json.dump({"Version": 1, "AccessKeyId": "AKIDPROC%012d" % n, "SecretAccessKey": "procSecret/" + sys.argv[1],
           "SessionToken": "procToken-" + sys.argv[1].replace(" ", "_")}, sys.stdout)
"""


@pytest.mark.parametrize("setting", ["AWS_PROFILE", "AWS_DEFAULT_PROFILE", "both", "credential_process",
                                     "credential_process_in_credentials_file", "default"])
def test_s3_credentials_and_region_are_those_boto3_resolves(packed, monkeypatch, tmp_path, setting):
    import sys

    import boto3

    script = tmp_path / "helper dir" / "helper.py"  # a space in the path: the command line is split as a shell would
    script.parent.mkdir()
    script.write_text(HELPER)
    env = {"AWS_PROFILE": {"AWS_PROFILE": "work"}, "AWS_DEFAULT_PROFILE": {"AWS_DEFAULT_PROFILE": "work"},
           "both": {"AWS_PROFILE": "work", "AWS_DEFAULT_PROFILE": "ci"}, "credential_process": {"AWS_PROFILE": "sso"},
           "credential_process_in_credentials_file": {"AWS_PROFILE": "helper"}, "default": {}}[setting]
    with MotoS3() as s3, FaultProxy(s3.endpoint_url) as proxy:
        s3.make_bucket("creds")
        s3.upload_tree("creds", "train", packed)
        aws_home(monkeypatch, tmp_path / "home", CREDENTIALS_FILE.format(python=sys.executable, script=script),
                 CONFIG_FILE.format(python=sys.executable, script=script), AWS_ENDPOINT_URL=proxy.url, **env)
        session = boto3.Session()
        expected = session.get_credentials().get_frozen_credentials()
        region = session.region_name
        (script.parent / "calls").unlink(missing_ok=True)  # gpufeed runs the helper again: the same keys
        gpufeed.DataLoader("s3://creds/train/" + PATTERN, **COMMON)
        requests = [e for e in proxy.log if e["path"].startswith("/creds/train/")]
        assert len(requests) == 12  # a HEAD, an index GET and a trailer GET per shard
        for e in requests:
            assert sigv4_signed_with(e, expected.access_key, expected.secret_key, expected.token, region), \
                (setting, e["headers"].get("Authorization"), expected.access_key, region)
        if setting.startswith("credential_process"):
            assert (script.parent / "calls").read_text() == "1"  # run once, not per request


def test_a_failing_credential_process_names_the_profile_and_its_error(packed, monkeypatch, tmp_path):
    helper = tmp_path / "helper.sh"
    helper.write_text("#!/bin/sh\necho 'Error loading SSO Token: Token for ml does not exist' >&2\n"
                      "echo 'more detail' >&2\nexit 255\n")
    helper.chmod(0o700)
    with RangeHTTPServer(packed.parent) as http:
        aws_home(monkeypatch, tmp_path / "home", "",
                 f"[profile ml]\ncredential_process = {helper} --secret-arg hunter2\n", AWS_PROFILE="ml")
        with pytest.raises(RuntimeError) as e:
            gpufeed.DataLoader("s3://shards/" + PATTERN, endpoint_url=http.url, **COMMON)
        assert str(e.value) == (f"remote shards: cannot open HEAD s3://shards/train-000000.tar: the credential_process of "
                                f"AWS profile 'ml' ({helper}) failed: exit status 255: Error loading SSO Token: Token "
                                f"for ml does not exist")
        assert http.requests.snapshot() == []  # nothing was sent unsigned


def test_credentials_from_a_process_are_refreshed_when_they_expire(packed, monkeypatch, tmp_path):
    """The process's credentials expire 6 s after they are printed: the requests after that carry new ones."""
    import sys

    script = tmp_path / "helper.py"
    script.write_text("""import datetime, json, pathlib
calls = pathlib.Path(__file__).with_name("calls")
n = int(calls.read_text()) + 1 if calls.exists() else 1
calls.write_text(str(n))
expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=6)
pathlib.Path(__file__).with_name("expires").write_text(str(expires.timestamp()))
print(json.dumps({"Version": 1, "AccessKeyId": "AKIDROTATING%08d" % n, "SecretAccessKey": "s%d" % n,
                  "Expiration": expires.isoformat()}))
""")
    with MotoS3() as s3, FaultProxy(s3.endpoint_url) as proxy:
        s3.make_bucket("rotating")
        s3.upload_tree("rotating", "train", packed)
        aws_home(monkeypatch, tmp_path / "home", "", f"[default]\ncredential_process = {sys.executable} {script}\n",
                 AWS_ENDPOINT_URL=proxy.url)
        loader = gpufeed.DataLoader("s3://rotating/train/" + PATTERN, **COMMON)
        opened = len(proxy.log)
        first_key = proxy.log[0]["headers"]["Authorization"].split("Credential=")[1].split("/")[0]
        assert first_key == "AKIDROTATING00000001"
        expires = float((tmp_path / "expires").read_text())
        while time.time() < expires + 0.5:
            time.sleep(0.1)
        assert sum(1 for _ in loader) == 6
        later = {e["headers"]["Authorization"].split("Credential=")[1].split("/")[0] for e in proxy.log[opened:]}
        assert later and "AKIDROTATING00000001" not in later
        assert int((tmp_path / "calls").read_text()) >= 2


def test_without_credentials_requests_go_unsigned_and_a_403_says_where_credentials_were_looked_for(
        packed, monkeypatch, tmp_path):
    home = tmp_path / "home"
    with RangeHTTPServer(packed.parent, forbidden=["shards/train-000002.tar"]) as http, FaultProxy(http.url) as proxy:
        aws_home(monkeypatch, home, "", "[profile other]\nregion = eu-west-1\n", AWS_PROFILE="ml")
        # A public bucket: unsigned requests read it.
        assert sum(1 for _ in gpufeed.DataLoader("s3://shards/train-{000000..000001}.tar", endpoint_url=proxy.url,
                                                 **COMMON)) == 3
        assert proxy.log and not any("Authorization" in e["headers"] for e in proxy.log)
        with pytest.raises(RuntimeError) as e:
            gpufeed.DataLoader("s3://shards/" + PATTERN, endpoint_url=proxy.url, **COMMON)
        assert str(e.value) == (
            "remote shards: cannot open HEAD s3://shards/train-000002.tar: HTTP 403: access denied to an unsigned "
            "request: no AWS credentials were found (looked at AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (unset); "
            f"profile 'ml' (AWS_PROFILE); the shared credentials file {home}/.aws/credentials (empty); the profile's "
            f"credential_process (none); the config file {home}/.aws/config (no such profile))")


@pytest.mark.parametrize("where", ["profile", "AWS_CA_BUNDLE", "none"])
def test_the_profiles_ca_bundle_verifies_an_https_endpoint(packed, monkeypatch, tmp_path, where):
    from remote_servers import self_signed_cert

    cert, key = self_signed_cert(tmp_path)
    with RangeHTTPServer(packed.parent, tls=(cert, key)) as https:
        config = f"[default]\nendpoint_url = {https.url}\n" + (f"ca_bundle = {cert}\n" if where == "profile" else "")
        aws_home(monkeypatch, tmp_path / "home", "", config, **({"AWS_CA_BUNDLE": cert} if where == "AWS_CA_BUNDLE" else {}))
        if where == "none":  # the system's CAs do not know the test's certificate
            # (the shard's HEAD or its index's GET: whichever fails first)
            with pytest.raises(RuntimeError, match=r" s3://shards/train-00000\d.tar(.gpufeed-idx)?: .*certificate"):
                gpufeed.DataLoader("s3://shards/" + PATTERN, **COMMON)
        else:
            remote, _ = epoch("s3://shards/" + PATTERN)
            local, _ = epoch(str(packed / PATTERN))
            assert_same(local, remote)


@pytest.mark.parametrize("where", ["SSL_CERT_FILE", "SSL_CERT_DIR", "none"])
def test_ssl_cert_file_and_dir_verify_an_https_server(monkeypatch, tmp_path, where):
    """A shard (made here with tarfile: no index, read from its tar headers) over https with a
    self-signed certificate: trusted through SSL_CERT_FILE (CURLOPT_CAINFO) or a c_rehash-style
    SSL_CERT_DIR (CURLOPT_CAPATH); without either, the system's CAs refuse it."""
    from PIL import Image
    from remote_servers import self_signed_cert

    (tmp_path / "shards").mkdir()
    with tarfile.open(tmp_path / "shards" / "train-000000.tar", "w") as tar:
        for i in range(7):
            jpeg = io.BytesIO()
            Image.new("RGB", (40, 30), (i * 30, 90, 200 - i * 20)).save(jpeg, "JPEG")
            for name, data in ((f"s{i:03d}.jpg", jpeg.getvalue()), (f"s{i:03d}.cls", str(i % 3).encode())):
                member = tarfile.TarInfo(name)
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
    cert, key = self_signed_cert(tmp_path)
    for name in ("AWS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR"):
        monkeypatch.delenv(name, raising=False)
    if where == "SSL_CERT_FILE":
        monkeypatch.setenv("SSL_CERT_FILE", cert)
    elif where == "SSL_CERT_DIR":
        digest = subprocess.run(["openssl", "x509", "-hash", "-noout", "-in", cert], capture_output=True, text=True,
                                check=True).stdout.strip()
        (tmp_path / "certs").mkdir()
        os.symlink(cert, tmp_path / "certs" / f"{digest}.0")
        monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path / "certs"))
    with RangeHTTPServer(tmp_path, tls=(cert, key)) as https:
        url = f"{https.url}/shards/train-000000.tar"
        if where == "none":
            # the shard's HEAD or its index's GET, whichever fails first
            failed = r"(HEAD|GET) https://127\.0\.0\.1:\d+/shards/train-000000\.tar(\.gpufeed-idx)?: .*certificate"
            with pytest.raises(RuntimeError, match=failed):
                gpufeed.DataLoader(url, **COMMON)
        else:
            labels = sorted(int(v) for _, y in gpufeed.DataLoader(url, **COMMON) for v in y)
            assert labels == [0, 0, 0, 1, 1, 2, 2]


# --------------------------------------------------------------------------------------------
# Fail fast, fetch only what is used

def test_opening_many_shards_stops_at_the_first_missing_one(packed, tmp_path):
    """2,000 URLs (one shard under 2,000 names: the range server ignores the query) with a missing
    one 11th: the open stops issuing HEADs and index GETs once its 404 is in, and names it."""
    window = 4
    urls = [f"train-000000.tar?copy={i}" for i in range(2000)]
    urls[10] = "missing.tar"
    with RangeHTTPServer(packed.parent) as http:
        (tmp_path / "urls.txt").write_text("".join(f"{http.url}/shards/{u}\n" for u in urls))
        with pytest.raises(RuntimeError) as e:
            gpufeed.DataLoader(str(tmp_path / "urls.txt"), max_requests=window, **COMMON)
        assert str(e.value).startswith(f"remote shards: cannot open HEAD {http.url}/shards/missing.tar: HTTP 404")
        seen = http.requests.snapshot()
        failure = seen.index(("HEAD", "/shards/missing.tar", None, 404))
        # After it, at most those in flight when it failed (the client's window). Before it, the
        # HEADs and index GETs of the 10 shards before it and the window's in flight, and, on a busy
        # machine where the server's thread for the 404 runs late, those of later shards answered
        # meanwhile (39 in all beside two CPU hogs): bounded far below the 4,000 the open would send.
        assert len(seen) - failure - 1 <= 2 * window
        assert len(seen) <= 400


def test_the_next_epoch_is_read_ahead_only_as_far_as_the_free_slots(packed):
    """E epochs: the shards' bytes fetched are the E epochs' samples plus at most prefetch_depth
    batches of the epoch after (decoded ahead into free slots, docs/SCALING.md), never that epoch."""
    ranges = sample_ranges(packed)
    epochs, depth = 3, 2
    with RangeHTTPServer(packed.parent) as http:
        loader = gpufeed.DataLoader(http.url + "/shards/" + PATTERN, shuffle=True, seed=5, prefetch_depth=depth,
                                    **COMMON)
        used = []
        for e in range(epochs):
            loader.set_epoch(e)
            for _ in loader:
                used += list(loader.last_batch["indices"])
        time.sleep(0.5)  # the epoch after's reads in flight, had they been issued
        del loader
        gc.collect()
        fetched = requested(http.requests.snapshot(), ranges)
    assert len(used) == epochs * 27
    counts = {i: fetched.count(i) for i in set(fetched)}
    assert all(counts.get(i, 0) >= used.count(i) for i in set(used))
    extra = len(fetched) - len(used)
    assert 0 <= extra <= depth * COMMON["batch_size"]
    sizes = {i: b - a + 1 for i, (_, a, b) in enumerate(ranges)}
    extra_bytes = sum(sizes[i] for i in fetched) - sum(sizes[i] for i in used)
    assert extra_bytes <= sum(sorted(sizes.values())[-depth * COMMON["batch_size"]:])


def test_bench_dump_reads_remote_shards(packed, tmp_path, gpufeed_cli):
    """`gpufeed bench --dump` (and --mode floor, which preloads) over URLs read through the dataset,
    as the loader does: the same pixels and plans as over the same shards on the local disk."""
    args = ["--batch-size", "5", "--image-size", "32", "--index-cache", "off", "--num-workers", "1", "--json"]
    with RangeHTTPServer(packed.parent) as http:
        outputs = {}
        for name, data in (("local", str(packed / PATTERN)), ("remote", http.url + "/shards/" + PATTERN)):
            dump = tmp_path / f"{name}.bin"
            run = subprocess.run([str(gpufeed_cli), "bench", "--data", data, "--dump", str(dump), *args],
                                 capture_output=True, text=True, timeout=120)
            assert run.returncode == 0, run.stderr
            floor = subprocess.run([str(gpufeed_cli), "bench", "--data", data, "--mode", "floor", *args],
                                   capture_output=True, text=True, timeout=120)
            assert floor.returncode == 0, floor.stderr
            import json
            meta = json.loads((tmp_path / f"{name}.bin.json").read_text())
            outputs[name] = (dump.read_bytes(), meta, json.loads(floor.stdout)["samples"])
    (local_pixels, local_meta, local_floor), (remote_pixels, remote_meta, remote_floor) = outputs["local"], outputs["remote"]
    assert len(remote_pixels) == 27 * 32 * 32 * 3 and remote_pixels == local_pixels
    assert remote_floor == local_floor == 27
    for a, b in zip(local_meta["samples"], remote_meta["samples"]):
        assert b["path"].startswith(http.url + "/shards/train-")
        assert b["path"].split(".tar:")[1] == a["path"].split(".tar:")[1]
        assert {k: v for k, v in a.items() if k != "path"} == {k: v for k, v in b.items() if k != "path"}


def test_shard_reads_fetch_each_shard_once_and_give_the_local_disks_batches(packed):
    """remote_read: auto takes whole shards for the unshuffled order (one GET per shard, 4 here),
    ranged GETs for DistributedSampler's shuffled one when its window is smaller than the shards it
    keeps open; shards forced on the shuffled order still gives the local batches."""
    kw = dict(COMMON, prefetch_next_epoch=False)
    del kw["remote_read"]
    local = [(list(i), y, x) for i, y, x in _epoch_batches(gpufeed.DataLoader(str(packed / PATTERN), shuffle=False, **kw))]
    with RangeHTTPServer(packed.parent) as http:
        url = http.url + "/shards/" + PATTERN
        before = len(http.requests.snapshot())
        loader = gpufeed.DataLoader(url, shuffle=False, **kw)  # remote_read="auto", the default
        assert_same(local, _epoch_batches(loader))
        gets = shard_gets(http.requests.snapshot()[before:])
        assert sorted(p for _, p, _, _ in gets) == [f"/shards/train-00000{s}.tar" for s in range(4)]
        stats = loader.stats()["remote"]
        assert (stats["chunks_fetched"], stats["chunks_refetched"]) == (4, 0)
        assert 0 < stats["peak_held_bytes"] <= stats["dataset_bytes"]
        assert stats["dataset_bytes"] == sum((packed / f"train-00000{s}.tar").stat().st_size for s in range(4))
        del loader
        shuffled_local, _ = epoch(str(packed / PATTERN), prefetch_next_epoch=False)
        for mode, window in (("auto", 1), ("shards", 1), ("shards", 16)):
            remote, loader = epoch(url, remote_read=mode, remote_shards_in_flight=window, prefetch_next_epoch=False)
            assert_same(shuffled_local, remote)
            fetched = loader.stats()["remote"]["chunks_fetched"]
            if mode == "auto":
                assert fetched == 0  # 4 shards open at once > 1: ranged GETs
            elif window == 16:
                assert fetched == 4  # every shard fits the window: each fetched once
            else:
                assert 4 < fetched <= 2 * 27  # fetched again, within the documented bound
            del loader


def _epoch_batches(loader):
    loader.set_epoch(1)
    return [(list(loader.last_batch["indices"]), y.clone(), x.clone()) for x, y in loader]
