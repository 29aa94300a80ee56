#!/usr/bin/env bash
# README command 1: install everything, build, and run the main job on the bundled small model:
# convert stories260K (llama2.c) into a Hugging Face directory, prune it with Wanda at 50 % on two MPI
# ranks (symprune_dist; calibration: first half of TinyStories validation, 128 windows of 256 tokens),
# report dense vs pruned perplexity on the second half at seqlen 256, and show that the two-rank output
# is byte-identical to a one-process `symprune prune`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data="${SYMPRUNE_DATA:-$root/../shared/data}"
[[ -d "$data" ]] || { echo "quickstart: data folder $data not found (set SYMPRUNE_DATA)" >&2; exit 1; }
out="$root/out"

bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh"
build="${SYMPRUNE_BUILD_DIR:-$root/build}"
bin="$build/apps/symprune"

mkdir -p "$out"
python3 "$root/scripts/split_text.py" "$data/tinystories/tinystories_val.txt" \
  "$out/tinystories_val_first_half.txt" "$out/tinystories_val_second_half.txt"
"$bin" convert-llama2c --checkpoint "$data/stories260K/stories260K.bin" \
  --tokenizer "$data/stories260K/tok512.bin" --out "$out/stories260K-hf" --force
job=(--model "$out/stories260K-hf" --method wanda --sparsity 0.5
     --calib "$out/tinystories_val_first_half.txt" --nsamples 128 --seqlen 256
     --eval "$out/tinystories_val_second_half.txt")

# The mission's form: two MPI ranks (one per core here; --allow-run-as-root for root shells).
mpirun -n 2 --allow-run-as-root "$build/apps/symprune_dist" "${job[@]}" \
  --out "$out/stories260K-wanda50" --force --report "$out/prune_stories260K_wanda50.json"

# The same job in one process: the pruned weights must be the same bytes.
"$bin" prune "${job[@]}" --out "$out/stories260K-wanda50-1proc" --force \
  --report "$out/prune_stories260K_wanda50_1proc.json" --log-level warn >/dev/null
a=$(sha256sum "$out/stories260K-wanda50/model.safetensors" | cut -d' ' -f1)
b=$(sha256sum "$out/stories260K-wanda50-1proc/model.safetensors" | cut -d' ' -f1)
if [[ "$a" == "$b" ]]; then
  echo "quickstart: 2-rank and 1-process outputs are byte-identical (model.safetensors sha256 $a)"
else
  echo "quickstart: 2-rank output differs from the 1-process output ($a vs $b)" >&2
  exit 1
fi
