#!/usr/bin/env bash
# Smoke test of an aarch64 wheel of tools/wheel/build_zig_wheel.sh on this x86_64 machine: Debian's
# CPython of the wheel's version for arm64 (apt-get download + dpkg -x, no install) runs under
# qemu-aarch64-static, loads the wheel's gpufeed._C and decodes one JPEG
# (tools/wheel/smoke_extension.py); the pixels' sha256 must equal that of the .venv's gpufeed._C
# (this machine's build) on the same file.
#   tools/wheel/qemu_smoke.sh WHEEL [IMAGE]
# Only a per-version wheel of a CPython Debian ships (bookworm: cp311, built with --py-include) can
# run: the cp312-abi3 wheel needs an aarch64 CPython >= 3.12, which neither Debian 12 nor PyPI has.
# Needs qemu-user-static and dpkg's arm64 architecture: tools/wheel/setup_cross.sh (run first)
# installs them when missing.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
tools/wheel/setup_cross.sh >&2
wheel=$(realpath "$1")
image=${2:-$ROOT/../shared/data/hymenoptera/train/bees/2467959963_a7831e9ff0.jpg}
tag=$(basename "$wheel" .whl)
[[ $tag == *-cp3[0-9]*-cp3[0-9]*-*aarch64 ]] || { echo "qemu_smoke: $tag: needs a per-version aarch64 wheel (cpXY-cpXY)" >&2; exit 2; }
ver=$(echo "$tag" | sed -E 's/.*-cp3([0-9]+)-cp3[0-9]+-.*/3.\1/')
sysroot=$ROOT/build/pysysroot/aarch64-py$ver
if [ ! -x "$sysroot/usr/bin/python$ver" ]; then
  dl=$sysroot.dl
  mkdir -p "$dl"
  (cd "$dl" && apt-get download -qq libc6:arm64 zlib1g:arm64 libexpat1:arm64 libffi8:arm64 \
     "python$ver-minimal:arm64" "libpython$ver-minimal:arm64" "libpython$ver-stdlib:arm64") ||
    { echo "qemu_smoke: apt-get download failed (dpkg --add-architecture arm64; apt-get update)" >&2; exit 2; }
  for deb in "$dl"/*.deb; do dpkg -x "$deb" "$sysroot"; done
fi
unpacked=$(mktemp -d)
trap 'rm -rf "$unpacked"' EXIT
.venv/bin/python -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$wheel" "$unpacked"
got=$(qemu-aarch64-static -L "$sysroot" "$sysroot/usr/bin/python$ver" tools/wheel/smoke_extension.py "$unpacked" "$image")
echo "$got"
host=$(.venv/bin/python -c 'import gpufeed._C as c, os; print(os.path.dirname(os.path.dirname(c.__file__)))')
want=$(.venv/bin/python tools/wheel/smoke_extension.py "$host" "$image")
echo "$want (this machine's)"
[ "${got##* sha256 }" = "${want##* sha256 }" ] || { echo "qemu_smoke: the aarch64 pixels differ" >&2; exit 1; }
echo "qemu_smoke: $(basename "$wheel"): decoded under qemu-aarch64, pixels equal this machine's"
