"""gpufeed.DataLoader over remote shards (docs/SCALING.md, "Remote data"): HTTP from our own range
server and from nginx, S3 from moto's server, all on 127.0.0.1 and started here; faults injected by
remote_servers.FaultProxy. Remote batches equal the same shards' batches from the local disk, byte
for byte; every fault kind is retried or fails naming the URL; secrets stay out of every output."""
import contextlib
import faulthandler
import gc
import io
import os
import pathlib
import signal
import subprocess
import tarfile
import threading
import time

import pytest
import torch

import gpufeed
from conftest import make_image_folder
from remote_servers import FaultProxy, MotoS3, NginxServer, RangeHTTPServer

PATTERN = "train-{000000..000003}.tar"
COMMON = dict(batch_size=5, image_size=32, dtype=torch.uint8, index_cache="off", num_workers=2)


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
        assert lines[0] == "gpufeed-shard-index 1"
        for line in lines[3:]:
            offset, size, _label, _member = line.split(" ", 3)
            out.append((idx.name[:-len(".gpufeed-idx")], int(offset), int(offset) + int(size) - 1))
    return out


def requested(requests, ranges):
    """The samples a server's ranged GETs covered, in request order."""
    by_start = {(shard, first): i for i, (shard, first, _) in enumerate(ranges)}
    out = []
    for method, path, rng, status in requests:
        if method != "GET" or not path.endswith(".tar"):
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
        gets = [r for r in http.requests.snapshot()[before:] if r[0] == "GET" and r[1].endswith(".tar")]
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
        proxy.inject("500", count=10**6, match=shard_path("train-000001.tar"), methods=("GET",))
        remote, loader = epoch(proxy.url + "/shards/" + PATTERN, on_error="skip", max_skips=100, max_retries=0)
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
        started = time.monotonic()
        with pytest.raises(RuntimeError) as e:
            gpufeed.DataLoader(url, **COMMON)
        assert time.monotonic() - started < 5  # not retried
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
        assert time.monotonic() - started < 3
        started = time.monotonic()
        del it, loader
        gc.collect()
        assert time.monotonic() - started < 3


def test_ctrl_c_while_opening_returns_promptly_while_the_heads_stall(packed):
    with RangeHTTPServer(packed.parent) as http, FaultProxy(http.url) as proxy:
        proxy.stall_s = 60
        proxy.inject("stall", count=10**6, match=shard_path(".tar"), methods=("HEAD",))
        with ctrl_c_after(1.0) as started:
            gpufeed.DataLoader(proxy.url + "/shards/" + PATTERN, request_timeout=60, **COMMON)
        assert 0.9 < time.monotonic() - started < 3
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
        # Failing runs: retries exhausted (skip policy: each failure logged), then raised.
        proxy.inject("503", count=10**6, match=shard_path("train-000003.tar"), methods=("GET",))
        _, skipping = epoch("s3://private/train/" + PATTERN, on_error="skip", max_retries=1)
        outputs.append(repr(skipping.epoch_summary()))
        assert skipping.epoch_summary()["skipped"] > 0
        with pytest.raises(gpufeed.DecodeError) as e:
            epoch("s3://private/train/" + PATTERN, max_retries=1)
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
    return [r for r in requests if r[0] == "GET" and r[1].endswith(".tar")]


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
                            index_cache="off", num_workers=1, cache_dir={str(cache)!r}, rank=int(sys.argv[2]),
                            world_size=2, prefetch_next_epoch=False)
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


def test_a_server_that_ignores_ranges_is_an_error_saying_so(packed):
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(packed.parent))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # no Range support
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        loader = gpufeed.DataLoader(f"http://127.0.0.1:{server.server_port}/shards/" + PATTERN, **COMMON)
        with pytest.raises(gpufeed.DecodeError, match="ignored the Range request"):
            next(iter(loader))
    finally:
        server.shutdown()
        server.server_close()
