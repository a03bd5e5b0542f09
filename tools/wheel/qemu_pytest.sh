#!/usr/bin/env bash
# Runs a named subset of the pytest suite (python/tests) against an aarch64 wheel of
# tools/wheel/build_zig_wheel.sh on this x86_64 machine: Debian's arm64 CPython of the wheel's
# version (apt-get download + dpkg -x into build/pysysroot/aarch64-pyX.Y, no install, the sysroot
# tools/wheel/qemu_smoke.sh uses, plus libstdc++ and the stdlib's libraries) under
# qemu-aarch64-static, with torch's aarch64 wheel from PyPI beside the wheel's gpufeed:
#   tools/wheel/qemu_pytest.sh WHEEL [--timeout SECONDS]      (default 1800: all steps together)
# Ends with one line "qemu_pytest: N passed, N failed, N skipped, N errors in S s" (pytest's counts);
# exit status 0 only when pytest passed and nothing failed.
#
# Needs qemu-user-static and dpkg's arm64 architecture (tools/wheel/setup_cross.sh installs them;
# this script runs it), clang and lld (installed when missing) for the CUDA stubs below, and, on
# the first run, PyPI and Debian's arm64 packages. Nothing is installed into .venv: pip's
# cross-platform options (--platform manylinux_2_28_aarch64 --python-version X.Y --implementation
# cp --abi cpXY --only-binary=:all:) download into build/qemu_pytest/pyX.Y/wheels and install
# with --target into build/qemu_pytest/pyX.Y/site; a second run downloads nothing.
# Downloads: torch 2.11.0 (the project's pin, 400 MB; 870 MB installed), torchvision 0.26.0 (its
# match, 8 MB), torchdata 0.11.0 (setup.sh's pin), numpy, pillow, pytest and torch's pure-Python
# needs (about 35 MB), and about 12 MB of Debian arm64 packages: 1.5 GB on disk in all.
#
# torch: the aarch64 torch 2.11.0 on PyPI is a CUDA 13 build (Requires-Dist: cuda-toolkit,
# nvidia-cudnn-cu13, nvidia-nccl-cu13, ...: gigabytes; 2.12 to 2.15 are as big), and
# libtorch_cpu.so itself lists libcudart.so.13 and libcupti.so.13 as DT_NEEDED, so `import torch`
# fails without them. The last CPU-only aarch64 torch on PyPI (2.10.0, 139 MB) is refused by
# gpufeed (MIN_TORCH 2.11). So torch
# 2.11.0 is installed --no-deps and tools/wheel/cuda_stubs.py builds a stub aarch64 library for
# each missing CUDA soname (every symbol torch and torchvision take from it, with its symbol
# versions; cudaGetDeviceCount says no device): torch imports as on a machine without a GPU,
# torch.cuda.is_available() is False, and no CUDA code runs (there is no GPU under qemu anyway).
#
# The subset (SUBSET and DESELECT below; 7 minutes here on a busy 2-core machine, 117 passed and
# 60 skipped): the tests that compare gpufeed's aarch64 build with a reference computed by the
# same aarch64 torch, torchvision, torchdata or PIL: decoded and transformed pixels against
# torchvision's Resize/CenterCrop/Normalize and load_sample, batch order against torch's
# DistributedSampler (world sizes, drop_last, negative seeds), state_dict resume (also onto
# another world size, also over HTTP) against an uninterrupted run and torchdata's
# StatefulDataLoader, multi-crop views, decode errors, Ctrl-C and deletion mid-epoch, torch
# DataLoader workers (fork and spawn) over loader.dataset, fork() with a live loader, HTTPS
# through the wheel's static OpenSSL (SSL_CERT_FILE/SSL_CERT_DIR), -X dev, the option schema, the
# affinity mask, the reported fields, the profiler and the ImageFolder listings (also ../shared's
# hymenoptera when GPUFEED_SHARED_DIR or ../shared has it). Left out: torchrun and the
# pipeline-parallel runs (several ranks, each importing torch: 35 s or more apiece under qemu),
# the spawned-workers programs (their DataLoader(timeout=60) is shorter than a spawned worker's
# torch import under qemu: "DataLoader timed out after 60 seconds"; the fork and spawn workers
# test above runs), and the plot of tools/bench/plot.py (matplotlib is not downloaded). The C++
# CLI's tests skip (GPUFEED_CLI empty, as tools/check_wheel.sh --pinned does; test_remote.py's
# shards are packed by the CLI, so most of it skips), and so does the CUDA test.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
limit=1800 wheel=""
while (($#)); do
  case $1 in
    --timeout) limit=$2; shift 2 ;;
    -*) sed -n '2,9p' "$0"; exit 2 ;;
    *) wheel=$(realpath "$1"); shift ;;
  esac
done
[ -n "$wheel" ] || { sed -n '2,9p' "$0"; exit 2; }
# Everything under one time limit: a hung download or test cannot hold the machine.
if [ -z "${GPUFEED_QEMU_PYTEST_INNER:-}" ]; then
  GPUFEED_QEMU_PYTEST_INNER=1 timeout --kill-after=30 "$limit" "$0" "$wheel" --timeout "$limit" 2>&1
  rc=$?
  ((rc == 124 || rc == 137)) && echo "qemu_pytest: stopped at the ${limit} s limit (--timeout)"
  exit $rc
fi
start=$SECONDS

SUBSET=(test_loader.py test_torch_compat.py test_resume.py test_stateful.py test_multicrop.py
        test_pipeline.py test_fork.py test_remote.py test_options.py test_cpu_budget.py
        test_reported_fields.py test_package.py test_profile.py)
# Each word names tests left out, for the reasons the header gives.
DESELECT="not torchrun and not imagenet and not pipeline_equals and not dp2_pp2 and not spawned_workers \
and not and_plot"
TORCH=torch==2.11.0 TORCHVISION=torchvision==0.26.0 TORCHDATA=torchdata==0.11.0
# torch's own needs (its Requires-Dist without the CUDA ones), then the tests'.
PURE=(filelock "typing-extensions>=4.10.0" "sympy>=1.13.3" "networkx>=2.5.1" jinja2 "fsspec>=0.8.5"
      numpy pillow pytest)

tag=$(basename "$wheel" .whl)
[[ $tag == *-cp3[0-9]*-cp3[0-9]*-*aarch64 ]] || { echo "qemu_pytest: $tag: needs a per-version aarch64 wheel (cpXY-cpXY)"; exit 2; }
ver=$(echo "$tag" | sed -E 's/.*-cp3([0-9]+)-cp3[0-9]+-.*/3.\1/')
"$root/tools/wheel/setup_cross.sh" >/dev/null || { echo "qemu_pytest: tools/wheel/setup_cross.sh failed"; exit 2; }
"$root/tools/apt_install.sh" clang lld >/dev/null || { echo "qemu_pytest: clang and lld are needed"; exit 2; }
host_py=$root/.venv/bin/python; [ -x "$host_py" ] || host_py=python3

# The sysroot: qemu_smoke.sh's packages, and what torch (libstdc++, libgcc_s) and the stdlib's
# bz2, lzma, hashlib, uuid and crypt modules load.
sysroot=$root/build/pysysroot/aarch64-py$ver
sysroot_add() {
  local dl=$sysroot.dl
  mkdir -p "$dl" && (cd "$dl" && apt-get download -qq "${@/%/:arm64}") &&
    for p in "$@"; do dpkg -x "$(ls "$dl/${p}"_*_arm64.deb | tail -1)" "$sysroot" || return 1; done
}
if [ ! -x "$sysroot/usr/bin/python$ver" ]; then
  sysroot_add libc6 zlib1g libexpat1 libffi8 "python$ver-minimal" "libpython$ver-minimal" "libpython$ver-stdlib" ||
    { echo "qemu_pytest: apt-get download failed (dpkg --add-architecture arm64; apt-get update)"; exit 2; }
fi
if [ ! -e "$sysroot/usr/lib/aarch64-linux-gnu/libstdc++.so.6" ]; then
  sysroot_add libstdc++6 libgcc-s1 libbz2-1.0 liblzma5 libssl3 libuuid1 libcrypt1 ||
    { echo "qemu_pytest: apt-get download of the arm64 libraries failed"; exit 2; }
fi

# The aarch64 packages: downloaded once, installed once (the stamps name what was asked for).
cache=$root/build/qemu_pytest/py$ver
want="$TORCH $TORCHVISION $TORCHDATA ${PURE[*]}"
pip_x=(--only-binary=:all: --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64
       --platform manylinux2014_aarch64 --python-version "$ver" --implementation cp --abi "cp${ver/./}")
if [ "$(cat "$cache/wheels/.complete" 2>/dev/null)" != "$want" ]; then
  rm -rf "$cache/wheels" "$cache/site" "$cache/stubs"
  echo "qemu_pytest: downloading $want (aarch64, CPython $ver) into $cache/wheels"
  # --no-deps for torch and its family: their Requires-Dist names the CUDA wheels (and requests).
  "$host_py" -m pip download -q "${pip_x[@]}" --no-deps -d "$cache/wheels" "$TORCH" "$TORCHVISION" "$TORCHDATA" &&
    "$host_py" -m pip download -q "${pip_x[@]}" -d "$cache/wheels" "${PURE[@]}" ||
    { echo "qemu_pytest: pip download failed"; exit 2; }
  echo "$want" > "$cache/wheels/.complete"
fi
if [ "$(cat "$cache/site/.complete" 2>/dev/null)" != "$want" ]; then
  rm -rf "$cache/site" "$cache/stubs"
  "$host_py" -m pip install -q "${pip_x[@]}" --no-index --no-deps --no-compile --target "$cache/site" "$cache"/wheels/*.whl ||
    { echo "qemu_pytest: pip install --target failed"; exit 2; }
  echo "$want" > "$cache/site/.complete"
fi
if [ ! -e "$cache/stubs/.complete" ]; then
  "$host_py" "$root/tools/wheel/cuda_stubs.py" "$cache/site" "$sysroot" "$cache/stubs" >/dev/null ||
    { echo "qemu_pytest: tools/wheel/cuda_stubs.py failed"; exit 2; }
fi

# The wheel's gpufeed, unpacked fresh each run; the tests run from a temporary folder so that the
# checkout's python/gpufeed is not imported (as tools/check_wheel.sh's run_suite does).
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$host_py" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$work/pkg"
mkdir "$work/run" "$work/bin"
# The interpreter as a host script: sys.executable is this script (qemu's -0 sets argv[0]), so the
# tests' child Pythons (subprocess, spawn workers) run under qemu too: without a binfmt_misc entry
# for aarch64 (none here), exec of the aarch64 binary itself fails (Exec format error).
py=$work/bin/python$ver
printf '#!/bin/sh\nexec qemu-aarch64-static -0 "$0" -L "%s" "%s" "$@"\n' "$sysroot" "$sysroot/usr/bin/python$ver" > "$py"
chmod +x "$py"
tests=("${SUBSET[@]/#/$root/python/tests/}")
echo "qemu_pytest: $(basename "$wheel") with $TORCH (CUDA stubbed), $TORCHVISION under qemu-aarch64: ${SUBSET[*]} -k '$DESELECT'"
(cd "$work/run" && env -u PYTHONHOME GPUFEED_CLI= GPUFEED_SHARED_DIR="${GPUFEED_SHARED_DIR:-$root/../shared}" \
   PYTHONPATH="$work/pkg:$cache/site" PYTHONNOUSERSITE=1 LD_LIBRARY_PATH="$cache/stubs" \
   "$py" -m pytest -q -p no:cacheprovider -rs \
   "${tests[@]}" -k "$DESELECT") 2>&1 | tee "$work/log"
rc=${PIPESTATUS[0]}
summary=$(grep -E '^=*.* in [0-9.]+s' "$work/log" | tail -1)
count() { echo "$summary" | grep -oE "[0-9]+ $1" | grep -oE '^[0-9]+' || echo 0; }
passed=$(count passed) failed=$(count failed) skipped=$(count skipped) errors=$(count error)
echo "qemu_pytest: $passed passed, $failed failed, $skipped skipped, $errors errors in $((SECONDS - start)) s"
((rc == 0 && failed == 0 && errors == 0 && passed > 0))
