#!/usr/bin/env bash
# What the cross builds and qemu runs need from Debian 12, installed when missing (idempotent; apt
# with sudo when not root): tools/wheel/build_deps.sh (apt-get source: dpkg-dev and a deb-src
# line for bookworm; nasm for libjpeg-turbo's x86_64 SIMD), tools/qemu_tests.sh,
# tools/wheel/qemu_smoke.sh and tools/wheel/qemu_pytest.sh (qemu-user-static; Debian's arm64
# packages downloaded, never installed, so dpkg needs the arm64 architecture). The zig toolchain
# itself is PyPI's ziglang, which build_deps.sh puts in build/zigvenv. Called by those scripts;
# run it alone to prepare a machine:
#   tools/wheel/setup_cross.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
changed=0
# apt-get source needs source indexes: a deb-src entry for bookworm (deb822 or one-line form).
if ! grep -rqsE '^(deb-src|Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  echo "setup_cross: adding /etc/apt/sources.list.d/gpufeed-debian-src.sources (deb-src, bookworm)"
  printf '%s\n' "Types: deb-src" "URIs: http://deb.debian.org/debian" "Suites: bookworm bookworm-updates" \
    "Components: main" "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" |
    $SUDO tee /etc/apt/sources.list.d/gpufeed-debian-src.sources >/dev/null
  changed=1
fi
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "setup_cross: dpkg --add-architecture arm64 (for apt-get download of arm64 packages)"
  $SUDO dpkg --add-architecture arm64
  changed=1
fi
((changed)) && $SUDO apt-get update -qq
"$root/tools/apt_install.sh" qemu-user-static nasm dpkg-dev
