#!/usr/bin/env bash
# Builds, on this (CPU) machine, what tools/gpu_check.sh runs on the GPU machine, and gathers it
# in .gpu_bundle/ (git-ignored; name it in the device tool's `carry`):
#   bin/  gpufeed, test_gpu, test_prefetch, gpufeed_gpu_bench (sm_90 + sm_80 code)
#   py/   the gpufeed Python package with its extension (PYTHONPATH=.gpu_bundle/py)
#   lib/  the shared libraries they need that the GPU image lacks (Debian's libjpeg-turbo, giflib,
#         libpng, libwebp, oneTBB, spdlog, fmt, ...). Torch, CUDA and glibc are
#         taken from the GPU image (torch 2.11.0+cu130 there too).
# The bundle is built with GPUFEED_WITH_IMGCODECS=OFF, which leaves libtiff (and its codec
# dependencies) out: TIFF then decodes as kUnsupported, which the GPU check never needs. Fails if the bundle exceeds 60 MiB (the device tool carries 64 MiB per call).
set -euo pipefail
cd "$(dirname "$0")/.."
./setup.sh --no-build
BUILD=build/gpu
# Static gpufeed libraries: the binaries carry them (only third-party libraries go to lib/).
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPUFEED_WITH_IMGCODECS=OFF -DBUILD_SHARED_LIBS=OFF \
  -DGPUFEED_BUILD_TESTS=ON -DTORCH_CUDA_ARCH_LIST="8.0;9.0" -DCMAKE_CUDA_ARCHITECTURES="80;90" >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target gpufeed test_gpu test_prefetch gpufeed_gpu_bench _C
# The GPU image's python3 is 3.12; the venv here may be another version. When a CPython 3.12's
# headers are here (GPUFEED_PY312_INCLUDE, or pyenv's), the extension's Python-facing objects
# (module, profile, nanobind) are compiled a second time against them, with the same commands
# ninja ran, and linked as _C.cpython-312-x86_64-linux-gnu.so beside the venv's own _C.
PY_INC=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
PY312_INC=${GPUFEED_PY312_INCLUDE:-$(ls -d /root/.pyenv/versions/3.12*/include/python3.12 2>/dev/null | head -n 1 || true)}
PY312_SO=""
if [ -n "$PY312_INC" ] && [ "$PY312_INC" != "$PY_INC" ]; then
  ninja -C "$BUILD" -t commands _C | python3 -c '
import re, sys
py_inc, py312_inc = sys.argv[1], sys.argv[2]
for line in sys.stdin:
    line = line.rstrip("\n")
    if py_inc in line or "ar qc python/libnanobind-static.a" in line or "_C.cpython-" in line:
        line = line.replace(py_inc, py312_inc).replace("python/CMakeFiles/", "python312/CMakeFiles/")
        line = line.replace("python/libnanobind-static.a", "python312/libnanobind-static.a")
        line = re.sub(r"python/gpufeed/_C[.]cpython-[^ ]*[.]so", "python312/_C.cpython-312-x86_64-linux-gnu.so", line)
        print(line)' "$PY_INC" "$PY312_INC" > "$BUILD/py312_commands.sh"
  (cd "$BUILD" && grep -o -- '-o [^ ]*' py312_commands.sh | cut -c4- | xargs -n1 dirname | sort -u | xargs mkdir -p \
     && bash -e py312_commands.sh)
  PY312_SO="$BUILD/python312/_C.cpython-312-x86_64-linux-gnu.so"
fi
B=.gpu_bundle
rm -rf "$B"
mkdir -p "$B/bin" "$B/lib" "$B/lib-compat"
cp "$BUILD/tools/gpufeed" "$BUILD/tests/test_gpu" "$BUILD/tests/test_prefetch" \
   "$BUILD/tools/gpufeed_gpu_bench" "$B/bin/"
strip --strip-unneeded "$B"/bin/*
# The Python package (py/gpufeed: the .py files and _C) for examples/python/train_imagenet.py and
# train_pipeline.py.
mkdir -p "$B/py"
cp -rL "$BUILD/python/gpufeed" "$B/py/"
rm -rf "$B/py/gpufeed/__pycache__"
[ -n "$PY312_SO" ] && cp "$PY312_SO" "$B/py/gpufeed/"
strip --strip-unneeded "$B"/py/gpufeed/_C*.so
# Libraries: everything the binaries resolve here except torch/CUDA (from the GPU image's torch)
# and glibc; libstdc++/libgcc_s go to lib-compat, used only if the image's own are too old.
for bin in "$B"/bin/* "$B"/py/gpufeed/_C*.so; do ldd "$bin"; done | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$lib" in
    */site-packages/*|/usr/local/cuda*|*/libcuda.so*) ;;
    */libc.so.*|*/libm.so.*|*/libpthread.so.*|*/libdl.so.*|*/librt.so.*|*/libutil.so.*|*/libresolv.so.*|*/ld-linux*) ;;
    */libstdc++.so.*|*/libgcc_s.so.*) cp -L "$lib" "$B/lib-compat/" ;;
    *) cp -L "$lib" "$B/lib/" ;;
  esac
done
size_kb=$(du -sk "$B" | cut -f1)
echo "gpu_bundle: $(ls "$B/lib" | wc -l) libraries, $((size_kb / 1024)) MiB in $B"
if [ "$size_kb" -gt $((60 * 1024)) ]; then
  echo "gpu_bundle: too large to carry (> 60 MiB)" >&2
  exit 1
fi
