#!/usr/bin/env bash
# Submits a sweep: one array task per cell of GRID (slurm/sweep.sbatch), then a collector job that runs
# when the array has ended (afterany) and writes SWEEP_DIR/results.md and results.json, one row per cell
# (method, mask, refinement, sparsity, dense and pruned perplexity, time, status).
#
#   slurm/submit_sweep.sh GRID SWEEP_DIR [common symprune options...]
#   slurm/submit_sweep.sh slurm/grids/paper_sparsity.tsv /scratch/$USER/sweep1 \
#       --model /models/llama-2-7b-hf --calib /data/c4.json.gz --eval /data/wikitext2-test.txt
#
# Environment: SYMPRUNE_SBATCH_ARGS (sbatch options for every cell, e.g. "--partition=gpu --time=2:00:00"
# or, for CPU ranks, "--gpus-per-node=0 --ntasks-per-node=4"), SYMPRUNE_SWEEP_PARALLEL (most cells running
# at once), SYMPRUNE_COLLECT_SBATCH_ARGS (sbatch options of the collector job), SYMPRUNE_HOME (checkout;
# default: this script's repository). Rerunning the collector by hand: python3 slurm/collect_sweep.py DIR.
set -euo pipefail
if (($# < 2)); then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
grid=$1 sweep=$2
shift 2
home=${SYMPRUNE_HOME:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
[[ -f $grid ]] || { echo "submit_sweep: grid file $grid not found" >&2; exit 2; }
cells=$(grep -c -v -E '^[[:space:]]*(#|$)' "$grid" || true)
((cells > 0)) || { echo "submit_sweep: $grid has no cells" >&2; exit 2; }
duplicates=$(grep -v -E '^[[:space:]]*(#|$)' "$grid" | awk '{print $1}' | sort | uniq -d)
[[ -z $duplicates ]] || { echo "submit_sweep: cell names repeat in $grid: $duplicates" >&2; exit 2; }
mkdir -p "$sweep"
sweep=$(cd "$sweep" && pwd)
# The sweep directory keeps its grid: the cells' line numbers must not change under running tasks.
if [[ -f $sweep/grid.tsv ]] && ! cmp -s "$grid" "$sweep/grid.tsv"; then
  echo "submit_sweep: $sweep holds another grid ($sweep/grid.tsv); use a new sweep directory" >&2
  exit 2
fi
cp "$grid" "$sweep/grid.tsv"
printf '%q ' "$@" >"$sweep/common_options.txt"

read -r -a cell_args <<<"${SYMPRUNE_SBATCH_ARGS:-}"
read -r -a collect_args <<<"${SYMPRUNE_COLLECT_SBATCH_ARGS:-}"
array="0-$((cells - 1))${SYMPRUNE_SWEEP_PARALLEL:+%$SYMPRUNE_SWEEP_PARALLEL}"
array_job=$(SYMPRUNE_HOME=$home sbatch --parsable --array="$array" --output="$sweep/%x-%A_%a.log" \
  "${cell_args[@]}" "$home/slurm/sweep.sbatch" "$sweep/grid.tsv" "$sweep" "$@")
array_job=${array_job%%;*}
collect_job=$(sbatch --parsable --dependency="afterany:$array_job" --job-name=symprune-collect --ntasks=1 \
  --output="$sweep/collect-%j.log" "${collect_args[@]}" \
  --wrap="python3 $(printf '%q' "$home/slurm/collect_sweep.py") $(printf '%q' "$sweep")")
collect_job=${collect_job%%;*}
echo "submit_sweep: $cells cells: array job $array_job, collector job $collect_job"
echo "submit_sweep: logs in $sweep, table in $sweep/results.md and results.json when the array ends"
