#!/usr/bin/env bash
# README command 2: build and run the test suite (unit, e2e; gpu tests skip without a device).
# Extra arguments go to ctest (e.g. -L unit, -R tokenizer).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
bash "$root/scripts/build.sh"
cd "${SYMPRUNE_BUILD_DIR:-$root/build}"
ctest --output-on-failure --timeout 900 -j 2 -LE slow "$@"
