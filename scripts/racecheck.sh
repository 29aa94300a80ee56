#!/usr/bin/env bash
# The races of the CUDA kernels, looked for without a GPU: builds the kernels' CPU emulation and their
# parity tests with ThreadSanitizer (build-tsan, -DSYMPRUNE_TSAN=ON) and runs them (ctest label
# racecheck). Under TSan the emulation runs every CUDA thread of a block as an OS thread (not a fiber)
# between real barriers, so two CUDA threads touching the same shared or global memory without a
# __syncthreads/__syncwarp between them is a data race TSan reports, as compute-sanitizer's racecheck would
# on a GPU (which stays the judge of what the emulation cannot show: memory ordering without barriers,
# warp-synchronous timing).
# First a probe shows that TSan does report a missing barrier in the emulation and stays silent with it.
# Any report fails its test. Extra arguments go to ctest (e.g. -R Dsnot). Environment:
# SYMPRUNE_TSAN_BUILD_DIR (default <repo>/build-tsan), SYMPRUNE_RACECHECK_JOBS (default nproc).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SYMPRUNE_TSAN_BUILD_DIR:-$root/build-tsan}"
jobs="${SYMPRUNE_RACECHECK_JOBS:-$(nproc)}"
start=$(date +%s)

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSYMPRUNE_TSAN=ON \
  -DSYMPRUNE_BUILD_BENCH=OFF >/dev/null
# halt_on_error: the first report ends the test that made it (exit 66), with both stacks.
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}"
# The CPU references call OpenMP and OpenBLAS, which are not instrumented: one thread each.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
cmake --build "$build" -j "$jobs" --target emulated_race_probe symprune_kernel_race_tests
built=$(date +%s)

cd "$build"
status=0
ctest --output-on-failure --timeout 900 -j "$jobs" -L racecheck "$@" || status=$?
end=$(date +%s)
echo "racecheck.sh: build $((built - start)) s, tests $((end - built)) s, total $((end - start)) s (exit $status)"
exit $status
