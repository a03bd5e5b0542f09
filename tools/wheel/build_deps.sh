#!/usr/bin/env bash
# Builds the dependencies of gpufeed's torch-free rooms (and of their tests) from Debian 12's
# sources as static, position-independent libraries for one zig target (and Google Highway's
# headers), into PREFIX:
#   tools/wheel/build_deps.sh TARGET PREFIX [PACKAGE...]
#   tools/wheel/build_deps.sh aarch64-linux-gnu.2.28 build/deps/aarch64-linux-gnu.2.28
# TARGET is zig's triple with the glibc floor (cmake/toolchains/zig.cmake); PACKAGE... limits the
# build to those names (default: all, in dependency order). A package already in PREFIX
# (PREFIX/.stamps/NAME) is skipped; remove the stamp to rebuild it.
#
# Sources: `apt-get source` of the versions pinned below (needs a deb-src line for bookworm in
# /etc/apt/sources.list.d and dpkg-dev), cached in build/deps/src. The pinned SHA-256 is the .dsc's;
# dpkg-source then checks the tarballs against the .dsc's own SHA-256 lines and applies Debian's
# patches (its security fixes among them). A version that Debian has since replaced is no longer
# served: update its pin (apt-cache showsrc NAME) and its .dsc's sha256sum.
# Toolchain: PyPI's ziglang (pinned) in build/zigvenv, made here when missing. NASM (Debian's
# nasm) for libjpeg-turbo's x86_64 SIMD; aarch64's NEON needs nothing else.
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,6p' "$0"; exit 2; }
target=$1
mkdir -p "$2" && prefix=$(cd "$2" && pwd)
shift 2
root=$(cd "$(dirname "$0")/../.." && pwd)
src="$root/build/deps/src"
work="$root/build/deps/work/$target"
jobs=${GPUFEED_DEPS_JOBS:-2}
# setup.sh reads the next line: its .venv gets the same ziglang (tools/qemu_kernels.sh).
ZIGLANG_VERSION=0.17.1
mkdir -p "$src" "$work" "$prefix/.stamps"

# name  debian-source=version  sha256 of the .dsc
PINS="
zlib          zlib=1:1.2.13.dfsg-1               3fa1e6b2fc525062aa88207dda52fed8e045373c809d362fe8a2bfbf7cf515a8
libjpeg-turbo libjpeg-turbo=1:2.1.5-2            d718ead0dfbcbc8523665c02a7f7152e31039ded641d022868722623bb3b486d
libpng        libpng1.6=1.6.39-2+deb12u5         7b86211030a34deb6b0a2cd7e1d9db0fe92443fd30cab537fb89b1e7f7c9f188
giflib        giflib=5.2.1-2.5+deb12u1           5206a92fd4a057768f429033a3a80bc1e06453f6c60dfec243d8188fa6ade3f4
libwebp       libwebp=1.2.4-0.2+deb12u1          d9ed0b59e2010f255c28d0869fd15b31f9b08aed757bfc91862d43aa9ec1aa99
tiff          tiff=4.5.0-6+deb12u4               b32082304d725936078d687303fcf771c9ecf738b505f9a66a29e8ba282c8615
onetbb        onetbb=2021.8.0-2+deb12u1          f01de0ed79cb49b48beb2cdb6e1b3c5f625ca65f07d7959bebfbbd89a2e941ad
fmt           fmtlib=9.1.0+ds1-2                 1c8982464f1281f5b7d42ca24e058d80d71db7c381b278cc22cbdb40c534f0c5
spdlog        spdlog=1:1.10.0+ds-0.4             65220c192ef8e524d0687058d5d24e1bdd3e2ebc9b6e846c3ec8d43f77fe9e5c
nlohmann_json nlohmann-json3=3.11.2-2            70bec2cd47a992e0fcf5b92d820d264b871c15278cce68edcc05dbb579d795a0
googletest    googletest=1.12.1-0.2              cc90251040c145be18d5090787d9ec79e48217c6cef3ae78eb20f0e31551404c
openssl       openssl=3.0.20-1~deb12u2           a614474a2773c23b10c0d65f4eccbcf93fdac4749afb7c26d76e1b0340154d3d
curl          curl=7.88.1-10+deb12u15            2744f12e3aef161c0361743fa1b318296b122e566e47f381e4a63320fbcc23f4
highway       highway=1.0.3-3+deb12u1            e85a23bede87aaf121fc530d30ccfa30d0d9e5620ea51736578620e5d3245401
"

log() { printf 'build_deps[%s]: %s\n' "$target" "$*"; }

ensure_zig() {
  local py="$root/build/zigvenv/bin/python"
  if ! "$py" -c "import ziglang" 2>/dev/null; then
    python3 -m venv "$root/build/zigvenv"
    "$py" -m pip install -q "ziglang==$ZIGLANG_VERSION"
  fi
  bin="$root/build/zig-wrappers/$target"
  "$root/tools/wheel/zig_wrappers.sh" "$target" "$bin"
  export CC="$bin/cc" CXX="$bin/c++" AR="$bin/ar" RANLIB="$bin/ranlib"
}

# Unpacks NAME's pinned Debian source (downloaded once into $src) into $work/NAME; prints the folder.
unpack() {
  local name=$1 line spec sum dsc
  line=$(awk -v n="$name" '$1 == n' <<<"$PINS")
  spec=$(awk '{print $2}' <<<"$line") sum=$(awk '{print $3}' <<<"$line")
  local pkg=${spec%%=*} ver=${spec#*=}
  dsc="$src/${pkg}_${ver#*:}.dsc"
  [ -f "$dsc" ] || (cd "$src" && apt-get source --download-only -qq "$spec" >/dev/null)
  echo "$sum  $dsc" | sha256sum -c --quiet - >&2
  rm -rf "$work/$name"
  # (Debian's signing keys are not needed: the pinned .dsc hash stands for them.)
  dpkg-source -x "$dsc" "$work/$name" >"$work/$name.unpack.log" 2>&1 || { cat "$work/$name.unpack.log" >&2; return 1; }
  echo "$work/$name"
}

# CMake build of the source folder $1 with extra -D options, installed into $prefix.
cmake_build() {
  local dir=$1; shift
  nice -n 19 cmake -S "$dir" -B "$dir/_build" -G Ninja -Wno-dev -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_TOOLCHAIN_FILE="$root/cmake/toolchains/zig.cmake" -DGPUFEED_ZIG_TARGET="$target" \
    -DGPUFEED_ZIG_PREFIX="$prefix" -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_LIBDIR=lib \
    -DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=ON -DBUILD_TESTING=OFF "$@" >"$dir/_configure.log"
  nice -n 19 cmake --build "$dir/_build" -j "$jobs" >"$dir/_build.log"
  cmake --install "$dir/_build" >/dev/null
}

build_zlib() {  # zlib's CMake build always adds a shared library: its configure makes only libz.a.
  local d; d=$(unpack zlib)
  (cd "$d" && CFLAGS="-O2 -fPIC" nice -n 19 ./configure --static --prefix="$prefix" >/dev/null &&
    nice -n 19 make -j "$jobs" libz.a >/dev/null && make install >/dev/null)
}

build_libjpeg-turbo() {
  local d simd=(); d=$(unpack libjpeg-turbo)
  # x86_64's SIMD is NASM source (Debian's nasm); aarch64's NEON is intrinsics + GAS, built by zig.
  [[ $target == x86_64-* ]] && simd=(-DCMAKE_ASM_NASM_COMPILER="$(command -v nasm)")
  # Its own GNUInstallDirs takes a relative CMAKE_INSTALL_LIBDIR from the source folder: the default instead.
  cmake_build "$d" -DCMAKE_INSTALL_DEFAULT_LIBDIR=lib -UCMAKE_INSTALL_LIBDIR -DENABLE_SHARED=OFF -DENABLE_STATIC=ON -DWITH_SIMD=ON -DREQUIRE_SIMD=ON \
    -DWITH_TURBOJPEG=ON -DWITH_JAVA=OFF "${simd[@]}"
  # decode/src/jpeg.cpp wraps the marker reader (struct jpeg_marker_reader): Debian's -dev ships it too.
  install -m 644 "$d/jpegint.h" "$prefix/include/jpegint.h"
}

build_libpng() {
  local d; d=$(unpack libpng)
  cmake_build "$d" -DPNG_SHARED=OFF -DPNG_STATIC=ON -DPNG_TESTS=OFF -DPNG_EXECUTABLES=OFF -DSKIP_INSTALL_PROGRAMS=ON
}

build_giflib() {  # giflib's Makefile always links a shared library: the seven library sources.
  local d; d=$(unpack giflib)
  (cd "$d" && for f in dgif_lib egif_lib gifalloc gif_err gif_font gif_hash openbsd-reallocarray; do
     nice -n 19 "$CC" -O2 -fPIC -c "$f.c" -o "$f.o"; done &&
   rm -f libgif.a && "$AR" rcs libgif.a ./*.o &&
   install -D -m 644 libgif.a "$prefix/lib/libgif.a" && install -D -m 644 gif_lib.h "$prefix/include/gif_lib.h")
}

build_libwebp() {
  local d; d=$(unpack libwebp)
  cmake_build "$d" -DWEBP_BUILD_ANIM_UTILS=OFF -DWEBP_BUILD_CWEBP=OFF -DWEBP_BUILD_DWEBP=OFF \
    -DWEBP_BUILD_GIF2WEBP=OFF -DWEBP_BUILD_IMG2WEBP=OFF -DWEBP_BUILD_VWEBP=OFF -DWEBP_BUILD_WEBPINFO=OFF \
    -DWEBP_BUILD_WEBPMUX=OFF -DWEBP_BUILD_EXTRAS=OFF -DWEBP_BUILD_LIBWEBPMUX=ON
}

build_tiff() {  # baseline, LZW, PackBits, deflate (zlib) and JPEG (libjpeg-turbo); nothing else
  local d; d=$(unpack tiff)
  cmake_build "$d" -Dtiff-tools=OFF -Dtiff-tests=OFF -Dtiff-contrib=OFF -Dtiff-docs=OFF -Dcxx=OFF \
    -Dzlib=ON -Djpeg=ON -Dold-jpeg=OFF -Djpeg12=OFF -Djbig=OFF -Dlerc=OFF -Dlzma=OFF -Dzstd=OFF \
    -Dwebp=OFF -Dlibdeflate=OFF -Dpixarlog=OFF
}

build_onetbb() {
  local d; d=$(unpack onetbb)
  cmake_build "$d" -DTBB_TEST=OFF -DTBB_EXAMPLES=OFF -DTBB_STRICT=OFF -DTBBMALLOC_BUILD=OFF -DTBB_ENABLE_IPO=OFF
}

build_fmt() {
  local d; d=$(unpack fmt)
  cmake_build "$d" -DFMT_TEST=OFF -DFMT_DOC=OFF
}

build_spdlog() {  # Debian's source has no bundled fmt: the external one above, as Debian builds it
  local d; d=$(unpack spdlog)
  cmake_build "$d" -DSPDLOG_FMT_EXTERNAL=ON -DSPDLOG_BUILD_EXAMPLE=OFF -DSPDLOG_BUILD_TESTS=OFF \
    -DSPDLOG_BUILD_BENCH=OFF -DSPDLOG_BUILD_SHARED=OFF
}

build_nlohmann_json() {
  local d; d=$(unpack nlohmann_json)
  cmake_build "$d" -DJSON_BuildTests=OFF -DJSON_Install=ON
}

build_googletest() {
  local d; d=$(unpack googletest)
  cmake_build "$d" -DBUILD_GMOCK=OFF -DINSTALL_GTEST=ON
}

build_openssl() {  # libcrypto and libssl only (curl's TLS; gpufeed pack's SHA-256)
  local d os; d=$(unpack openssl)
  case $target in aarch64-*) os=linux-aarch64 ;; x86_64-*) os=linux-x86_64 ;; *) echo "openssl: $target?" >&2; return 1 ;; esac
  (cd "$d" && nice -n 19 ./Configure "$os" no-shared no-tests no-engine no-module \
     --prefix="$prefix" --libdir=lib --openssldir=/etc/ssl -fPIC >"$d/_configure.log" &&
   nice -n 19 make -j "$jobs" build_libs >"$d/_build.log" && make install_dev >/dev/null)
}

build_curl() {  # HTTP and HTTPS only, OpenSSL, zlib; no LDAP, RTMP, Kerberos, PSL, IDN, SSH, HTTP/2
  local d; d=$(unpack curl)
  cmake_build "$d" -DBUILD_CURL_EXE=OFF -DHTTP_ONLY=ON -DCURL_USE_OPENSSL=ON -DOPENSSL_USE_STATIC_LIBS=ON \
    -DCURL_ZLIB=ON -DCURL_BROTLI=OFF -DCURL_ZSTD=OFF -DUSE_NGHTTP2=OFF -DUSE_LIBIDN2=OFF \
    -DCURL_USE_LIBPSL=OFF -DCURL_USE_LIBSSH2=OFF -DCURL_USE_GSSAPI=OFF -DCURL_DISABLE_LDAP=ON \
    -DCURL_DISABLE_LDAPS=ON -DENABLE_MANUAL=OFF -DCURL_CA_BUNDLE=none -DCURL_CA_PATH=none
}

build_highway() {  # headers only (the resize's NEON kernel uses static dispatch: no libhwy to link)
  local d; d=$(unpack highway)
  mkdir -p "$prefix/include/hwy/ops"
  install -m 644 "$d"/hwy/*.h "$prefix/include/hwy/"
  install -m 644 "$d"/hwy/ops/*.h "$prefix/include/hwy/ops/"
}

ensure_zig
all=(zlib libjpeg-turbo libpng giflib libwebp tiff onetbb fmt spdlog nlohmann_json googletest openssl curl highway)
(($#)) || set -- "${all[@]}"
for name in "$@"; do
  [ -f "$prefix/.stamps/$name" ] && { log "$name: already built"; continue; }
  t0=$SECONDS
  log "$name ..."
  "build_$name"
  touch "$prefix/.stamps/$name"
  log "$name: $((SECONDS - t0)) s"
done
# The libraries are static: no shared object of a dependency may be picked up by a link.
find "$prefix/lib" -name '*.so*' -print -delete
