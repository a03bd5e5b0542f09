"""Fixtures for gpufeed's Python tests: small generated datasets (PIL), the gpufeed CLI, ../shared.

The tests import the gpufeed on sys.path: ctest puts <build>/python first (this checkout's build);
run by hand, `PYTHONPATH=build/release/python .venv/bin/python -m pytest python/tests`.
"""
import os
import pathlib
import shutil

import numpy as np
import pytest
from PIL import Image

ROOT = pathlib.Path(__file__).resolve().parents[2]


def shared_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("GPUFEED_SHARED_DIR", ROOT.parent / "shared"))


def smooth_image(rng: np.random.Generator, width: int, height: int) -> Image.Image:
    """A photo-like image: smooth gradients plus a few soft blobs (resize filters behave on it
    as on real photos, unlike white noise)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.zeros((height, width, 3), np.float32)
    for c in range(3):
        a, b, p = rng.uniform(-1, 1, 3)
        img[..., c] = 128 + 60 * np.sin(a * x / 37 + b * y / 23 + p * 6)
        for _ in range(3):
            cx, cy, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(8, 40)
            img[..., c] += rng.uniform(-60, 60) * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def make_image_folder(root: pathlib.Path, classes=("ants", "bees", "cats"), per_class=9, seed=0,
                      fmt="JPEG") -> pathlib.Path:
    rng = np.random.default_rng(seed)
    for c in classes:
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            w, h = int(rng.integers(40, 160)), int(rng.integers(40, 160))
            ext = ".jpg" if fmt == "JPEG" else ".png"
            smooth_image(rng, w, h).save(root / c / f"{c}_{i:03d}{ext}", fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return root


def take_indices(loader, it, k=None) -> list:
    """Up to k batches of iterator `it` (None: the rest of the epoch): their dataset indices, in
    order (loader.last_batch), each batch's labels checked against loader.targets."""
    out = []
    targets = loader.targets
    for _, labels in it:
        idx = list(loader.last_batch["indices"])
        assert labels.tolist() == [targets[i] for i in idx]
        out += idx
        if k is not None and len(out) == k * loader.batch_size:
            break
    return out


@pytest.fixture(scope="session", autouse=True)
def private_cache_home(tmp_path_factory) -> pathlib.Path:
    """XDG_CACHE_HOME in a temporary folder for the whole session (the CLI runs inherit it): index
    caches, whose default home is the user's cache folder, stay inside the test's temp dirs."""
    home = tmp_path_factory.mktemp("cache-home")
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(home)
    yield home
    if old is None:
        os.environ.pop("XDG_CACHE_HOME", None)
    else:
        os.environ["XDG_CACHE_HOME"] = old


@pytest.fixture(scope="session")
def folder(tmp_path_factory) -> pathlib.Path:
    """ImageFolder of 3 classes x 9 JPEGs, 40..160 px a side."""
    return make_image_folder(tmp_path_factory.mktemp("folder") / "train")


@pytest.fixture(scope="session")
def big_folder(tmp_path_factory) -> pathlib.Path:
    """Slow to decode: 2 classes x 24 JPEGs of 1200x1000 (Ctrl-C and deletion tests)."""
    root = tmp_path_factory.mktemp("big") / "train"
    rng = np.random.default_rng(1)
    base = smooth_image(rng, 1200, 1000)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(24):
            base.rotate(i * 3).save(root / c / f"{i:03d}.jpg", "JPEG", quality=95)
    return root


@pytest.fixture()
def bad_folder(tmp_path, folder) -> pathlib.Path:
    """The small folder with one corrupt JPEG (truncated to its header) added as bees/bad.jpg."""
    root = tmp_path / "bad"
    shutil.copytree(folder, root)
    good = (root / "bees" / "bees_000.jpg").read_bytes()
    (root / "bees" / "bees_0005_bad.jpg").write_bytes(good[:200])
    return root


@pytest.fixture(scope="session")
def gpufeed_cli() -> pathlib.Path:
    """The gpufeed CLI of this checkout's build (GPUFEED_CLI, set by ctest), or skip."""
    if os.environ.get("GPUFEED_CLI") == "":
        pytest.skip("GPUFEED_CLI is empty: no gpufeed CLI here (tools/check_wheel.sh --pinned hides the "
                    "Debian libraries the C++ CLI links; the wheel carries its own)")
    cli = pathlib.Path(os.environ.get("GPUFEED_CLI", ROOT / "build" / "release" / "tools" / "gpufeed"))
    if not cli.exists():
        pytest.skip(f"the gpufeed CLI is not built ({cli}); build the `gpufeed` target")
    return cli
