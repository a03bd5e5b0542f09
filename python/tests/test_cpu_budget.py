"""The default thread count honours the process's CPU budget (gpufeed/cpu_budget.h): under
`taskset -c 0` the DataLoader and `gpufeed bench` run one loader thread, not one per host core."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import make_image_folder

TASKSET = shutil.which("taskset")
needs_taskset = pytest.mark.skipif(TASKSET is None, reason="util-linux's taskset is not installed")

PROBE = """
import sys, gpufeed
loader = gpufeed.DataLoader(sys.argv[1], batch_size=4, image_size=32, index_cache="off")
print(loader.stats()["threads"])
"""


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return make_image_folder(tmp_path_factory.mktemp("budget") / "train", classes=("a", "b"), per_class=3)


def threads_of(small, prefix):
    proc = subprocess.run(prefix + [sys.executable, "-c", PROBE, str(small)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip().splitlines()[-1])


@needs_taskset
def test_dataloader_default_threads_follow_the_affinity_mask(small):
    assert threads_of(small, [TASKSET, "-c", "0"]) == 1
    # Unpinned: the budget, which never exceeds the CPUs this process may run on.
    unpinned = threads_of(small, [])
    assert 1 <= unpinned <= len(os.sched_getaffinity(0))
    if len(os.sched_getaffinity(0)) >= 2:
        assert threads_of(small, [TASKSET, "-c", "0,1"]) == min(2, unpinned)


@needs_taskset
def test_bench_default_threads_and_the_num_workers_warning_under_taskset(small, gpufeed_cli):
    cmd = [TASKSET, "-c", "0", str(gpufeed_cli), "bench", "--data", str(small), "--epochs", "1", "--warmup", "0",
           "--batch-size", "2", "--image-size", "32", "--index-cache", "off", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    record = json.loads(proc.stdout)
    assert record["threads"] == 1, record
    proc = subprocess.run(cmd + ["--num-workers", "2"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "loader: num_workers 2 exceeds this process's CPU budget of 1 CPU (affinity mask: 1 of " in proc.stderr
