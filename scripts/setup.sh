#!/usr/bin/env bash
# Installs everything symprune needs on Debian 12: build tools and libraries (apt) and the Python
# test helpers (a venv in .venv with Debian's torch/numpy plus transformers/tokenizers from PyPI).
# Idempotent; safe to re-run. CUDA/cuBLAS/NCCL are used from /usr/local/cuda when present.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

apt_packages=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-dev libomp-dev
  libopenmpi-dev openmpi-bin libhdf5-openmpi-dev
  nlohmann-json3-dev libcli11-dev libyaml-cpp-dev libspdlog-dev libfmt-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libsentencepiece-dev libpcre2-dev zlib1g-dev
  clang libclang-rt-14-dev
  python3 python3-venv python3-numpy python3-torch
  slurmctld slurmd slurm-client munge  # the slurm-label tests start a one-node cluster (daemons not enabled)
)
missing=()
for p in "${apt_packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python helpers for tests: system python (Debian's torch), so the venv sees system site-packages.
venv="$root/.venv"
if [[ ! -x "$venv/bin/python" ]]; then
  /usr/bin/python3 -m venv --system-site-packages "$venv"
fi
if ! "$venv/bin/python" -c "import transformers, tokenizers, sentencepiece, safetensors, h5py" 2>/dev/null; then
  "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$root/scripts/requirements-test.txt"
fi
echo "setup: done"
