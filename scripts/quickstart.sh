#!/usr/bin/env bash
# README command 1: install everything, build, and run the main job on the bundled small model:
# convert stories260K (llama2.c) into a Hugging Face directory and report its perplexity on the
# second half of TinyStories validation at seqlen 256.
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
"$bin" eval --model "$out/stories260K-hf" --text "$out/tinystories_val_second_half.txt" --seqlen 256 \
  --report "$out/eval_stories260K_dense.json"
