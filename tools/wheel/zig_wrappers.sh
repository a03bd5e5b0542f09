#!/usr/bin/env bash
# Writes cc, c++, ar, ranlib wrappers that run zig's toolchain for one target into DIR, so that
# CMake, autotools-style makefiles and OpenSSL's Configure all see plain compiler commands:
#   tools/wheel/zig_wrappers.sh TARGET DIR [ZIG]
# TARGET is zig's triple with the glibc floor, e.g. aarch64-linux-gnu.2.28 or
# x86_64-linux-gnu.2.28: zig links against stubs of exactly that glibc, so nothing newer can be
# needed, and links libc++/libunwind/compiler-rt statically (no GLIBCXX, no libgcc_s).
# ZIG: the zig binary; default: the one of PyPI's ziglang in build/zigvenv (tools/wheel/build_deps.sh
# makes that venv).
set -euo pipefail
target=$1 dir=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
zig=${3:-$(ls "$root"/build/zigvenv/lib/python3*/site-packages/ziglang/zig 2>/dev/null | head -n1)}
[ -x "$zig" ] || { echo "zig_wrappers: no zig binary (pip install ziglang into build/zigvenv)" >&2; exit 2; }
mkdir -p "$dir"
write() {  # name, zig subcommand, extra args
  printf '#!/bin/sh\nexec "%s" %s "$@"\n' "$zig" "$2" >"$dir/$1.tmp"
  chmod +x "$dir/$1.tmp" && mv "$dir/$1.tmp" "$dir/$1"
}
write cc "cc -target $target"
write c++ "c++ -target $target"
write ar "ar"
write ranlib "ranlib"
