#!/usr/bin/env bash
# Builds symprune with AddressSanitizer + UndefinedBehaviorSanitizer (clang) in its own build directory
# (build-asan; the normal build stays unsanitized) and runs the unit and e2e tests there (not `slow`).
# Any ASan/UBSan/LSan report aborts the process, so the test that ran it fails. Extra arguments go to
# ctest (e.g. -R safetensors). Environment: SYMPRUNE_ASAN_BUILD_DIR (default <repo>/build-asan),
# SYMPRUNE_SANITIZE_JOBS (ctest and build parallelism, default nproc), SYMPRUNE_SANITIZE_CC and
# SYMPRUNE_SANITIZE_CXX (default clang, clang++; gcc, g++ work too). Clang, not GCC: GCC compiles this
# code base under ASan + UBSan about 1.6 times slower (nlohmann::json and CLI11 heavy files most), and
# this build is the longest stage of CI. The compiler is fixed when build-asan is first configured.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SYMPRUNE_ASAN_BUILD_DIR:-$root/build-asan}"
jobs="${SYMPRUNE_SANITIZE_JOBS:-$(nproc)}"
start=$(date +%s)

# -O2 -g: fast enough for the e2e runs of stories260K, still exact stacks (frame pointers kept).
CC="${SYMPRUNE_SANITIZE_CC:-clang}" CXX="${SYMPRUNE_SANITIZE_CXX:-clang++}" cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSYMPRUNE_SANITIZE=ON -DSYMPRUNE_BUILD_BENCH=OFF >/dev/null
# Test discovery runs the gtest binaries at build time: give them the same options as the test run.
supp="$root/tests/sanitizers/lsan.supp"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:detect_invalid_pointer_pairs=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:abort_on_error=1"
export LSAN_OPTIONS="suppressions=$supp:print_suppressions=0"
# Only the symprune binaries are instrumented (they link libasan themselves); Python, which the e2e
# tests run, must not get the runtime injected.
unset LD_PRELOAD
cmake --build "$build" -j "$jobs"
built=$(date +%s)

# One OpenMP/BLAS thread per test process: ctest already runs `jobs` tests at once, and oversubscribed
# spinning OpenMP threads under ASan make the e2e runs many times slower.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}"
cd "$build"
status=0
ctest --output-on-failure --timeout 1800 -j "$jobs" -L 'unit|e2e' -LE slow "$@" || status=$?
end=$(date +%s)
echo "sanitize.sh: build $((built - start)) s, tests $((end - built)) s, total $((end - start)) s (exit $status)"
exit $status
