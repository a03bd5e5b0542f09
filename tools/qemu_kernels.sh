#!/usr/bin/env bash
# The aarch64 (NEON) build of the Highway kernels against the scalar kernels, byte for byte, in
# under a minute: tests/qemu_kernels.cpp and only the transforms' sources it needs, cross-compiled
# with zig for aarch64-linux-musl (static: qemu needs no sysroot), run under qemu-aarch64-static.
# The ctest case qemu_aarch64_kernels of a Release build runs it (tests/CMakeLists.txt), so every
# CI run checks NEON without tools/qemu_tests.sh's static dependency builds.
#   tools/qemu_kernels.sh [OUT]       OUT: objects and program (default build/qemu-kernels)
# Needs zig (PyPI's ziglang: .venv's, installed by setup.sh, else build/zigvenv's, made by
# tools/wheel/build_deps.sh; or $GPUFEED_ZIG), qemu-aarch64-static (Debian's qemu-user-static,
# installed by setup.sh) and the host's header-only fmt and Highway (/usr/include/fmt, hwy: Debian's
# libfmt-dev, libhwy-dev). A missing one fails the run with its name. zig's cache is its default
# (~/.cache/zig, where build_deps.sh's builds go): the first run there also builds zig's libc++
# and musl for aarch64 (about 2 minutes of CPU), later runs only the sources.
# Exit status: the program's (0: every byte equal, 1: a difference), 2 when a tool or header is missing or the
# build fails.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build/qemu-kernels}
# The kernels' sources (and what they call); a kernel in a new file adds it here.
SOURCES=(loader/transforms/src/resize.cpp loader/transforms/src/resize_hwy.cpp
         loader/transforms/src/augment.cpp loader/transforms/src/colour_hwy.cpp
         loader/transforms/src/augment_hwy.cpp tests/qemu_kernels.cpp)
# The Release build's flags that the bytes depend on (top-level CMakeLists.txt: no fused
# multiply-adds; CMake's Release: -O3 -DNDEBUG).
TARGET=aarch64-linux-musl
FLAGS=(-target "$TARGET" -std=c++20 -O3 -DNDEBUG -ffp-contract=off -DFMT_HEADER_ONLY)

fail() { echo "qemu_kernels: $*"; exit 2; }
zig=${GPUFEED_ZIG:-}
if [ -z "$zig" ]; then
  zig=$(ls "$root"/.venv/lib/python3*/site-packages/ziglang/zig \
            "$root"/build/zigvenv/lib/python3*/site-packages/ziglang/zig 2>/dev/null | head -n1 || true)
fi
[ -n "$zig" ] && [ -x "$zig" ] ||
  fail "no zig: ./setup.sh installs PyPI's ziglang into .venv (or set GPUFEED_ZIG)"
qemu=$(command -v qemu-aarch64-static) ||
  fail "no qemu-aarch64-static: ./setup.sh installs it (apt-get install qemu-user-static)"
# A private include folder with only fmt and Highway: the host's glibc headers stay off the path.
mkdir -p "$out/include" "$out/obj"
for lib in fmt/format.h hwy/highway.h; do
  [ -f "/usr/include/$lib" ] || fail "no /usr/include/$lib (libfmt-dev, libhwy-dev: ./setup.sh)"
  ln -sfn "/usr/include/${lib%%/*}" "$out/include/${lib%%/*}"
done
# zig's default cache, named: under ctest XDG_CACHE_HOME is the build's own (tests/CMakeLists.txt),
# where every fresh build folder would build libc++ and musl again.
export ZIG_GLOBAL_CACHE_DIR=${ZIG_GLOBAL_CACHE_DIR:-${HOME:-$root/build}/.cache/zig}

rm -f "$out"/obj/*.o "$out/qemu_kernels"
t0=$SECONDS
compile() {  # source -> OUT/obj/NAME.o
  nice -n 10 "$zig" c++ "${FLAGS[@]}" -isystem "$out/include" -I"$root/loader/transforms/include" \
    -I"$root/common/include" -I"$root/decode/include" -c "$root/$1" -o "$out/obj/$(basename "$1" .cpp).o"
}
# Two at a time (the CI machine's two cores).
pids=() failed=0
for s in "${SOURCES[@]}"; do
  compile "$s" & pids+=($!)
  if ((${#pids[@]} == 2)); then wait "${pids[0]}" || failed=1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
((failed == 0)) || fail "compiling failed (zig $("$zig" version))"
objects=()
for s in "${SOURCES[@]}"; do objects+=("$out/obj/$(basename "$s" .cpp).o"); done
# zig builds the libraries it links (compiler-rt, libunwind) in the link's optimize mode: -O3
# (without one, Debug mode also builds and links UBSan's runtime).
nice -n 10 "$zig" c++ -target "$TARGET" -static -O3 -fno-sanitize=undefined "${objects[@]}" \
  -o "$out/qemu_kernels" || fail "linking failed"
echo "qemu_kernels: built with zig $("$zig" version) for $TARGET in $((SECONDS - t0)) s"
t0=$SECONDS
status=0
"$qemu" "$out/qemu_kernels" || status=$?
echo "qemu_kernels: ran under $(basename "$qemu") in $((SECONDS - t0)) s, exit status $status"
exit "$status"
