#!/usr/bin/env bash
# README command 1: install everything, build, and run the main job on the bundled small model:
# convert stories260K (llama2.c) into a Hugging Face directory, prune it with Wanda at 50 %
# (calibration: first half of TinyStories validation, 128 windows of 256 tokens) and report dense
# vs pruned perplexity on the second half at seqlen 256.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data="${SYMPRUNE_DATA:-$root/../shared/data}"
[[ -d "$data" ]] || { echo "quickstart: data folder $data not found (set SYMPRUNE_DATA)" >&2; exit 1; }
out="$root/out"

bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh"
bin="${SYMPRUNE_BUILD_DIR:-$root/build}/apps/symprune"

mkdir -p "$out"
python3 "$root/scripts/split_text.py" "$data/tinystories/tinystories_val.txt" \
  "$out/tinystories_val_first_half.txt" "$out/tinystories_val_second_half.txt"
"$bin" convert-llama2c --checkpoint "$data/stories260K/stories260K.bin" \
  --tokenizer "$data/stories260K/tok512.bin" --out "$out/stories260K-hf" --force
"$bin" prune --model "$out/stories260K-hf" --method wanda --sparsity 0.5 \
  --calib "$out/tinystories_val_first_half.txt" --nsamples 128 --seqlen 256 \
  --eval "$out/tinystories_val_second_half.txt" \
  --out "$out/stories260K-wanda50" --force --report "$out/prune_stories260K_wanda50.json"
