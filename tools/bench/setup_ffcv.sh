#!/usr/bin/env bash
# Opt-in: a separate venv with FFCV 1.0.2 for tools/bench/bench_ffcv.py (gpufeed beside FFCV,
# docs/PERFORMANCE.md). Neither ./setup.sh nor CI runs this: FFCV pulls numba, llvmlite and
# opencv-python and builds its C extension against Debian's libturbojpeg and OpenCV (about
# 2 minutes and 1.5 GB with torch). Its own venv, because those pins are not the project's.
#   tools/bench/setup_ffcv.sh              # creates/updates .venv-ffcv
#   tools/bench/setup_ffcv.sh /path/venv   # elsewhere (then: bench_ffcv.py --ffcv-python /path/venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${1:-.venv-ffcv}
TORCH_SPEC="torch==2.11.0 torchvision==0.26.0"   # the project's (setup.sh), so both venvs load the same kernels
FFCV_SPEC="ffcv==1.0.2"

# FFCV's setup.py finds libturbojpeg and OpenCV through pkg-config and compiles against Python's headers.
tools/apt_install.sh build-essential pkg-config python3-venv python3-dev libturbojpeg0-dev libopencv-dev

PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  echo "setup_ffcv: creating $VENV"
  "$PY" -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c "import importlib.metadata as m, ffcv; assert m.version('ffcv') == '1.0.2'" 2>/dev/null; then
  "$VENV/bin/pip" install -q --upgrade pip
  echo "setup_ffcv: installing $TORCH_SPEC into $VENV"
  "$VENV/bin/pip" install -q $TORCH_SPEC
  echo "setup_ffcv: installing $FFCV_SPEC into $VENV"
  "$VENV/bin/pip" install -q "$FFCV_SPEC"
fi
"$VENV/bin/python" -c "import importlib.metadata as m, ffcv.loader, ffcv.writer; print('setup_ffcv: ffcv', m.version('ffcv'), 'in', '$VENV')"
