"""Each reported struct has one field list (gpufeed/fields.h): gpufeed.DataLoader.stats() and
epoch_summary(), gpufeed.profile's result and metrics records and `gpufeed bench --json` report
exactly its names, integers as int and times as float."""
import json
import subprocess

import gpufeed
from gpufeed import _C

FIELDS = _C._reported_fields()


def test_field_lists_are_the_documented_keys():
    assert FIELDS["LoaderStats"] == ["samples", "skipped", "bytes_read", "read_s", "decode_s", "resize_s",
                                     "decoded_pixels", "decodes"]
    assert FIELDS["SlotCounts"] == ["ready", "in_flight", "held", "free"]
    assert FIELDS["ThreadDecision"] == ["epoch", "batch", "from", "to", "prefetch_depth_from", "prefetch_depth_to",
                                        "sample_cost_us", "demand_per_s", "needed", "wait_fraction", "why"]
    assert FIELDS["SkippedSample"] == ["index", "replaced_by", "position", "path", "kind", "reason"]
    assert FIELDS["EpochSummary"] == ["epoch", "batches", "samples", "skipped", "complete", "skipped_by_kind",
                                      "skips", "wait_s", "first_wait_s"]
    assert FIELDS["Verdict"] == ["bound", "data_wait_fraction", "delivered_images_per_s", "model_images_per_s",
                                 "loader_images_per_s", "read_fraction", "decode_fraction", "resize_fraction",
                                 "knob", "text"]


def check_loader_stats(values, names):
    for name in names:
        assert type(values[name]) is (float if name.endswith("_s") else int), (name, values[name])


def test_python_dicts_report_every_field(bad_folder):
    loader = gpufeed.DataLoader(bad_folder, batch_size=4, image_size=32, num_workers="auto", on_error="skip")
    loader.set_epoch(0)
    assert sum(len(labels) for _, labels in loader) == 28
    stats = loader.stats()
    n = len(FIELDS["LoaderStats"])
    assert list(stats)[:n] == FIELDS["LoaderStats"]
    assert list(stats)[n:] == ["threads", "prefetch_depth", "thread_decisions", "slots"]
    check_loader_stats(stats, FIELDS["LoaderStats"])
    assert stats["skipped"] == 1 and stats["samples"] >= 28
    assert list(stats["slots"]) == FIELDS["SlotCounts"]
    for d in stats["thread_decisions"]:  # which decisions a real clock leads to varies
        assert list(d) == FIELDS["ThreadDecision"]
        assert type(d["from"]) is int and type(d["needed"]) is float and type(d["why"]) is str
    summary = loader.epoch_summary()
    assert list(summary) == FIELDS["EpochSummary"]
    assert summary["complete"] is True and summary["skipped_by_kind"] == {"truncated": 1}
    assert [list(s) for s in summary["skips"]] == [FIELDS["SkippedSample"]]
    skip = summary["skips"][0]
    assert skip["path"].endswith("bees_0005_bad.jpg") and skip["kind"] == "truncated"
    assert type(summary["wait_s"]) is float and type(summary["batches"]) is int


def test_profile_result_and_metrics_report_every_field(tmp_path, folder):
    loader = gpufeed.DataLoader(folder, batch_size=4, image_size=32, num_workers=1)
    metrics = tmp_path / "m.jsonl"
    prof = gpufeed.profile(loader, metrics=metrics, epochs=1, verbose=False)
    assert sum(len(labels) for _, labels in prof) == 27
    assert list(prof.result["verdict"]) == FIELDS["Verdict"]
    summary = [json.loads(line) for line in open(metrics)][-1]
    assert summary["type"] == "summary"
    assert sorted(summary["verdict"]) == sorted(FIELDS["Verdict"])
    # The profiler's loader record: the counters over the run, but for decoded_pixels.
    counters = [f for f in FIELDS["LoaderStats"] if f != "decoded_pixels"]
    assert set(counters) <= set(summary["loader"]) and "decoded_pixels" not in summary["loader"]
    check_loader_stats(summary["loader"], counters)
    assert summary["loader"]["samples"] >= 27


def test_bench_json_reports_every_field(folder, gpufeed_cli):
    out = subprocess.run([str(gpufeed_cli), "bench", "--data", str(folder), "--json", "--epochs", "1", "--warmup",
                          "1", "--batch-size", "4", "--image-size", "32", "--workers", "1"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    record = json.loads(out)
    assert set(FIELDS["LoaderStats"]) <= set(record)
    check_loader_stats(record, FIELDS["LoaderStats"])
    assert record["samples"] == 27 and record["skipped"] == 0 and record["decoded_pixels"] > 0
    assert record["decodes"] > 0
    assert record["thread_decisions"] == []
