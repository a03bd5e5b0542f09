"""The option schema's fronts agree: every option declared once in C++ (gpufeed/option.h) has the
same name (snake_case keyword, --kebab-case flag), default and accepted values in gpufeed.DataLoader
and in `gpufeed bench`, and both refuse a bad value naming the option in their own spelling."""
import inspect
import json
import re
import subprocess

import pytest

import gpufeed
from gpufeed import _C

SPECS = _C.option_specs()
# Where a front's default is deliberately not the C++ struct's, and why: gpufeed.DataLoader takes
# torch.utils.data.DataLoader's batch_size=1; `gpufeed bench` shows LoaderOptions' 256.
PYTHON_DEFAULTS = {"batch_size": 1}


def cli_text(value):
    """A default as the CLI's help prints it (options::format_value)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(cli_text(v) for v in value)
    if isinstance(value, float):
        return str(int(value)) if value == int(value) else repr(value)
    return "unset" if value == "" else str(value)


@pytest.fixture(scope="module")
def bench_help(gpufeed_cli):
    out = subprocess.run([str(gpufeed_cli), "bench", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    # One entry per flag: CLI11 may wrap a long help text onto following, indented lines.
    entries, current = {}, None
    for line in out.stdout.splitlines():
        m = re.match(r"\s+(--[a-z0-9-]+)(.*)", line)
        if m:
            current = m.group(1)
            entries[current] = m.group(2)
        elif current and line.startswith(" " * 10):
            entries[current] += " " + line.strip()
    return entries


def test_the_schema_lists_the_loaders_options_once():
    names = [s["name"] for s in SPECS]
    assert len(names) == len(set(names))
    assert {"batch_size", "num_workers", "prefetch_depth", "seed", "on_error", "max_skips", "strict_decode",
            "image_size", "train", "scale", "ratio", "resize_size", "auto_augment", "color_jitter", "random_erase",
            "mean", "std", "index_cache"} <= set(names)
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", n) for n in names)


def test_python_keywords_are_the_schema_keyword_only_with_its_defaults():
    params = inspect.signature(gpufeed.DataLoader).parameters
    assert list(params)[0] == "root"
    for s in SPECS:
        p = params[s["name"]]
        assert p.kind == inspect.Parameter.KEYWORD_ONLY, s["name"]
        want = PYTHON_DEFAULTS.get(s["name"], None if s["derived_default"] else s["default"])
        assert p.default == want, (s["name"], p.default, want)
    # Every keyword but root is keyword-only: torch.utils.data.DataLoader(dataset, 4) reads as
    # batch_size=4, gpufeed's refuses it rather than guessing.
    assert all(p.kind == inspect.Parameter.KEYWORD_ONLY for n, p in params.items() if n != "root")
    doc = gpufeed.DataLoader.__doc__
    for s in SPECS:
        assert f"        {s['name']}: {s['help']}" in doc, s["name"]


def test_cli_flags_are_the_schema_in_kebab_case_with_the_same_defaults(bench_help):
    for s in SPECS:
        if s["type"] == "bool":
            flag = ("--no-" if s["default"] else "--") + s["name"].replace("_", "-")
            assert flag in bench_help, flag
            continue
        flag = "--" + s["name"].replace("_", "-")
        assert flag in bench_help, flag
        text = bench_help[flag]
        shown = s["derived_default"] or cli_text(s["default"])
        assert f"default {shown})" in text, (flag, text, shown)
        assert s["accepted"] in text, (flag, text)
    assert set(PYTHON_DEFAULTS) == {"batch_size"}
    assert "default 256)" in bench_help["--batch-size"]


def bad_values(spec):
    """Values the spec refuses, of the right Python type."""
    if spec["type"] == "choice":
        return ["no-such-" + spec["name"]]
    if spec["type"] in ("int", "float"):
        out = []
        if spec["min"] is not None:
            out.append(int(spec["min"]) - 1 if spec["type"] == "int" else spec["min"] - 0.5)
        if spec["max"] is not None:
            out.append(int(spec["max"]) + 1 if spec["type"] == "int" else spec["max"] + 0.5)
        return out
    if spec["type"] == "floats":
        return [tuple([1.0] * (max(spec["sizes"]) + 1))]
    return []


def test_both_fronts_refuse_the_same_bad_values_naming_the_option(folder, gpufeed_cli):
    tried = 0
    for s in SPECS:
        for bad in bad_values(s):
            with pytest.raises(ValueError, match=re.escape(s["name"] + "=")):
                gpufeed.DataLoader(folder, **{s["name"]: bad})
            text = cli_text(bad)
            out = subprocess.run([str(gpufeed_cli), "bench", "--data", str(folder), "--" + s["name"].replace("_", "-"),
                                  text], capture_output=True, text=True, timeout=120)
            assert out.returncode != 0, (s["name"], text)
            assert "--" + s["name"].replace("_", "-") in out.stderr, (s["name"], out.stderr)
            assert s["name"] + "=" not in out.stderr
            tried += 1
    assert tried >= 15


# Words that need a CUDA device for the batches: on the CPU both fronts refuse them, saying so.
NEEDS_CUDA = {("decode_device", "gpu"), ("decode_device", "auto")}


def test_both_fronts_accept_every_word_of_a_choice(folder, gpufeed_cli):
    for s in SPECS:
        if s["type"] not in ("choice", "int"):  # ints with words: num_workers="auto"
            continue
        for word in s["words"]:
            if (s["name"], word) == ("shuffle_order", "shards"):  # needs shards: test_shard_order.py
                continue
            if (s["name"], word) in NEEDS_CUDA:
                with pytest.raises(ValueError, match="CUDA device"):
                    gpufeed.DataLoader(folder, batch_size=9, image_size=16, **{s["name"]: word})
                out = subprocess.run([str(gpufeed_cli), "bench", "--data", str(folder), "--batch-size", "9",
                                      "--image-size", "16", "--" + s["name"].replace("_", "-"), word],
                                     capture_output=True, text=True, timeout=120)
                assert out.returncode != 0 and "CUDA" in out.stderr, (s["name"], word, out.stderr)
                continue
            loader = gpufeed.DataLoader(folder, batch_size=9, image_size=16, **{s["name"]: word})
            assert sum(1 for _ in loader) == 3
            out = subprocess.run([str(gpufeed_cli), "bench", "--data", str(folder), "--batch-size", "9",
                                  "--image-size", "16", "--json", "--" + s["name"].replace("_", "-"), word],
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, (s["name"], word, out.stderr)


def test_an_unknown_keyword_is_a_type_error_with_the_nearest_name(folder):
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_worker'.*'num_workers'"):
        gpufeed.DataLoader(folder, num_worker=2)
    with pytest.raises(TypeError):
        gpufeed.DataLoader(folder, 4)  # batch_size is keyword-only


def test_library_errors_are_spelled_per_front():
    assert _C.spell_options("raise `num_workers` or `prefetch_depth`; see `torch.compile`") == \
        "raise num_workers= or prefetch_depth=; see `torch.compile`"


@pytest.fixture(scope="module")
def cli_specs(gpufeed_cli):
    """`gpufeed option-specs`: every schema the CLI's commands are built from."""
    out = subprocess.run([str(gpufeed_cli), "option-specs"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_the_cli_and_python_read_the_same_rows(cli_specs):
    def plain(spec):
        d = dict(spec)
        if isinstance(d["default"], (tuple, list)):
            d["default"] = list(d["default"])
        d["words"], d["sizes"] = list(d["words"]), list(d["sizes"])
        return d
    assert [plain(s) for s in SPECS] == [plain(s) for s in cli_specs["loader"] + cli_specs["data"]]
    assert {"lr_schedule", "warmup_epochs", "min_res", "end_ramp"} <= {s["name"] for s in cli_specs["schedule"]}
    assert {"shard_size", "max_side", "num_workers", "on_error"} <= {s["name"] for s in cli_specs["pack"]}


def test_docs_options_table_is_generated_from_the_schema(cli_specs):
    import importlib.util
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("gen_options_doc", root / "tools" / "gen_options_doc.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert (root / "docs" / "OPTIONS.md").read_text() == gen.render(cli_specs), \
        "docs/OPTIONS.md is stale: run tools/gen_options_doc.py"


def test_the_python_fronts_own_defaults_and_ranges_are_declared_in_the_rows():
    # gpufeed.DataLoader's departures from the C++ struct are rows' fields, not per-name code:
    # batch_size=1 (torch's DataLoader's) and the seed's torch.manual_seed range.
    assert {s["name"]: s["python_default"] for s in SPECS if s["python_default"] is not None} == {"batch_size": 1}
    assert [s["name"] for s in SPECS if s["seed_range"]] == ["seed"]
    assert inspect.signature(gpufeed.DataLoader).parameters["batch_size"].default == 1
