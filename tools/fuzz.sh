#!/usr/bin/env bash
# Fuzzes the decoder: a libFuzzer target (tests/fuzz) over probe + decode + the loader's train
# transform on arbitrary bytes, built with clang, ASan and UBSan in its own build folder, seeded
# with every generated bug-case variant (and ../shared/bugcases when present), for a bounded time.
# Fails when libFuzzer finds a crash, a leak, an escaped exception, a timeout, or any output from
# the library; the input is kept under $BUILD/artifacts/ (turn it into a test in
# tests/bugkinds.cpp or tests/test_decode.cpp, fix, and run again).
#
#   tools/fuzz.sh [SECONDS]       # default 60; GPUFEED_FUZZ_JOBS=N runs N processes in parallel
#
# Installs clang and libclang-rt-14-dev (libFuzzer, sanitizers) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN=${1:-60}
BUILD=${GPUFEED_FUZZ_BUILD_DIR:-build/fuzz}
JOBS=${GPUFEED_FUZZ_JOBS:-1}

tools/apt_install.sh clang libclang-rt-14-dev

if [ ! -f "$BUILD/build.ninja" ]; then
  cmake -S tests/fuzz -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
fi
cmake --build "$BUILD" -j "$(nproc)" --target fuzz_decode fuzz_seeds fuzz_tar

SEEDS="$BUILD/seeds"
CORPUS="$BUILD/corpus"  # grows across runs on the same machine
rm -rf "$SEEDS"
"$BUILD/fuzz_seeds" "$SEEDS"
mkdir -p "$CORPUS" "$BUILD/artifacts"
DIRS=("$CORPUS" "$SEEDS")
[ -d ../shared/bugcases/files ] && DIRS+=(../shared/bugcases/files)

# detect_leaks: every error path must free what it allocated (libjpeg's longjmp included).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
PARALLEL=()
# -jobs makes libFuzzer fork workers that log to fuzz-N.log in the current folder.
((JOBS > 1)) && PARALLEL=(-jobs="$JOBS" -workers="$JOBS")

# The tar shard indexer (loader/shards.h), seeded with a small WebDataset-style shard (ustar, a
# pax long name, a label) written by GNU tar.
TAR_SEEDS="$BUILD/seeds_tar"
TAR_CORPUS="$BUILD/corpus_tar"
rm -rf "$TAR_SEEDS"
mkdir -p "$TAR_SEEDS/files/sub" "$TAR_CORPUS"
printf 'JPEG' > "$TAR_SEEDS/files/sub/a.jpg"
printf '3\n' > "$TAR_SEEDS/files/sub/a.cls"
printf 'x' > "$TAR_SEEDS/files/$(printf 'n%.0s' $(seq 120)).png"
printf '1' > "$TAR_SEEDS/files/$(printf 'n%.0s' $(seq 120)).cls"
tar --format=pax -cf "$TAR_SEEDS/seed.tar" -C "$TAR_SEEDS/files" .
tar --format=gnu -cf "$TAR_SEEDS/seed_gnu.tar" -C "$TAR_SEEDS/files" .
rm -rf "$TAR_SEEDS/files"
# Both targets run at the same time (each is one process unless GPUFEED_FUZZ_JOBS says more), so
# the gate takes SECONDS once, not twice; each one's output is printed when both have ended.
echo "fuzz: running fuzz_decode and fuzz_tar for ${SECONDS_TO_RUN} s each, at once (${JOBS} job(s) each)"
"$BUILD/fuzz_decode" -max_total_time="$SECONDS_TO_RUN" -max_len=65536 -timeout=10 \
  -rss_limit_mb=3072 -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/" \
  "${PARALLEL[@]}" "${DIRS[@]}" > "$BUILD/fuzz_decode.log" 2>&1 &
DECODE_PID=$!
"$BUILD/fuzz_tar" -max_total_time="$SECONDS_TO_RUN" -max_len=16384 -timeout=10 \
  -rss_limit_mb=3072 -print_final_stats=1 -artifact_prefix="$BUILD/artifacts/" \
  "${PARALLEL[@]}" "$TAR_CORPUS" "$TAR_SEEDS" > "$BUILD/fuzz_tar.log" 2>&1 && TAR_STATUS=0 || TAR_STATUS=$?
wait "$DECODE_PID" && DECODE_STATUS=0 || DECODE_STATUS=$?
for t in decode tar; do
  echo "fuzz: fuzz_$t's output ($BUILD/fuzz_$t.log):"
  cat "$BUILD/fuzz_$t.log"
done
echo "fuzz: fuzz_decode exit status $DECODE_STATUS, fuzz_tar exit status $TAR_STATUS"
[ "$DECODE_STATUS" -eq 0 ] && [ "$TAR_STATUS" -eq 0 ]
