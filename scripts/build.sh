#!/usr/bin/env bash
# Configures and builds symprune into build/ (CPU only; pass -DSYMPRUNE_WITH_CUDA=ON etc. as extra args).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${SYMPRUNE_BUILD_DIR:-$root/build}"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
