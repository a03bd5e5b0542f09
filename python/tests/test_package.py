"""The package's reach: gpufeed._C links no LibTorch, and one torch minimum is declared in
pyproject.toml, in the build (python/CMakeLists.txt) and enforced at import."""
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import gpufeed
from gpufeed import _build

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_minimum_torch_is_the_same_in_pyproject_the_build_and_the_package():
    pyproject = (ROOT / "pyproject.toml").read_text()
    declared = re.search(r'dependencies = \[[^\]]*"torch>=([0-9.]+)"', pyproject)
    assert declared, "pyproject.toml declares no torch>= dependency"
    cmake = re.search(r'set\(GPUFEED_MIN_TORCH "([0-9.]+)"\)', (ROOT / "python/CMakeLists.txt").read_text())
    assert cmake and declared.group(1) == cmake.group(1) == _build.MIN_TORCH


def test_an_older_torch_is_refused_at_import_naming_both_versions(tmp_path):
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "2.3.1+cpu"\n')
    package_parent = str(pathlib.Path(os.path.abspath(gpufeed.__file__)).parents[1])  # not resolved: the build tree links the .py files
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), package_parent]))
    r = subprocess.run([sys.executable, "-c", "import gpufeed"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "ImportError" in r.stderr
    assert f"needs torch >= {_build.MIN_TORCH}" in r.stderr and "torch 2.3.1+cpu" in r.stderr, r.stderr


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) is not installed")
def test_the_extension_links_no_libtorch():
    out = subprocess.run(["readelf", "-d", gpufeed._C.__file__], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)
    assert needed, out
    assert not [n for n in needed if re.match(r"lib(torch|c10|shm|cudart)", n)], needed
