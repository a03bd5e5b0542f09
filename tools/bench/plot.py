#!/usr/bin/env python3
"""Draw gpufeed's metrics as PNGs.

  plot.py METRICS.jsonl --out DIR    # from `gpufeed train --metrics METRICS.jsonl`
      DIR/throughput.png   images/s over training time
      DIR/data_wait.png    fraction of step time spent waiting for data
      DIR/gpu.png          GPU utilization (NVML) and busy fraction (CUDA events); CPU runs say so
      DIR/breakdown.png    mean step time by phase (data wait, H2D/convert, forward+backward, ...)
      DIR/summary.png      the four panels above in one figure, with the run's verdict
  plot.py --bench BENCH.json --out DIR   # from `gpufeed bench --num-workers 1,2,4 --json`
      DIR/scaling.png      loader images/s against threads, with ideal linear scaling

Needs matplotlib (setup.sh installs it into .venv). Prints the files it wrote.
"""
import argparse
import json
import os
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PHASES = [  # record key, label, colour
    ("data_wait_ms", "data wait", "#d62728"),
    ("h2d_ms", "H2D copy / convert", "#ff7f0e"),
    ("compute_ms", "forward+backward", "#1f77b4"),
    ("allreduce_ms", "all-reduce", "#9467bd"),
    ("optimizer_ms", "optimizer", "#2ca02c"),
    ("other_ms", "other (loss, metrics)", "#7f7f7f"),
]


def read_metrics(path):
    records = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"plot.py: {path}:{n}: not JSON ({e})")
    run = next((r for r in records if r.get("type") == "run"), {})
    steps = [r for r in records if r.get("type") == "steps"]
    epochs = [r for r in records if r.get("type") == "epoch"]
    summary = next((r for r in records if r.get("type") == "summary"), None)
    if not steps:
        sys.exit(f"plot.py: {path} has no 'steps' records (was it written by gpufeed train --metrics?)")
    return run, steps, epochs, summary


def title(run):
    parts = [run.get("model", ""), run.get("device", "")]
    if run.get("batch_size"):
        parts.append(f"batch {run['batch_size']}")
    if run.get("num_workers"):
        parts.append(f"{run['num_workers']} loader threads")
    return ", ".join(p for p in parts if p)


def mark_epochs(ax, epochs):
    for e in epochs[:-1]:
        ax.axvline(e["t_s"], color="#bbbbbb", linewidth=0.8, linestyle="--", zorder=0)


def panel_throughput(ax, steps, epochs):
    t = [r["t_s"] for r in steps]
    ax.plot(t, [r["images_per_s"] for r in steps], marker="o", markersize=3, color="#1f77b4")
    mark_epochs(ax, epochs)
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("images/s")
    ax.set_title("throughput")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)


def panel_wait(ax, steps, epochs):
    t = [r["t_s"] for r in steps]
    wait = [100 * r["data_wait_fraction"] for r in steps]
    ax.fill_between(t, wait, color="#d62728", alpha=0.25)
    ax.plot(t, wait, marker="o", markersize=3, color="#d62728")
    ax.axhline(10, color="#555555", linewidth=0.8, linestyle=":", label="input-bound from 10%")
    mark_epochs(ax, epochs)
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("% of step time")
    ax.set_title("waiting for data")
    ax.set_ylim(0, 100)
    ax.legend(loc="upper right", fontsize=8)
    ax.grid(alpha=0.3)


def panel_gpu(ax, steps, epochs, run):
    t = [r["t_s"] for r in steps]
    drawn = False
    util = [(x, r["gpu_util_percent"]) for x, r in zip(t, steps) if r.get("gpu_util_percent") is not None]
    busy = [(x, 100 * r["gpu_busy_fraction"]) for x, r in zip(t, steps) if r.get("gpu_busy_fraction") is not None]
    if util:
        ax.plot(*zip(*util), marker="o", markersize=3, color="#2ca02c", label="NVML utilization")
        drawn = True
    if busy:
        ax.plot(*zip(*busy), marker="s", markersize=3, color="#17becf", label="busy (CUDA events)")
        drawn = True
    mark_epochs(ax, epochs)
    if len(t) > 1:
        ax.set_xlim(min(t), max(t))
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("%")
    ax.set_title("GPU utilization")
    ax.set_ylim(0, 105)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(loc="lower right", fontsize=8)
    else:
        why = "CPU run: no GPU to measure" if run.get("device", "cpu") == "cpu" else f"no GPU readings ({run.get('nvml', '')})"
        ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes, fontsize=11, color="#555555")


def panel_breakdown(ax, steps, epochs):
    t = [r["t_s"] for r in steps]
    bottom = [0.0] * len(steps)
    for key, label, colour in PHASES:
        values = [r.get(key) or 0.0 for r in steps]
        if not any(values):
            continue
        top = [b + v for b, v in zip(bottom, values)]
        ax.fill_between(t, bottom, top, color=colour, alpha=0.75, label=label, step="mid")
        bottom = top
    timing = steps[0].get("timing", "wall_clock")
    mark_epochs(ax, epochs)
    ax.set_xlabel("time since start (s)")
    ax.set_ylabel("ms per step")
    ax.set_title("step time by phase" + (" (GPU phases: CUDA events)" if timing == "cuda_events" else ""))
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper right", fontsize=7)
    ax.grid(alpha=0.3)


def save(fig, path, written):
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)


def plot_metrics(path, out):
    run, steps, epochs, summary = read_metrics(path)
    written = []
    for name, draw in [
        ("throughput.png", lambda ax: panel_throughput(ax, steps, epochs)),
        ("data_wait.png", lambda ax: panel_wait(ax, steps, epochs)),
        ("gpu.png", lambda ax: panel_gpu(ax, steps, epochs, run)),
        ("breakdown.png", lambda ax: panel_breakdown(ax, steps, epochs)),
    ]:
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        draw(ax)
        fig.suptitle(title(run), fontsize=9)
        fig.tight_layout()
        save(fig, os.path.join(out, name), written)

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.6))
    panel_throughput(axes[0][0], steps, epochs)
    panel_wait(axes[0][1], steps, epochs)
    panel_gpu(axes[1][0], steps, epochs, run)
    panel_breakdown(axes[1][1], steps, epochs)
    fig.suptitle("gpufeed train: " + title(run), fontsize=11)
    verdict = (summary or {}).get("verdict", {}).get("text")
    if verdict:
        fig.text(0.5, 0.01, "\n".join(textwrap.wrap(verdict, 150)), ha="center", va="bottom", fontsize=8)
        fig.tight_layout(rect=(0, 0.08, 1, 0.97))
    else:
        fig.tight_layout(rect=(0, 0, 1, 0.97))
    save(fig, os.path.join(out, "summary.png"), written)
    return written


def read_bench(path):
    with open(path) as f:
        doc = json.load(f)
    if isinstance(doc, dict) and "scaling" in doc:
        points = doc["scaling"]
    elif isinstance(doc, list):
        points = doc
    else:
        points = [doc]
    points = [dict(p, threads=p.get("threads", p.get("num_workers"))) for p in points if "images_per_s" in p]
    points = [p for p in points if p["threads"]]
    if not points:
        sys.exit(f"plot.py: {path} has no threads/images_per_s results (gpufeed bench --json)")
    return sorted(points, key=lambda p: p["threads"])


def plot_bench(path, out):
    points = read_bench(path)
    workers = [p["threads"] for p in points]
    rate = [p["images_per_s"] for p in points]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ax.plot(workers, rate, marker="o", color="#1f77b4", label="gpufeed loader")
    base = rate[0] / workers[0] if workers[0] > 0 else None
    if base:
        ax.plot(workers, [base * w for w in workers], linestyle="--", color="#999999", label="linear from the first point")
    for w, r in zip(workers, rate):
        ax.annotate(f"{r:,.0f}", (w, r), textcoords="offset points", xytext=(0, 6), ha="center", fontsize=8)
    ax.set_xlabel("loader threads (--num-workers)")
    ax.set_ylabel("images/s")
    p0 = points[0]
    ax.set_title(f"loader thread scaling: {p0.get('transform', '')} {p0.get('image_size', '')}px, batch {p0.get('batch_size', '')}", fontsize=10)
    ax.set_xticks(workers)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    written = []
    save(fig, os.path.join(out, "scaling.png"), written)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metrics", nargs="?", help="JSON-lines file from gpufeed train --metrics")
    ap.add_argument("--bench", help="JSON from gpufeed bench --json (one run or a --num-workers list)")
    ap.add_argument("--out", default=".", help="folder for the PNGs (created)")
    args = ap.parse_args()
    if not args.metrics and not args.bench:
        ap.error("give a metrics file, --bench FILE, or both")
    os.makedirs(args.out, exist_ok=True)
    written = []
    if args.metrics:
        written += plot_metrics(args.metrics, args.out)
    if args.bench:
        written += plot_bench(args.bench, args.out)
    for w in written:
        print(w)


if __name__ == "__main__":
    main()
