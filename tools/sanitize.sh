#!/usr/bin/env bash
# Sanitizer runs of the torch-free rooms (common, decode, sampler, loader), through the CMake presets:
#   asan  ASan + UBSan (LSan at exit): every unit test of the torch-free build (test_decode,
#         test_sampler, test_loader, test_robustness, ...: bad files looped 1000 times, every error
#         path, every bug case);
#   tsan  ThreadSanitizer: the loader's concurrency tests (start/stop, destroy mid-epoch,
#         exception mid-batch, slow consumer, prefetch_depth 1, error policies, files changing
#         under a run, the bug-case folder, the worker-count and prefetch-depth autotuners), with
#         tools/tsan.supp for oneTBB's internals.
#
#   tools/sanitize.sh [asan|tsan|all]     # default all
#
# Build folders: build/asan and build/tsan (the presets'), or $GPUFEED_SANITIZE_BUILD_ROOT/{asan,tsan}.
set -euo pipefail
cd "$(dirname "$0")/.."
WHICH=${1:-all}
ROOT=${GPUFEED_SANITIZE_BUILD_ROOT:-build}
JOBS=${GPUFEED_SANITIZE_JOBS:-$(nproc)}
./setup.sh --no-build  # system packages and the venv the golden-value fixture needs

configure_and_build() {  # preset, build dir, [targets...]
  local preset=$1 dir=$2
  shift 2
  cmake --preset "$preset" -B "$dir" >/dev/null
  cmake --build "$dir" -j "$JOBS" ${1:+--target "$@"}
}

if [ "$WHICH" = asan ] || [ "$WHICH" = all ]; then
  configure_and_build asan "$ROOT/asan"  # everything the torch-free build has
  echo "sanitize: ASan+UBSan, all torch-free unit tests"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$ROOT/asan" --output-on-failure --timeout 900 -j "$JOBS"
fi

if [ "$WHICH" = tsan ] || [ "$WHICH" = all ]; then
  configure_and_build tsan "$ROOT/tsan" test_loader test_robustness
  echo "sanitize: TSan, the loader's concurrency tests"
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tools/tsan.supp" \
    ctest --test-dir "$ROOT/tsan" --output-on-failure --timeout 900 -j "$JOBS" \
      -R '^(make_goldens|Loader\.|ErrorPolicy\.|Shutdown\.|ChangingFiles\.|Acceptance\.|AutoNumWorkers\.|AutoPrefetchDepth\.)'
fi
