"""gpufeed.profile around gpufeed's and torch's loaders: the records `gpufeed train` writes,
a Chrome trace, a verdict, and tools/bench/plot.py drawing the metrics."""
import json
import subprocess
import sys

import pytest
import torch

import gpufeed
from conftest import ROOT


def records(path):
    return [json.loads(line) for line in open(path)]


def test_profile_gpufeed_loader_writes_train_outputs(tmp_path, folder):
    loader = gpufeed.DataLoader(folder, batch_size=4, shuffle=True, num_workers=2, image_size=32)
    metrics, trace = tmp_path / "m" / "metrics.jsonl", tmp_path / "trace.json"
    prof = gpufeed.profile(loader, metrics=metrics, trace=trace, metrics_every=2, epochs=2, verbose=False,
                           model="toy")
    steps = 0
    for epoch in range(2):
        loader.set_epoch(epoch)
        for images, labels in prof:
            assert images.shape[1:] == (3, 32, 32)
            torch.nn.functional.conv2d(images, torch.ones(4, 3, 3, 3)).sum()  # a step
            prof.phase("forward_backward")
            steps += 1
    assert steps == 2 * len(loader) == 14
    result = prof.result
    assert result is not None and result["steps"]["steps"] == 14 and result["steps"]["images"] == 54
    assert result["verdict"]["bound"] in ("input", "compute") and result["verdict"]["text"]
    assert "`" not in result["verdict"]["text"] + result["verdict"]["knob"]  # options spelled as keywords
    assert result["loader_samples"] >= 54  # the verdict knows the loader's own counters
    assert [e["steps"] for e in prof.epochs_done] == [7, 7]
    recs = records(metrics)
    kinds = [r["type"] for r in recs]
    assert kinds[0] == "run" and kinds[-1] == "summary" and kinds.count("epoch") == 2
    assert recs[0]["model"] == "toy" and recs[0]["timing"] == "wall_clock" and recs[0]["steps_per_epoch"] == 7
    assert sum(r["steps"] for r in recs if r["type"] == "steps") == 14
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e.get("name") for e in events}
    assert "data wait" in names or any("wait" in str(n) for n in names)
    # One track per loader thread: sample spans (read/decode/resize) from the decode threads.
    assert any(str(e.get("name", "")).startswith("decode") for e in events)
    assert "verdict: " in gpufeed._profile.format_report(result)


def test_profile_torch_dataloader_and_plot(tmp_path, folder):
    import torchvision
    import torchvision.transforms as T

    ds = torchvision.datasets.ImageFolder(folder, T.Compose([T.Resize(40), T.CenterCrop(32), T.ToTensor()]))
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=0)
    metrics = tmp_path / "metrics.jsonl"
    with gpufeed.profile(loader, metrics=metrics, metrics_every=1, verbose=False) as prof:
        n = sum(x.shape[0] for x, _ in prof)
    assert n == 27 and prof.result["steps"]["steps"] == 6 and prof.result["steps"]["images"] == 27
    recs = records(metrics)
    assert [r["type"] for r in recs].count("steps") == 6 and recs[-1]["type"] == "summary"
    out = tmp_path / "png"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "bench" / "plot.py"), str(metrics), "--out", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    for name in ("throughput", "data_wait", "breakdown", "summary"):
        assert (out / f"{name}.png").stat().st_size > 5000


def test_profile_rejects_unknown_phase(folder):
    prof = gpufeed.profile(gpufeed.DataLoader(folder, batch_size=9), verbose=False)
    it = iter(prof)
    next(it)
    with pytest.raises(ValueError, match="phase"):
        prof.phase("backward")


def test_profile_consumer_ms_plays_a_model_of_known_speed_for_num_workers_auto(tmp_path, folder):
    """consumer_ms holds each batch that long (the step's compute), so a loop of known speed needs
    no model; with num_workers="auto" the summary record carries the loader's thread choices."""
    loader = gpufeed.DataLoader(folder, batch_size=1, num_workers="auto", image_size=32, prefetch_depth=2)
    metrics = tmp_path / "m.jsonl"
    prof = gpufeed.profile(loader, metrics=metrics, epochs=1, verbose=False, consumer_ms=15)
    n = sum(1 for _ in prof)
    assert n == len(loader) == 27
    result = prof.result
    assert result["steps"]["wall_ms"] >= 0.9 * 15 * n, result["steps"]
    summary = records(metrics)[-1]
    assert summary["type"] == "summary"
    assert summary["loader"]["num_workers"] == "auto"
    assert summary["loader"]["threads"] == loader.stats()["threads"]
    assert summary["loader"]["thread_decisions"] == loader.stats()["thread_decisions"]
    with pytest.raises(ValueError, match="consumer_ms"):
        gpufeed.profile(loader, consumer_ms=-1)
