#!/usr/bin/env bash
# The host pipeline's own threads under ThreadSanitizer, in one process and across MPI ranks: builds
# symprune and symprune_dist with -DSYMPRUNE_TSAN=ON and no CUDA (build-tsan-host) and runs, on stories260K
# stored as three shards (ria + R²-DSnoT, --eval, a checkpoint after every block):
#   1. one `symprune prune` process, uninterrupted;
#   2. `mpirun -n 3 symprune_dist`, stopped by SIGUSR1 (forwarded by mpirun to every rank) once block 2 is
#      done, which must exit 75 with its checkpoint saved;
#   3. `mpirun -n 2 symprune_dist --resume auto` of that checkpoint;
# then checks that 3's model is byte for byte 1's and that no process wrote a TSan report. What runs
# concurrently there: each rank's checkpoint writer thread (its segment of the masks, the rows it owns)
# beside the next block, the next block's reader thread, the signal watcher, and the MPI calls of the main
# thread. Open MPI is not instrumented, so races inside it are not seen; its TCP transport's own lock order
# at MPI_Init is suppressed (tests/sanitizers/tsan.supp), nothing of symprune's.
# About 10 minutes to build from scratch on 2 cores, then 5 to 9 minutes. Not in .ci/run (its time); run it by
# hand when threads or the checkpoint writer change. Environment: SYMPRUNE_TSAN_HOST_BUILD_DIR (default
# <repo>/build-tsan-host), SYMPRUNE_DATA, SYMPRUNE_PYTHON (default <repo>/.venv/bin/python).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SYMPRUNE_TSAN_HOST_BUILD_DIR:-$root/build-tsan-host}"
python="${SYMPRUNE_PYTHON:-$root/.venv/bin/python}"
export SYMPRUNE_DATA="${SYMPRUNE_DATA:-$(cd "$root/../shared/data" && pwd)}"
start=$(date +%s)

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSYMPRUNE_TSAN=ON \
  -DSYMPRUNE_WITH_CUDA=OFF -DSYMPRUNE_WITH_NCCL=OFF -DSYMPRUNE_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" --target symprune symprune_dist
built=$(date +%s)

work="$(mktemp -d)"
reports="$work/tsan"
mkdir -p "$reports" "$work/stories" "$work/sharded"
# OpenMP and OpenBLAS are not instrumented: one thread each, so their workers make no reports of theirs.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# exitcode=0: a report must not end a run early (set -e, or a stopped run's 75): they are looked for at the end.
export TSAN_OPTIONS="exitcode=0 log_path=$reports/report second_deadlock_stack=1 suppressions=$root/tests/sanitizers/tsan.supp"
export SYMPRUNE_BIN="$build/apps/symprune" SYMPRUNE_SOURCE_DIR="$root"

model=$("$python" - "$root/tests/e2e" "$work" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from prune_support import Stories, sharded_stories
work = Path(sys.argv[2])
stories = Stories(work / "stories")
model, _ = sharded_stories(stories, work / "sharded", 3)
print(model)
EOF
)
job=(--model "$model" --calib "$work/stories/first_half.txt" --eval "$work/stories/second_half.txt"
  --method ria --refine r2dsnot --sparsity 0.5 --nsamples 8 --seqlen 256 --checkpoint-every 1)
mpi=(mpirun --oversubscribe --allow-run-as-root -x TSAN_OPTIONS -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS)

echo "tsan_host.sh: 1. one process"
"$build/apps/symprune" prune "${job[@]}" --out "$work/one" --checkpoint "$work/one.h5" >"$work/one.log" 2>&1

echo "tsan_host.sh: 2. three ranks, stopped by SIGUSR1 after block 2"
"${mpi[@]}" -n 3 "$build/apps/symprune_dist" "${job[@]}" --out "$work/ranks" --checkpoint "$work/ranks.h5" \
  >"$work/three.log" 2>&1 &
pid=$!
until grep -q "block 2/5 done" "$work/three.log" 2>/dev/null; do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.2
done
kill -USR1 "$pid" 2>/dev/null || true
status=0
wait "$pid" || status=$?
if ((status != 75)); then
  tail -20 "$work/three.log"
  echo "tsan_host.sh: the stopped run exited $status, not 75 (log: $work/three.log)" >&2
  exit 1
fi

echo "tsan_host.sh: 3. two ranks, resumed"
"${mpi[@]}" -n 2 "$build/apps/symprune_dist" "${job[@]}" --out "$work/ranks" --checkpoint "$work/ranks.h5" \
  --resume auto >"$work/two.log" 2>&1
grep -q "resuming from checkpoint" "$work/two.log" || { echo "tsan_host.sh: the resumed run did not resume" >&2; exit 1; }

digest() { (cd "$1" && cat ./*.safetensors | sha256sum); }
failed=0
if [[ "$(digest "$work/one")" != "$(digest "$work/ranks")" ]]; then
  echo "tsan_host.sh: the resumed ranks' model differs from the one process's" >&2
  failed=1
fi
if compgen -G "$reports/report*" >/dev/null; then
  grep -h "^WARNING\|^SUMMARY" "$reports"/report* | sort | uniq -c >&2
  echo "tsan_host.sh: ThreadSanitizer reports in $reports" >&2
  failed=1
fi
end=$(date +%s)
echo "tsan_host.sh: build $((built - start)) s, runs $((end - built)) s; $([[ $failed == 0 ]] && echo \
  "no report, the same bytes from 1 process and from 3 ranks stopped and resumed on 2" || echo FAILED)"
((failed == 0)) && rm -rf "$work"
exit $failed
