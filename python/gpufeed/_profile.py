"""gpufeed.profile: `gpufeed train`'s step profiler around any training loop's data iterator."""
from __future__ import annotations

import os
import time
from typing import Any, Dict, Iterable, List, Optional

import torch

from . import _C


def _batch_size_of(batch: Any) -> int:
    """Samples in a batch: the first dimension of its first tensor ((images, labels), a dict, ...)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() > 0 else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            n = _batch_size_of(item)
            if n:
                return n
    return 0


class profile:
    """Times a training loop's data wait against its step, as ``gpufeed train`` does, and writes
    the same outputs: the metrics JSON lines (``tools/bench/plot.py`` draws them), a Chrome trace and
    the verdict (input-bound or compute-bound, by how much, the knob most likely to help)::

        for images, labels in gpufeed.profile(loader, device="cuda", metrics="runs/m.jsonl",
                                              trace="runs/trace.json"):
            ...                                  # the step, unchanged

    ``loader`` is any iterable of batches: a gpufeed.DataLoader (then the verdict also knows the
    loader's capacity and the trace has a track per decode thread), torch's DataLoader, or any
    other. Each ``iter()`` of the profile is one epoch of ``loader``; the run ends (summary record,
    trace, verdict printed when ``verbose``) after ``epochs`` epochs, or at ``finish()`` / the end of
    a ``with`` block.

    A step is the time from asking for a batch to asking for the next one: the data wait (blocked
    in ``next()``), then everything the loop does with the batch, counted as forward+backward
    unless the loop marks ``phase("forward_backward")``, ``phase("all_reduce")`` and
    ``phase("optimizer")`` as each is issued. On a CUDA ``device`` the phases are timed by CUDA
    events on the current stream (GPU time) and NVML is sampled when the driver's library loads
    (dlopen of libnvidia-ml.so.1; no pynvml needed); on the CPU by the wall clock.

    Args:
        loader: the batches.
        device: where the model runs (``"cpu"``, ``"cuda[:N]"``); default: the loader's device
            for a gpufeed.DataLoader, else ``"cpu"``.
        metrics, trace: output paths (parents are created); None writes none.
        metrics_every: steps per "steps" record.
        epochs: epochs in the run (the run record's, and when to finish by itself).
        model: a name for the run record.
        trace_max_events: bound on the trace (first and last halves kept).
        nvml: sample NVML on CUDA devices.
        verbose: print the step breakdown and the verdict when the run ends.
        consumer_ms: also hold each batch this many milliseconds after the loop's own work (a
            sleep, inside the step): a model of known speed, as ``gpufeed bench
            --consumer-ms``, to see what ``num_workers="auto"`` chooses for it; 0: none.

    Attributes: ``epochs_done`` (one dict per finished epoch: steps, images, wall_ms,
    data_wait_ms, compute_ms, images_per_s, data_wait_fraction, ...), ``result`` (after the run:
    ``{"steps": ..., "verdict": {"bound", "text", "knob", ...}, ...}``), ``report`` (the printed
    text).
    """

    def __init__(self, loader: Iterable, device: "str | torch.device | None" = None,
                 metrics: "str | os.PathLike[str] | None" = None,
                 trace: "str | os.PathLike[str] | None" = None, metrics_every: int = 10,
                 epochs: int = 1, model: str = "", trace_max_events: int = 400000,
                 nvml: bool = True, verbose: bool = True, consumer_ms: float = 0):
        from ._loader import DataLoader

        if consumer_ms is None:
            consumer_ms = 0
        if not isinstance(consumer_ms, (int, float)) or isinstance(consumer_ms, bool) or not 0 <= consumer_ms < 1e6:
            raise ValueError(f"gpufeed.profile: consumer_ms must be a number of milliseconds in [0, 1e6), "
                             f"not {consumer_ms!r}")
        self.consumer_ms = float(consumer_ms)

        self.loader = loader
        ours = isinstance(loader, DataLoader)
        if device is None:
            device = loader.device if ours else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        for path in (metrics, trace):
            if path is not None:
                os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        try:
            steps = len(loader)  # type: ignore[arg-type]
        except TypeError:
            steps = 0
        batch_size = getattr(loader, "batch_size", None) or 0
        num_workers = getattr(loader, "num_workers", 0) or 0
        if ours:
            num_workers = loader.stats()["threads"]
        dist = torch.distributed
        allreduce = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
        self._p = _C._Profiler(
            None if metrics is None else os.fspath(metrics), metrics_every,
            None if trace is None else os.fspath(trace), trace_max_events, nvml, str(self.device), model, epochs,
            steps, batch_size, num_workers, getattr(loader, "prefetch_depth", 0) if ours else 0,
            getattr(loader, "image_size", 0) if ours else 0, allreduce, loader._c if ours else None,
            self._stream())
        self._ours = ours
        self.metrics, self.trace = metrics, trace
        self.epochs = epochs
        self.verbose = verbose
        self.epochs_done: List[Dict[str, Any]] = []
        self.result: Optional[Dict[str, Any]] = None
        self.report = ""
        self._epoch = 0
        self._open = False
        self._images = 0

    def _stream(self) -> int:
        """The current CUDA stream of the profiled device (its marks go there), 0 on the CPU."""
        return torch.cuda.current_stream(self.device).cuda_stream if self.device.type == "cuda" else 0

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self):
        if self.result is not None:
            raise RuntimeError("gpufeed.profile: this run has finished; profile a new run")
        epoch = self.loader._epochs.epoch_of_next_iter() if self._ours else self._epoch
        self._p.begin_epoch(epoch)
        it = iter(self.loader)
        self._open = False
        try:
            while True:
                if self._open:
                    self._p.step_end(self._images)
                    self._open = False
                if self.device.type == "cuda":
                    self._p.set_stream(self._stream())
                self._p.step_begin()
                t0 = time.perf_counter()
                try:
                    batch = next(it)
                except StopIteration:
                    break
                wait_ms = (time.perf_counter() - t0) * 1000
                info = getattr(self.loader, "last_batch", {}) if self._ours else {}
                self._p.batch_ready(wait_ms, int(info.get("batch_index", 0)), len(info.get("skipped", ())))
                self._images = _batch_size_of(batch)
                self._open = True
                yield batch
                if self.consumer_ms > 0:
                    time.sleep(self.consumer_ms / 1000)
        finally:
            if self._open:  # the loop left early (break, exception): its last step still counts
                self._p.step_end(self._images)
                self._open = False
            self.epochs_done.append(self._p.end_epoch())
            self._epoch += 1
            if len(self.epochs_done) >= self.epochs:
                self.finish()

    def phase(self, name: str) -> None:
        """Marks the end of a phase of the current step, as it is issued: "forward_backward",
        "all_reduce" or "optimizer" (the rest of the step counts as the last marked phase)."""
        self._p.phase_done(name)

    def finish(self) -> Dict[str, Any]:
        """Ends the run: writes the summary record and the trace, prints the report when verbose,
        and returns the result (also in ``.result``). Called by itself after ``epochs`` epochs."""
        if self.result is not None:
            return self.result
        self.result = self._p.finish()
        self.report = format_report(self.result, self.metrics, self.trace)
        if self.verbose:
            print(self.report, end="", flush=True)
        return self.result

    def __enter__(self) -> "profile":
        return self

    def __exit__(self, *exc) -> None:
        self.finish()


def format_report(result: Dict[str, Any], metrics=None, trace=None) -> str:
    """The end-of-run lines `gpufeed train` prints (tools/cli/cmd_train.cpp's profile_report)."""
    s = result["steps"]
    n = max(1, s["steps"])
    out = (f"steps: {s['steps']}, per step {s['wall_ms'] / n:.1f} ms: data wait {s['data_wait_ms'] / n:.1f} ms, "
           f"{'H2D copy' if s['gpu'] else 'convert'} {s['h2d_ms'] / n:.2f} ms, forward+backward {s['compute_ms'] / n:.1f} ms, "
           f"all-reduce {s['allreduce_ms'] / n:.1f} ms{'' if result['allreduce_measured'] else ' (single process)'}, "
           f"optimizer {s['optimizer_ms'] / n:.1f} ms ({'GPU times from CUDA events' if s['gpu'] else 'wall clock'})\n")
    if result.get("warmup_steps_excluded", 0) > 0:
        w = result["steady"]
        m = max(1, w["steps"])
        out += (f"steady state (the {w['steps']} steps after the first {result['warmup_steps_excluded']}): "
                f"per step {w['wall_ms'] / m:.1f} ms, data wait {w['data_wait_ms'] / m:.1f} ms, "
                f"{w['images'] / max(w['wall_ms'] / 1000, 1e-9):.0f} img/s\n")
    if s["gpu_busy_fraction"] is not None:
        out += f"gpu: busy {100 * s['gpu_busy_fraction']:.0f}% of step time (CUDA events)"
        if s["gpu_util_percent"] is not None:
            out += f", NVML utilization {s['gpu_util_percent']:.0f}%"
        out += f"; NVML {result['nvml_status']}\n"
    out += "verdict: " + result["verdict"]["text"] + "\n"
    if metrics is not None:
        out += f"metrics: {os.fspath(metrics)}\n"
    if trace is not None:
        out += f"trace: {os.fspath(trace)} ({result['trace_events']} events"
        if result["trace_dropped"]:
            out += f", {result['trace_dropped']} dropped"
        out += ")\n"
    return out
