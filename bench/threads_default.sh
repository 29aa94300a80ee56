#!/usr/bin/env bash
# The default thread count must never be slower than --threads 1 (issue 13). Times the quickstart's prune
# (stories260K, wanda 50 %, 128 x 256 calibration, 200 evaluation chunks) with the default threads, with
# --threads 1, and with the default threads under OpenMP's active wait policy (what the binary ran with
# before it re-executed itself with OMP_WAIT_POLICY=PASSIVE). Runs are interleaved, REPS rounds, and the
# median of each is reported, with the load average, in bench/results/threads_default.md.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${SYMPRUNE_BUILD_DIR:-$root/build}/apps/symprune"
data="${SYMPRUNE_DATA:-$root/../shared/data}"
reps="${REPS:-3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 "$root/scripts/split_text.py" "$data/tinystories/tinystories_val.txt" "$work/first.txt" "$work/second.txt" >/dev/null
"$bin" convert-llama2c --checkpoint "$data/stories260K/stories260K.bin" --tokenizer "$data/stories260K/tok512.bin" \
  --out "$work/model" >/dev/null
run() {  # name, env assignment or "", extra args
  local start end
  start=$(date +%s.%N)
  env $2 "$bin" prune --model "$work/model" --method wanda --sparsity 0.5 --calib "$work/first.txt" --nsamples 128 \
    --seqlen 256 --eval "$work/second.txt" --eval-max-chunks 200 --out "$work/out" --force --log-level warn $3 >/dev/null
  end=$(date +%s.%N)
  echo "$1 $(echo "$end - $start" | bc)" >>"$work/times"
}
for _ in $(seq "$reps"); do
  run default "" ""
  run threads1 "" "--threads 1"
  run active "OMP_WAIT_POLICY=ACTIVE" ""
done
load=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$work/times" "$load" "$(nproc)" "$reps" >"$root/bench/results/threads_default.md" <<'PY'
import statistics, sys
times = {}
for line in open(sys.argv[1]):
    name, t = line.split()
    times.setdefault(name, []).append(float(t))
med = {k: statistics.median(v) for k, v in times.items()}
print("# Default thread count vs --threads 1 (bench/threads_default.sh)\n")
print(f"stories260K prune, wanda 50 %, 128 x 256 calibration, 200 evaluation chunks; {sys.argv[3]} CPUs, "
      f"{sys.argv[4]} interleaved rounds, median wall seconds; load average at the end: {sys.argv[2]}.\n")
print("| run | median s | all runs | vs --threads 1 |")
print("|---|---:|---|---:|")
labels = {"default": "default threads (passive waits, as shipped)", "threads1": "--threads 1",
          "active": "default threads, OMP_WAIT_POLICY=ACTIVE (before the fix)"}
for k in ("default", "threads1", "active"):
    print(f"| {labels[k]} | {med[k]:.2f} | {', '.join(f'{t:.2f}' for t in times[k])} | {med[k] / med['threads1']:.2f}x |")
PY
cat "$root/bench/results/threads_default.md"
