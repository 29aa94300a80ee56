#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz) with clang in build-fuzz, builds seed corpora from the
# shared test data, and runs every target (or the ones named) for a bounded time.
#
#   scripts/fuzz.sh [TARGET...]        e.g. scripts/fuzz.sh safetensors recipe_toml
#
# Environment:
#   FUZZ_SECONDS    seconds per target (default 60)
#   FUZZ_JOBS       targets fuzzed at the same time (default: number of CPUs)
#   FUZZ_BUILD_DIR  build directory (default build-fuzz at the repository root)
#   SYMPRUNE_DATA   shared test data (default ../shared/data beside the repository)
#   SYMPRUNE_BIN    symprune binary that converts stories260K for the seeds (default: the normal build's
#                   ${SYMPRUNE_BUILD_DIR:-build}/apps/symprune if present, else built in FUZZ_BUILD_DIR)
#   FUZZ_TMPDIR     where the harnesses write their input files (default /dev/shm when writable)
#
# Exit status: 0 when every target ran clean; 1 when any target found a crash, leak, timeout (>10 s)
# or out-of-memory (>2 GB): the artifact path and the command that reproduces it are printed. Keep
# such an input as a regression test: copy it to tests/fuzz/regressions/<target>/ (ctest replays it).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
data=${SYMPRUNE_DATA:-$root/../shared/data}
seconds=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-$(nproc)}
python=${SYMPRUNE_PYTHON:-$root/.venv/bin/python}
[[ -x $python ]] || python=python3

# Longest input each target mutates to: a little above its largest seed (bigger inputs only slow it).
declare -A max_len=(
  [safetensors]=32768 [safetensors_index]=32768 [hf_config]=4096 [sentencepiece]=16384
  [tokenizer_json]=32768 [gpt2_bpe]=16384 [llama2c_tokenizer]=8192 [llama2c_checkpoint]=8192
  [calib_jsonl]=8192 [calib_text]=4096 [calib_tokens]=4096 [recipe_toml]=2048 [recipe_yaml]=2048
  [torch_checkpoint]=8192 [unicode_nfc]=1024
)

all_targets=()
for src in "$root"/tests/fuzz/fuzz_*.cc; do
  name=$(basename "$src" .cc)
  all_targets+=("${name#fuzz_}")
done
targets=("$@")
[[ ${#targets[@]} -gt 0 ]] || targets=("${all_targets[@]}")
for t in "${targets[@]}"; do
  if [[ ! -f $root/tests/fuzz/fuzz_$t.cc ]]; then
    echo "fuzz.sh: unknown target '$t' (targets: ${all_targets[*]})" >&2
    exit 2
  fi
done
[[ -d $data ]] || { echo "fuzz.sh: test data not found at $data (set SYMPRUNE_DATA)" >&2; exit 2; }

start=$(date +%s)
echo "== configure + build $build (clang, libFuzzer + ASan + UBSan)"
CC=${FUZZ_CC:-clang} CXX=${FUZZ_CXX:-clang++} cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSYMPRUNE_FUZZ=ON -DSYMPRUNE_BUILD_BENCH=OFF >/dev/null
build_targets=()
for t in "${targets[@]}"; do build_targets+=("fuzz_$t"); done
# stories260K converted once by symprune itself (its config.json and safetensors header become seeds), with
# the normal build's binary when there is one; otherwise the instrumented one is built for it (minutes).
converted=$build/stories260K_hf
symprune_bin=${SYMPRUNE_BIN:-}
normal_bin=${SYMPRUNE_BUILD_DIR:-$root/build}/apps/symprune
[[ -z $symprune_bin && -x $normal_bin ]] && symprune_bin=$normal_bin
if [[ ! -f $converted/model.safetensors && -z $symprune_bin ]]; then
  build_targets+=(symprune)
  symprune_bin=$build/apps/symprune
fi
cmake --build "$build" --target "${build_targets[@]}" -j "$(nproc)"
echo "   built in $(( $(date +%s) - start )) s"

echo "== seed corpora from $data"
if [[ ! -f $converted/model.safetensors ]]; then
  "$symprune_bin" convert-llama2c --checkpoint "$data/stories260K/stories260K.bin" \
    --tokenizer "$data/stories260K/tok512.bin" --out "$converted" --force >/dev/null
fi
seeds=$build/seeds
rm -rf "$seeds"
"$python" "$root/scripts/fuzz_seeds.py" "$data" "$seeds" --converted "$converted" >/dev/null

# Every input is written to a scratch file: on tmpfs that is ~10x faster than on this machine's disk.
if [[ -z ${FUZZ_TMPDIR:-} && -d /dev/shm && -w /dev/shm ]]; then FUZZ_TMPDIR=/dev/shm; fi
[[ -n ${FUZZ_TMPDIR:-} ]] && export TMPDIR=$FUZZ_TMPDIR
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
logs=$build/fuzz-logs
mkdir -p "$logs"

run_target() {
  local t=$1
  local corpus=$build/corpus/$t artifacts=$build/artifacts/$t status
  mkdir -p "$corpus"
  rm -rf "$artifacts"
  mkdir -p "$artifacts"
  [[ -d $seeds/$t ]] && cp -f "$seeds/$t"/* "$corpus"/
  # New inputs go to the first directory (build-fuzz/corpus); the committed regressions are read only.
  "$build/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -max_len="${max_len[$t]:-8192}" -artifact_prefix="$artifacts/" -print_final_stats=1 \
    "$corpus" "$root/tests/fuzz/regressions/$t" >"$logs/$t.log" 2>&1 && status=0 || status=$?
  echo "$status" >"$logs/$t.status"
}

echo "== fuzzing ${#targets[@]} targets, ${seconds} s each, $jobs at a time (logs: $logs)"
for t in "${targets[@]}"; do
  rm -f "$logs/$t.status"
  while [[ $(jobs -rp | wc -l) -ge $jobs ]]; do wait -n || true; done
  run_target "$t" &
done
wait

failed=()
printf '%-20s %-8s %10s %8s %8s %s\n' target result execs exec/s cov corpus
for t in "${targets[@]}"; do
  status=$(cat "$logs/$t.status" 2>/dev/null || echo missing)
  log=$logs/$t.log
  artifacts=(); while IFS= read -r -d '' f; do artifacts+=("$f"); done \
    < <(find "$build/artifacts/$t" -type f -print0)
  done_line=$(grep -aE '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$done_line")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p' <<<"$done_line")
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/.* exec\/s: \([0-9]*\).*/\1/p' <<<"$done_line")
  if [[ $status != 0 || ${#artifacts[@]} -gt 0 ]]; then
    printf '%-20s %-8s %10s %8s %8s %s\n' "$t" FAILED "${execs:--}" "${rate:--}" "${cov:--}" "${corp:--}"
    failed+=("$t")
  else
    printf '%-20s %-8s %10s %8s %8s %s\n' "$t" ok "${execs:--}" "${rate:--}" "${cov:--}" "${corp:--}"
  fi
done

for t in "${failed[@]}"; do
  echo
  echo "== $t: finding (log: $logs/$t.log)"
  grep -aE 'ERROR: |SUMMARY: |runtime error|terminate called|what\(\)|property violated' "$logs/$t.log" | head -5 || true
  while IFS= read -r -d '' f; do
    echo "   artifact:  $f"
    echo "   reproduce: $build/tests/fuzz/fuzz_$t $f"
    echo "   keep it:   cp $f $root/tests/fuzz/regressions/$t/  (replayed by ctest -R fuzz_regression.$t)"
  done < <(find "$build/artifacts/$t" -type f -print0)
done
echo
echo "fuzz.sh: ${#targets[@]} targets, $(( $(date +%s) - start )) s in all"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
