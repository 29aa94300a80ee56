#!/usr/bin/env bash
# The SASS (GPU machine code) of one kernel file, to read how a kernel's loads are scheduled against its
# arithmetic without a GPU: compiles FILE.cu for sm_90 (or $ARCH) and disassembles it with nvdisasm, which
# the CUDA toolkit installed here lacks and PyPI has (fetched once into .cache/nvdisasm).
#   scripts/sass.sh src/core/cuda/kernels/stats_kernels.cu [kernel-name-part]
# With a name part, only the functions whose mangled names contain it are printed.
set -euo pipefail
cd "$(dirname "$0")/.."
file=${1:?usage: scripts/sass.sh FILE.cu [kernel-name-part]}
part=${2:-}
arch=${ARCH:-sm_90}
python=python3
[[ -x .venv/bin/python ]] && python=.venv/bin/python
find_tool() { if [[ -d .cache/nvdisasm ]]; then find .cache/nvdisasm -name nvdisasm -type f | head -1; fi; }
tool=$(find_tool)
if [[ -z $tool ]]; then
  mkdir -p .cache/nvdisasm
  "$python" -m pip download --quiet --no-deps -d .cache/nvdisasm nvidia-cuda-nvdisasm
  (cd .cache/nvdisasm && "$OLDPWD/$python" -m zipfile -e nvidia_cuda_nvdisasm-*.whl . 2>/dev/null ||
    python3 -m zipfile -e nvidia_cuda_nvdisasm-*.whl .)
  tool=$(find_tool)
  chmod +x "$tool"
fi
cubin=$(mktemp --suffix=.cubin)
trap 'rm -f "$cubin"' EXIT
nvcc -I src -O3 -cubin -arch="$arch" -std=c++17 -x cu "$file" -o "$cubin"
if [[ -z $part ]]; then
  "$tool" "$cubin"
else
  "$tool" "$cubin" | awk -v part="$part" '/^\s*\.text\./ { show = index($0, part) > 0 } show'
fi
