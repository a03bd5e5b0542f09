#!/usr/bin/env bash
# Builds, on this (CPU) machine, what tools/gpu_check.sh runs on the GPU machine, and gathers it
# in .gpu_bundle/, packed as .gpu_bundle.tar.xz (both git-ignored; name the archive in the device
# tool's `carry`):
#   bin/  gpufeed, test_gpu, test_prefetch, gpufeed_gpu_bench (sm_90 + sm_80 code)
#   py/   the repaired wheel (tools/build_wheel.sh) for the GPU image's CPython 3.12, unpacked:
#         gpufeed/ and the libraries it carries, gpufeed.libs/ (PYTHONPATH=.gpu_bundle/py)
#   nv/   nvImageCodec with its nvJPEG extension and libnvjpeg (decode_device gpu/auto)
#   lib/  the shared libraries they need that the GPU image lacks (Debian's libjpeg-turbo, giflib,
#         libpng, libwebp, oneTBB, spdlog, fmt, ...). Torch, CUDA and glibc are
#         taken from the GPU image (torch 2.11.0+cu130 there too).
# The bundle is built with GPUFEED_WITH_IMGCODECS=OFF, which leaves libtiff (and its codec
# dependencies) out: TIFF then decodes as kUnsupported, which the GPU check never needs. Fails if the packed bundle exceeds 56 MiB (the device tool carries 64 MiB per call, the tree included).
set -euo pipefail
cd "$(dirname "$0")/.."
./setup.sh --no-build
BUILD=build/gpu
LAUNCHER=()  # ccache where the machine has it, as setup.sh does
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
# Static gpufeed libraries: the binaries carry them (only third-party libraries go to lib/).
cmake -S . -B "$BUILD" -G Ninja "${LAUNCHER[@]}" -DCMAKE_BUILD_TYPE=Release -DGPUFEED_WITH_IMGCODECS=OFF -DBUILD_SHARED_LIBS=OFF \
  -DGPUFEED_BUILD_TESTS=ON -DTORCH_CUDA_ARCH_LIST="8.0;9.0" -DCMAKE_CUDA_ARCHITECTURES="80;90" >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target gpufeed test_gpu test_prefetch gpufeed_gpu_bench
# The GPU image's python3 is 3.12: the stable-ABI wheel, built with a CPython >= 3.12 of this
# machine (GPUFEED_PY312, or pyenv's), else the .venv's (then its own version only).
PY312=${GPUFEED_PY312:-$(ls /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | tail -n 1 || true)}
rm -rf build/wheel/gpu
./tools/build_wheel.sh --out build/wheel/gpu ${PY312:-.venv/bin/python} >/dev/null
B=.gpu_bundle
rm -rf "$B"
mkdir -p "$B/bin" "$B/lib" "$B/lib-compat"
cp "$BUILD/tools/gpufeed" "$BUILD/tests/test_gpu" "$BUILD/tests/test_prefetch" \
   "$BUILD/tools/gpufeed_gpu_bench" "$B/bin/"
strip --strip-unneeded "$B"/bin/*
# The Python package from the wheel (needs nothing of lib/) for examples/python/train_imagenet.py
# and train_pipeline.py.
mkdir -p "$B/py"
.venv/bin/python -c 'import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]' \
  "$B/py" build/wheel/gpu/gpufeed-*.whl
# Libraries: everything the binaries resolve here except torch/CUDA (from the GPU image's torch)
# and glibc; libstdc++/libgcc_s go to lib-compat, used only if the image's own are too old.
for bin in "$B"/bin/*; do ldd "$bin"; done | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$lib" in
    */site-packages/*|/usr/local/cuda*|*/libcuda.so*) ;;
    */libc.so.*|*/libm.so.*|*/libpthread.so.*|*/libdl.so.*|*/librt.so.*|*/libutil.so.*|*/libresolv.so.*|*/ld-linux*) ;;
    */libstdc++.so.*|*/libgcc_s.so.*) cp -L "$lib" "$B/lib-compat/" ;;
    *) cp -L "$lib" "$B/lib/" ;;
  esac
done
# nvImageCodec for decode_device gpu/auto (the GPU image has none): the library, its nvJPEG
# extension and libnvjpeg, from the .venv's nvidia-nvimgcodec-cu13 and nvidia-nvjpeg wheels, in
# the wheels' own layout (the extension finds libnvjpeg through its run path ../../cu13/lib).
NV=$(.venv/bin/python -c 'import os, nvidia.nvimgcodec as n; print(os.path.dirname(os.path.dirname(n.__file__)))' 2>/dev/null || true)
if [ -n "$NV" ] && [ -f "$NV/nvimgcodec/libnvimgcodec.so.0" ] && [ -f "$NV/cu13/lib/libnvjpeg.so.13" ]; then
  mkdir -p "$B/nv/nvidia/nvimgcodec/extensions" "$B/nv/nvidia/cu13/lib"
  cp -L "$NV/nvimgcodec/libnvimgcodec.so.0" "$B/nv/nvidia/nvimgcodec/"
  cp -L "$NV"/nvimgcodec/extensions/libnvjpeg_ext.so.* "$B/nv/nvidia/nvimgcodec/extensions/"
  cp -L "$NV/cu13/lib/libnvjpeg.so.13" "$B/nv/nvidia/cu13/lib/"
else
  echo "gpu_bundle: no nvidia-nvimgcodec-cu13 / nvidia-nvjpeg in .venv: the GPU decode steps will skip" >&2
fi
# What travels is one archive (the device tool carries 64 MiB per call): .gpu_bundle.tar.xz, which
# tools/gpu_check.sh unpacks there when .gpu_bundle/ is absent.
tar -C "$(dirname "$B")" -cf - "$(basename "$B")" | xz -T0 -6 > "$B.tar.xz"
size_kb=$(du -sk "$B" | cut -f1)
packed_kb=$(du -sk "$B.tar.xz" | cut -f1)
echo "gpu_bundle: $(ls "$B/lib" | wc -l) libraries, $((size_kb / 1024)) MiB in $B, $((packed_kb / 1024)) MiB in $B.tar.xz (carry that)"
if [ "$packed_kb" -gt $((56 * 1024)) ]; then
  echo "gpu_bundle: too large to carry (> 56 MiB packed)" >&2
  exit 1
fi
