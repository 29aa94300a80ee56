#!/usr/bin/env bash
# Runs on a lent GPU machine (through the device tool) from a bundle made by scripts/gpu_bundle.sh:
#  1. the gpu tests (kernel parity with the CPU, accelerator probe, NCCL), as gtest runs;
#  2. compute-sanitizer memcheck and racecheck of the kernel parity tests;
#  3. the kernel benchmark (bench/cuda/cuda_kernels_bench.cc);
#  4. the end-to-end prune benchmark (bench/cuda_prune_bench.py: symprune --device cuda and the PyTorch
#     loop on the first PRUNE_BENCH_BLOCKS blocks of synthetic:llama2-7b at 128 x 2048, default 3,
#     extrapolated from a middle one);
#  5. the issue's 70B target: wanda 50 % of synthetic:llama2-70b at 128 x 2048 in bf16 on this one GPU
#     (its first PRUNE_70B_BLOCKS blocks, default 4, extrapolated; memory peaks per block, so the plan and the
#     peak are those of the whole model);
#  6. on request only (not in the default plan), prune_profile: the cases PRUNE_PROFILE_CASES (default
#     wanda-50) of the prune benchmark on 3 blocks with the CUDA backend's time per op
#     (SYMPRUNE_CUDA_PROFILE=1, cuda_prune_profile.json).
# Logs and results are written to a work directory; after every group of steps the whole of it is packed
# into $OUT/gpu-results.tar.gz and the table of outcomes so far into $OUT/summary.txt (the device tool brings
# back at most 8 files, and what is under $OUT when a call is stopped). The table is printed last.
#
#   bash scripts/gpu_checks.sh BUNDLE (a directory or its .tar.xz) [--skip-sanitizer] [--skip-bench]
#                                     [--steps PLAN]
#
# A session has 15 minutes of device time in all, the machine's start (a minute or two) included, and one
# call runs 10 minutes at most: the whole check is planned as ONE call. PLAN lists groups of steps separated
# by ',', run one after another; the steps of a group, joined by '+', run at the same time (the tests and the
# sanitizers: their times do not matter, and each mostly waits on its own process); a step may carry its own
# limit in seconds, NAME:SECONDS (else STEP_TIMEOUT, default 540). The default plan,
#   tests:200+memcheck:200+racecheck:200,prune_bench:180,kernels_bench:60,prune_70b:100
# puts the benchmarks after the checks, each alone on the GPU, and ends by 550 s. DEADLINE (seconds from
# the start, default 560) bounds everything: a group starts only with at least 60 s left, its steps run at
# most until the deadline, and the groups that did not start are named at the end, for a next call. Before
# any step the script checks that every library is found and that symprune sees a device (exit 3 otherwise).
set -uo pipefail
usage="usage: gpu_checks.sh BUNDLE_DIR|BUNDLE.tar.xz [--skip-sanitizer] [--skip-bench] [--steps PLAN]"
bundle="${1:?$usage}"
shift
if [[ -f $bundle ]]; then
  unpacked="$(mktemp -d)"
  tar -C "$unpacked" -xJf "$bundle" || { echo "gpu_checks: cannot unpack $bundle" >&2; exit 2; }
  bundle="$unpacked"
fi
bundle="$(cd "$bundle" && pwd)"
all_steps="tests memcheck racecheck prune_bench kernels_bench prune_70b prune_profile"
plan="tests:200+memcheck:200+racecheck:200,prune_bench:180,kernels_bench:60,prune_70b:100"
skip=" "
while (($# > 0)); do
  case "$1" in
    --skip-sanitizer) skip+="memcheck racecheck " ;;
    --skip-bench) skip+="kernels_bench prune_bench prune_70b " ;;
    --steps)
      [[ $# -ge 2 && $2 =~ ^[a-z0-9_]+(:[0-9]+)?([+,][a-z0-9_]+(:[0-9]+)?)*$ ]] || {
        echo "gpu_checks: --steps needs groups separated by ',' of steps joined by '+', each NAME or NAME:SECONDS," \
          "without spaces; the steps are $all_steps" >&2
        exit 2
      }
      for spec in ${2//[,+]/ }; do
        [[ " $all_steps " == *" ${spec%%:*} "* ]] || { echo "gpu_checks: unknown step '${spec%%:*}' ($all_steps)" >&2; exit 2; }
      done
      plan="$2"
      shift ;;
    *) echo "gpu_checks: unknown option $1 ($usage)" >&2; exit 2 ;;
  esac
  shift
done
step_timeout="${STEP_TIMEOUT:-540}"
deadline="${DEADLINE:-560}"
results="${OUT:-$PWD/gpu-results}"
mkdir -p "$results"
out="$(mktemp -d)/gpu-results"  # the work directory, packed into $results after every step
mkdir -p "$out"

# CUDA's libraries: the toolkit's, then those of the pip packages PyTorch brings (NCCL is only there, under
# /opt/torch, which may be a mount of its own). Only the bundle's binaries get them with the bundle's
# Debian libraries (libssl, libz, libgomp, ...): `native` prefixes their commands, and the Python steps,
# whose PyTorch has libraries of its own, call symprune through bin/symprune.sh, which sets them.
cuda_dirs=""
for dir in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d $dir ]] && cuda_dirs="$cuda_dirs:$dir"
done
while read -r lib; do cuda_dirs="$cuda_dirs:$(dirname "$lib")"; done < <(
  find /usr/local /usr/lib /usr/lib64 /opt \( -name 'libnccl.so.2' -o -name 'libcublas.so.13' -o -name 'libcublasLt.so.13' \) \
    2>/dev/null | sort -u)
native_libs="$bundle/lib$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
native=(env "LD_LIBRARY_PATH=$native_libs")
printf '#!/usr/bin/env bash\nLD_LIBRARY_PATH=%q exec %q "$@"\n' "$native_libs" "$bundle/bin/symprune" >"$bundle/bin/symprune.sh"
chmod +x "$bundle/bin/symprune.sh"
export PATH="/usr/local/cuda/bin:$PATH"
export SYMPRUNE_DATA="$bundle/data"  # the end-to-end device test's stories260K and text

# Every library found, and a device seen, before any step: otherwise every step fails (exit 127) or every
# gpu test skips, and the call's minutes are lost.
missing="$("${native[@]}" ldd "$bundle"/bin/symprune "$bundle"/bin/symprune_gpu_tests "$bundle"/bin/cuda_kernels_bench |
  grep 'not found' | sort -u)"
if [[ -n $missing ]]; then
  echo "gpu_checks: libraries not found (searched $native_libs):" >&2
  echo "$missing" >&2
  exit 3
fi
if ! "${native[@]}" "$bundle/bin/symprune" info | grep -q '^CUDA devices: [1-9]'; then
  echo "gpu_checks: symprune sees no CUDA device:" >&2
  "${native[@]}" "$bundle/bin/symprune" info >&2
  exit 3
fi

summary=()
not_run=()
pack() {  # the work directory and the table so far, into $results (a few files: the tool's limit)
  printf '%s\n' "${summary[@]}" >"$out/summary.txt"
  ((${#not_run[@]})) && echo "not run (no time left before DEADLINE=$deadline s): ${not_run[*]}" >>"$out/summary.txt"
  cp "$out/summary.txt" "$results/summary.txt"
  tar -C "$(dirname "$out")" -czf "$results/gpu-results.tar.gz.part" gpu-results &&
    mv "$results/gpu-results.tar.gz.part" "$results/gpu-results.tar.gz"
}
group() {  # group STEP[:SECONDS]...: starts the steps together, each with output to $out/LOG.log, waits for all
  local left=$((deadline - SECONDS - 10))
  if ((left < 60)); then
    not_run+=("$(IFS=+; echo "$*")")
    pack
    return 0
  fi
  # The CPU side of parallel steps (the CPU references of the tests) shares the machine's cores.
  local threads=$(($(nproc) / $#))
  ((threads < 1)) && threads=1
  local spec name limit pids=() logs=() starts=()
  for spec in "$@"; do
    name=${spec%%:*}
    limit=$step_timeout
    [[ $spec == *:* ]] && limit=${spec#*:}
    ((limit > left)) && limit=$left
    step_command "$name"
    logs+=("$log_name")
    starts+=("$SECONDS")
    (
      (($# > 1)) && export OMP_NUM_THREADS=$threads
      timeout --kill-after=10 "$limit" "${command[@]}"
      rc=$?
      echo "$SECONDS" >"$out/.$log_name.end"  # when it ended: the group is waited for in order
      exit $rc
    ) >"$out/$log_name.log" 2>&1 &
    pids+=("$!:$limit")
  done
  local i rc
  for i in "${!pids[@]}"; do
    wait "${pids[i]%%:*}"
    rc=$?
    ((rc == 124 || rc == 137)) &&
      echo "gpu_checks: ${logs[i]} stopped after ${pids[i]#*:} s (its limit, STEP_TIMEOUT or DEADLINE)" >>"$out/${logs[i]}.log"
    summary+=("$(printf '%-28s rc=%-3s %5ss' "${logs[i]}" "$rc" "$(($(cat "$out/.${logs[i]}.end") - starts[i]))")")
    rm -f "$out/.${logs[i]}.end"
    echo "== ${logs[i]} (rc=$rc)"
    tail -n 5 "$out/${logs[i]}.log"
  done
  pack
  return 0
}

{ nvidia-smi; echo; cat "$bundle/commit"; "${native[@]}" ldd "$bundle/bin/symprune_gpu_tests"; } >"$out/environment.log" 2>&1
"${native[@]}" "$bundle/bin/symprune" info >>"$out/environment.log" 2>&1
# The gpu tests and the sanitizers run one test suite per process (scripts/gtest_per_suite.sh): a sticky
# CUDA error costs its suite only. rc 4: all passed, but some test skipped.
per_suite="$(dirname "${BASH_SOURCE[0]}")/gtest_per_suite.sh"
sanitized='KernelTest.*:CudaDeviceTest.*:DevicePruningOpsTest.*:LowPrecisionTest.*:DsnotKernelTest.*:*CudaBackendModelTest.*'
bench="$(dirname "${BASH_SOURCE[0]}")/../bench"
step_command() {  # step_command NAME: sets command (an array) and log_name
  case "$1" in
    # Not CudaWithoutDevice: it checks the error of a machine without a GPU and skips where one is.
    tests) log_name=gpu_tests command=("${native[@]}" bash "$per_suite" "$out/gpu_tests" '*-CudaWithoutDevice.*'
      "$bundle/bin/symprune_gpu_tests") ;;
    memcheck) log_name=memcheck command=("${native[@]}" bash "$per_suite" "$out/memcheck" "$sanitized"
      "$bundle/bin/symprune_gpu_tests" compute-sanitizer --tool memcheck --error-exitcode 3) ;;
    racecheck) log_name=racecheck command=("${native[@]}" bash "$per_suite" "$out/racecheck" 'KernelTest.*:DsnotKernelTest.*:LowPrecisionTest.Attention*'
      "$bundle/bin/symprune_gpu_tests" compute-sanitizer --tool racecheck --error-exitcode 3) ;;
    kernels_bench) log_name=kernels_bench command=("${native[@]}" "$bundle/bin/cuda_kernels_bench"
      --json "$out/cuda_kernels_bench.json" --markdown "$out/cuda_kernels_bench.md") ;;
    prune_bench) log_name=prune_bench command=(python3 "$bench/cuda_prune_bench.py" --symprune "$bundle/bin/symprune.sh"
      --blocks "${PRUNE_BENCH_BLOCKS:-3}" --symprune-args "--device cuda --dtype bf16" --torch-args "--dtype fp16"
      --out "$out/cuda_prune_bench") ;;
    prune_profile) log_name=prune_profile command=(python3 "$bench/cuda_prune_bench.py" --symprune "$bundle/bin/symprune.sh"
      --blocks 3 --cases "${PRUNE_PROFILE_CASES:-wanda-50}" --no-torch --profile --symprune-args "--device cuda --dtype bf16"
      --out "$out/cuda_prune_profile") ;;
    prune_70b) log_name=prune_70b command=(python3 "$bench/cuda_prune_bench.py" --symprune "$bundle/bin/symprune.sh"
      --model llama2-70b --blocks "${PRUNE_70B_BLOCKS:-4}" --cases wanda-50 --no-torch
      --symprune-args "--device cuda --dtype bf16" --out "$out/cuda_prune_bench_70b") ;;
  esac
}
# compute-sanitizer refuses the GPU on some machines (gVisor: "Device not supported", then error 999 at the
# first allocation; ../.library/device/KINDS.md): one short sanitized test first, and where it cannot run,
# the sanitizer steps are left out with the reason in the table instead of failing every suite.
if [[ $plan == *memcheck* || $plan == *racecheck* ]] && [[ $skip != *" memcheck "* || $skip != *" racecheck "* ]]; then
  probe_log="$out/sanitizer_probe.log"
  timeout --kill-after=10 60 "${native[@]}" compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$bundle/bin/symprune_gpu_tests" --gtest_filter='KernelTest.PlainAllocationsAreCountedToTheByteAndWork' \
    >"$probe_log" 2>&1
  probe_rc=$?
  # The refusal, or no answer within the minute, leaves them out: any other failure is the sanitizer's
  # finding, for its steps to report.
  if ((probe_rc == 124 || probe_rc == 137)) || { ((probe_rc != 0)) && grep -q 'Device not supported' "$probe_log"; }; then
    skip+="memcheck racecheck "
    summary+=("$(printf '%-28s rc=%-3s %s' sanitizers "$probe_rc" \
      "not run: compute-sanitizer cannot check on this machine ($(uname -r)); see sanitizer_probe.log")")
    echo "gpu_checks: compute-sanitizer cannot run here (rc $probe_rc); memcheck and racecheck left out:" >&2
    tail -n 5 "$probe_log" >&2
  fi
fi
for group_spec in ${plan//,/ }; do  # in the order given, without the skipped steps
  members=()
  for spec in ${group_spec//+/ }; do [[ $skip == *" ${spec%%:*} "* ]] || members+=("$spec"); done
  ((${#members[@]})) && group "${members[@]}"
done
[[ -f $out/gpu_tests.log ]] && grep -h -E '^gtest_per_suite|^\[  FAILED  \]|^  ' "$out"/gpu_tests.log | tail -n 40
pack
cat "$out/summary.txt"
