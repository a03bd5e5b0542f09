#!/usr/bin/env python3
"""num_workers=auto against fixed thread counts, for consumers of known speed.

`gpufeed bench --consumer-ms X` holds each batch X ms (a sleep: a training step that needs no
CPU), so the loader feeds a consumer of fixed rate. This script measures T, one thread's time
per batch, then runs three step times side by side, each with every fixed num_workers from 1 to
the CPU budget and with auto:

  2.0 T   one thread is enough (half busy)
  0.75 T  one thread is not: two are (on 2 CPUs, 67% busy each)
  0.2 T   no count within the budget keeps up (input-bound)

and prints, per run: the threads used at the end, images/s, the consumer's data wait, CPU
seconds per epoch. The targets it checks: auto's data wait
< 1% wherever a fixed count reaches it, with no more threads than the smallest fixed count that
does; where none does, auto runs the whole budget; and, with the next epoch decoded ahead (the
default), each epoch's first batch waits no longer than max(2 ms, twice the mean wait of the
other batches). These are the end-to-end checks of the autotuner on real clocks; the unit tests
(tests/test_loader.cpp) check its decisions on given measurements only, which no machine's load
can change.

  .venv/bin/python tools/bench/bench_autotune.py [--data DIR] [--batch-size 32] [--epochs 2] [--json OUT]

The data: ../shared/data/imagenet-sample when present, else a synthetic ImageFolder written
with `gpufeed make-dataset` into a temporary folder.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]


def bench(cli, data, batch, workers, consumer_ms, epochs, image_size, *extra):
    cmd = [str(cli), "bench", "--data", str(data), "--batch-size", str(batch), "--num-workers", str(workers),
           "--consumer-ms", f"{consumer_ms:g}", "--epochs", str(epochs), "--warmup", "1", "--image-size",
           str(image_size), "--index-cache", "off", "--json", *extra]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        sys.exit(f"bench_autotune: {' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", type=pathlib.Path, default=ROOT / "build/release/tools/gpufeed")
    ap.add_argument("--data", type=pathlib.Path, default=None)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--factors", default="2.0,0.75,0.2", help="step times as multiples of T")
    ap.add_argument("--json", type=pathlib.Path, help="write every record here")
    a = ap.parse_args()
    tmp = None
    data = a.data
    if data is None:
        sample = ROOT.parent / "shared" / "data" / "imagenet-sample"
        if sample.is_dir():
            data = sample
        else:
            tmp = tempfile.TemporaryDirectory(prefix="gpufeed_autotune_")
            data = pathlib.Path(tmp.name) / "train"
            print(f"bench_autotune: {sample} is absent; writing a synthetic ImageFolder to {data}")
            subprocess.run([str(a.cli), "make-dataset", "--out", str(data), "--classes", "10", "--per-class", "60",
                            "--min-size", "300", "--max-size", "500"], check=True, capture_output=True)
    one = bench(a.cli, data, a.batch_size, 1, 0, a.epochs, a.image_size)
    t_ms = a.batch_size / one["images_per_s"] * 1e3
    budget = bench(a.cli, data, a.batch_size, 0, 0, 1, a.image_size)["threads"]
    print(f"data {data}: {one['files']} files, batch {a.batch_size}, {a.image_size} px; one thread: "
          f"{one['images_per_s']:.0f} images/s, T = {t_ms:.1f} ms a batch; CPU budget {budget}")
    rows, records, failures = [], [], []
    for factor in (float(f) for f in a.factors.split(",")):
        step = factor * t_ms
        runs = {}
        for workers in [*range(1, budget + 1), "auto"]:
            r = bench(a.cli, data, a.batch_size, workers, step, a.epochs, a.image_size)
            r["factor"] = factor
            records.append(r)
            runs[workers] = r
            rows.append((f"{factor:g} T = {step:.1f}", str(workers), r["threads"], len(r["thread_decisions"]),
                         r["images_per_s"], 100 * r["data_wait_fraction"], r["cpu_s_per_epoch"]))
        meeting = [w for w in range(1, budget + 1) if runs[w]["data_wait_fraction"] < 0.01]
        auto = runs["auto"]
        if meeting:
            ok = auto["data_wait_fraction"] < 0.01 and auto["threads"] <= min(meeting)
            verdict = (f"fixed counts under 1% wait: {meeting}; auto ended at {auto['threads']} threads, "
                       f"wait {100 * auto['data_wait_fraction']:.2f}%: {'met' if ok else 'MISSED'}")
        else:
            ok = auto["threads"] == budget
            verdict = (f"no fixed count under 1% wait (input-bound); auto ended at {auto['threads']} of "
                       f"{budget}: {'met' if ok else 'MISSED'}")
        if not ok:
            failures.append(verdict)
        rows.append((f"  -> {verdict}",))
    print(f"\n| step (ms) | num_workers | threads at end | decisions | images/s | data wait | CPU s / epoch |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for row in rows:
        if len(row) == 1:
            print(f"| {row[0]} | | | | | | |")
        else:
            print(f"| {row[0]} | {row[1]} | {row[2]} | {row[3]} | {row[4]:.0f} | {row[5]:.2f}% | {row[6]:.2f} |")
    # Epoch starts: the wait for each timed epoch's first batch, with the next epoch decoded ahead
    # (the default) and without (--no-prefetch-next-epoch), beside the mean wait of the other
    # batches, for the one-thread-is-enough step.
    print("\n| epoch starts, 2.0 T step, 1 thread | first-batch wait per timed epoch (ms) | mean wait, other batches (ms) |")
    print("|---|---|---:|")
    for label, extra in (("next epoch decoded ahead", ()), ("--no-prefetch-next-epoch", ("--no-prefetch-next-epoch",))):
        r = bench(a.cli, data, a.batch_size, 1, 2.0 * t_ms, max(a.epochs, 3), a.image_size, *extra)
        records.append(dict(r, factor=2.0, epoch_starts=label))
        firsts = r["first_batch_wait_s"]
        others = (r["data_wait_s"] - sum(firsts)) / max(1, r["batches"] - len(firsts))
        print(f"| {label} | {', '.join(f'{1e3 * f:.1f}' for f in firsts)} | {1e3 * others:.2f} |")
        # The target: with the next epoch decoded ahead, an epoch starts without a stall (its
        # first batch waits no longer than a mid-epoch one, or 2 ms).
        if not extra and max(firsts, default=0) > max(0.002, 2 * others):
            failures.append(f"epoch starts with the next epoch decoded ahead: first-batch waits "
                            f"{', '.join(f'{1e3 * f:.1f}' for f in firsts)} ms against a mean of "
                            f"{1e3 * others:.2f} ms for the other batches: MISSED")
    if a.json:
        a.json.write_text(json.dumps(records, indent=1))
    if failures:
        print("\nbench_autotune: targets missed:\n  " + "\n  ".join(failures))
        return 1
    print("\nbench_autotune: every target met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
