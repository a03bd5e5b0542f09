#!/usr/bin/env bash
# The test command: set up, build, run every test (GoogleTest suites through ctest; golden values
# are computed by the venv's PyTorch/torchvision first, as the make_goldens fixture).
set -euo pipefail
cd "$(dirname "$0")/.."
./setup.sh
cd build/release
ctest --output-on-failure --timeout 900 -j 2 "$@"
