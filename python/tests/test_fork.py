"""fork() and gpufeed: a child forked after the parent's loaders are gone makes and iterates its own;
a child forked while a loader is alive gets a clear error at once, never a hang; forked
torch.utils.data.DataLoader workers decode with gpufeed.decode_image."""
import multiprocessing
import os
import subprocess
import sys
import time

import pytest
import torch

import gpufeed

TIMEOUT_S = 60


def child_epoch(folder, queue):
    try:
        loader = gpufeed.DataLoader(folder, batch_size=4, image_size=16, dtype=torch.uint8, num_workers=2)
        queue.put(("ok", sum(len(labels) for _, labels in loader)))
    except Exception as e:  # reported to the parent, which asserts on it
        queue.put((type(e).__name__, str(e)))


def run_forked_child(folder):
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=child_epoch, args=(str(folder), queue))
    proc.start()
    proc.join(TIMEOUT_S)
    if proc.is_alive():
        proc.kill()
        proc.join()
        pytest.fail(f"the forked child hung for {TIMEOUT_S} s")
    assert proc.exitcode == 0
    return queue.get(timeout=5)


def iterate_a_loader(folder):
    loader = gpufeed.DataLoader(folder, batch_size=4, image_size=16, num_workers=2)
    assert sum(len(labels) for _, labels in loader) == 27


def test_a_child_forked_after_the_loaders_are_gone_runs_its_own(folder):
    iterate_a_loader(folder)  # the loader is deleted on return
    assert run_forked_child(folder) == ("ok", 27)
    iterate_a_loader(folder)  # the parent makes a new pool afterwards
    pid = os.fork()  # os.fork itself, not multiprocessing
    if pid == 0:
        code = 1
        try:
            loader = gpufeed.DataLoader(folder, batch_size=4, image_size=16, num_workers=2)
            code = 0 if sum(len(labels) for _, labels in loader) == 27 else 2
        finally:
            os._exit(code)
    for _ in range(TIMEOUT_S * 10):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.1)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the os.fork() child hung")
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_child_forked_while_a_loader_lives_gets_a_clear_error_at_once(folder):
    alive = gpufeed.DataLoader(folder, batch_size=4, image_size=16, num_workers=2)
    next(iter(alive))
    kind, message = run_forked_child(folder)
    assert kind == "RuntimeError"
    assert "forked" in message and "'spawn'" in message, message
    del alive
    iterate_a_loader(folder)


def test_forked_torch_dataloader_workers_decode_with_gpufeed(folder):
    """torch.utils.data.DataLoader(num_workers=2) workers (fork) calling gpufeed.decode_image while
    the parent's gpufeed loader is alive."""
    alive = gpufeed.DataLoader(folder, batch_size=4, image_size=16, num_workers=2)
    next(iter(alive))
    paths = [p for p, _ in alive.samples]

    class Files(torch.utils.data.Dataset):
        def __len__(self):
            return len(paths)

        def __getitem__(self, i):
            return gpufeed.decode_image(paths[i]).sum(dtype=torch.int64)

    workers = torch.utils.data.DataLoader(Files(), batch_size=5, num_workers=2, multiprocessing_context="fork",
                                          timeout=TIMEOUT_S)
    sums = torch.cat(list(workers)).tolist()
    assert sums == [gpufeed.decode_image(p).sum(dtype=torch.int64).item() for p in paths]


INHERITED = """
import os, sys, time, torch, gpufeed
use = sys.argv[2]
alive = gpufeed.DataLoader(sys.argv[1], batch_size=4, image_size=16, num_workers=2, dtype=torch.uint8)
it = iter(alive)
first = next(it)  # a batch held, the rest of the epoch in flight
expected = alive.dataset[3][0]
pid = os.fork()
if pid == 0:
    code = 0
    if use == "close":
        alive.close()
    elif use == "del":
        del first, it, alive
    elif use in ("next", "iter", "stats"):
        try:
            next(it) if use == "next" else iter(alive) if use == "iter" else alive.stats()
            code = 4
        except RuntimeError as e:
            code = 0 if "fork()" in str(e) and "'spawn'" in str(e) else 5
    elif use == "dataset":
        code = 0 if torch.equal(alive.dataset[3][0], expected) else 6
    sys.exit(code)  # a whole interpreter exit: atexit, module teardown, the loader's destructor
_, status = os.waitpid(pid, 0)
rest = sum(1 for _ in it)
print("child", os.waitstatus_to_exitcode(status), "rest", rest)
"""


@pytest.mark.parametrize("use", ["exit", "close", "del", "next", "iter", "stats", "dataset"])
def test_a_loader_inherited_through_fork_never_hangs_the_child(folder, use):
    """The child of a process with a running loader: exiting with it, closing or deleting it
    return at once; using it raises RuntimeError naming fork() and the spawn method; its dataset's
    items still load. The parent's epoch goes on."""
    proc = subprocess.run([sys.executable, "-c", INHERITED, str(folder), use], capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["child", "0", "rest", "6"], proc.stdout + proc.stderr
    assert "leaked" not in proc.stderr, proc.stderr
