#!/usr/bin/env bash
# Cross-builds gpufeed's torch-free rooms and their GoogleTest suites for aarch64 with zig
# (cmake/toolchains/zig.cmake, glibc floor 2.28) and runs every suite under qemu-user, on this
# x86_64 machine, without containers:
#   tools/qemu_tests.sh [--target aarch64-linux-gnu.2.28] [--build DIR] [--timeout SECONDS] [--no-build] [--emulate]
# Steps: the static dependencies (tools/wheel/build_deps.sh, skipped when built), Debian's
# libc6 of the target's architecture unpacked as qemu's -L sysroot (build/sysroot/ARCH; the test
# programs link zig's glibc 2.28 stubs, and run on that newer glibc), the configure and build in
# build/zig-ARCH, then each tests/test_* program under qemu-ARCH-static with a per-suite limit.
# A target of this machine's own architecture (x86_64-linux-gnu.2.28) runs natively on its glibc;
# --emulate runs it under qemu-x86_64 too, whose default CPU has no AVX2 or FMA: the scalar kernels.
# Ends with one line "qemu_tests: N passed, N failed, N skipped, N left out" (GoogleTest's test
# counts over all suites; two tests are left out under qemu, for reasons the script gives), the
# failed tests' names above it. Exit status 0 when none failed and every suite ran.
# Needs: qemu-user-static, nasm, dpkg-dev, a deb-src line for bookworm, dpkg's arm64 architecture
# (dpkg --add-architecture arm64, for `apt-get download libc6:arm64`), all installed when missing
# by tools/wheel/setup_cross.sh (run first), and network for the first run.
# CI runs only the Highway kernels' NEON build under qemu (tools/qemu_kernels.sh, ctest
# qemu_aarch64_kernels: no dependency builds); this script is the full check.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=aarch64-linux-gnu.2.28 build="" limit=5400 do_build=1 emulate=0
while (($#)); do
  case $1 in
    --target) target=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --emulate) emulate=1; shift ;;
    *) sed -n '2,13p' "$0"; exit 2 ;;
  esac
done
# Everything under one time limit: a hung suite or build cannot hold the machine.
if [ -z "${GPUFEED_QEMU_TESTS_INNER:-}" ]; then
  args=(--target "$target" --timeout "$limit")
  [ -n "$build" ] && args+=(--build "$build")
  ((do_build)) || args+=(--no-build)
  ((emulate)) && args+=(--emulate)
  GPUFEED_QEMU_TESTS_INNER=1 exec timeout --kill-after=30 "$limit" "$0" "${args[@]}" 2>&1
fi
"$root/tools/wheel/setup_cross.sh" || { echo "qemu_tests: tools/wheel/setup_cross.sh failed"; exit 2; }
arch=${target%%-*}
debarch=$arch; [ "$arch" = aarch64 ] && debarch=arm64; [ "$arch" = x86_64 ] && debarch=amd64
build=${build:-$root/build/zig-$arch}
prefix=$root/build/deps/$target
sysroot=$root/build/sysroot/$arch
runner=() sysroot_arg=()
if [ "$arch" != "$(uname -m)" ] || ((emulate)); then
  qemu=$(command -v "qemu-$arch-static") || { echo "qemu_tests: no qemu-$arch-static (apt-get install qemu-user-static)"; exit 2; }
  [ "$arch" = "$(uname -m)" ] && sysroot=/
  if [ ! -e "$sysroot/lib/ld-linux-aarch64.so.1" ] && [ ! -e "$sysroot/lib64/ld-linux-x86-64.so.2" ]; then
    dl=$root/build/sysroot/dl-$arch
    mkdir -p "$dl" && (cd "$dl" && apt-get download -qq "libc6:$debarch") || {
      echo "qemu_tests: apt-get download libc6:$debarch failed (dpkg --add-architecture $debarch; apt-get update)"; exit 2; }
    dpkg -x "$(ls "$dl"/libc6_*_"$debarch".deb | head -n1)" "$sysroot"
  fi
  runner=("$qemu" -L "$sysroot")
  [ "$sysroot" = / ] || sysroot_arg=(-DGPUFEED_ZIG_SYSROOT="$sysroot")
fi

if ((do_build)); then
  t0=$SECONDS
  nice -n 19 "$root/tools/wheel/build_deps.sh" "$target" "$prefix" || exit 2
  echo "qemu_tests: dependencies ready ($((SECONDS - t0)) s)"
  t0=$SECONDS
  nice -n 19 cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_TOOLCHAIN_FILE="$root/cmake/toolchains/zig.cmake" -DGPUFEED_ZIG_TARGET="$target" \
    -DGPUFEED_ZIG_PREFIX="$prefix" "${sysroot_arg[@]}" \
    -DGPUFEED_WITH_TORCH=OFF -DGPUFEED_BUILD_PYTHON=OFF -DGPUFEED_WITH_CUDA=OFF \
    -DGPUFEED_TESTS_WITH_OPENCV=OFF -DBUILD_SHARED_LIBS=OFF >"$build.configure.log" 2>&1 ||
    { tail -30 "$build.configure.log"; exit 2; }
  nice -n 19 cmake --build "$build" -j 2 >"$build.build.log" 2>&1 || { grep -A12 FAILED "$build.build.log" | head -60; exit 2; }
  echo "qemu_tests: built in $((SECONDS - t0)) s ($build)"
fi

# The goldens the suites compare with come from the host's venv (tests/goldens/make_goldens.py).
if [ -x "$root/.venv/bin/python" ]; then
  GPUFEED_SHARED_DIR=${GPUFEED_SHARED_DIR:-$root/../shared} "$root/.venv/bin/python" \
    "$root/tests/goldens/make_goldens.py" --out "$build/tests/goldens" >/dev/null 2>&1 ||
    echo "qemu_tests: make_goldens failed: the suites that need goldens fail or skip"
fi

# Left out under qemu-user, for what qemu does, not what gpufeed does on aarch64 (run natively on
# an aarch64 machine, or for x86_64 without --emulate, every test runs):
#  - CpuBudget.UnderTasksetTheLoadersDefaultIsOneThread: the host's taskset cannot start the aarch64
#    probe it pins (this machine has no binfmt_misc entry for qemu: the kernel refuses the ELF and
#    the shell then reads it as a script);
#  - S3Config.AFailingCredentialProcessNamesTheProfileAndWhy: qemu-user runs posix_spawn's
#    CLONE_VFORK child as a plain fork, so an exec that fails (a missing credential_process) reaches
#    the parent as the child's exit status 127, not as posix_spawnp's ENOENT.
excluded=()
((${#runner[@]})) && excluded=(CpuBudget.UnderTasksetTheLoadersDefaultIsOneThread
                               S3Config.AFailingCredentialProcessNamesTheProfileAndWhy)
filter=()
((${#excluded[@]})) && filter=("--gtest_filter=-$(IFS=:; echo "${excluded[*]}")")

export XDG_CACHE_HOME=$build/test-cache-home
passed=0 failed=0 skipped=0 broken=()
failures=()
t0=$SECONDS
for exe in "$build"/tests/test_*; do
  [ -f "$exe" ] && [ -x "$exe" ] || continue
  name=$(basename "$exe") out=$build/qemu-$name.log
  (cd "$build/tests" && timeout --kill-after=10 900 "${runner[@]}" "$exe" "${filter[@]}" >"$out" 2>&1)
  rc=$?
  p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$out" | tail -n1)
  f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$out" | tail -n1)
  s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$out" | tail -n1)
  passed=$((passed + ${p:-0})) failed=$((failed + ${f:-0})) skipped=$((skipped + ${s:-0}))
  while read -r t; do failures+=("$name: $t"); done < <(sed -n 's/^\[  FAILED  \] \([^ ,]*\)[ ,].*/\1/p' "$out" | grep -v '^[0-9]*$' | sort -u)
  # crashed, hung, or failed without GoogleTest's summary
  if [ -z "$p$f" ] || { [ "$rc" -ne 0 ] && [ -z "$f" ]; }; then broken+=("$name (exit $rc, log $out)"); fi
  printf 'qemu_tests: %-26s passed %3s failed %3s skipped %3s exit %s\n' "$name" "${p:-0}" "${f:-0}" "${s:-0}" "$rc"
done
echo "qemu_tests: suites ran in $((SECONDS - t0)) s under ${runner[*]:-this machine}"
for t in "${failures[@]}"; do echo "qemu_tests: FAILED $t"; done
for b in "${broken[@]}"; do echo "qemu_tests: suite did not finish: $b"; done
((${#excluded[@]})) && echo "qemu_tests: left out under qemu (see the script): ${excluded[*]}"
echo "qemu_tests: $passed passed, $failed failed, $skipped skipped, ${#excluded[@]} left out"
[ "$failed" -eq 0 ] && [ ${#broken[@]} -eq 0 ]
