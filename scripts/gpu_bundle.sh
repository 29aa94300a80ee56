#!/usr/bin/env bash
# Packs what a lent GPU machine needs to run the GPU checks: the CUDA build's gpu test binary, the kernel
# benchmark and symprune, plus the shared libraries they load that such a machine lacks and the test data
# of the end-to-end device test. It has CUDA 13
# (cuBLAS in the toolkit, NCCL from PyTorch's pip packages) but none of this machine's Debian libraries
# (OpenBLAS, HDF5, MPI, ...), and no package registry. The directory is about 72 MiB, over the device
# tool's 64 MiB carry, so it is also packed as BUNDLE_DIR.tar.xz (about 16 MiB), which is what to carry.
#
#   scripts/gpu_bundle.sh [BUILD_DIR] [BUNDLE_DIR]     defaults: build/ (a CUDA configuration), gpu-bundle/
# Then, with the device tool (gpu_checks.sh probes whether compute-sanitizer runs on the GPU lent): carry
# gpu-bundle.tar.xz, command `bash scripts/gpu_checks.sh gpu-bundle.tar.xz`, timeout_s 600: its default
# plan is the whole check in one call (a session has 15 minutes of device time, the start included).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
bundle="${2:-$root/gpu-bundle}"

grep -q '^SYMPRUNE_WITH_CUDA:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null || {
  echo "gpu_bundle: $build is not a CUDA configuration (scripts/build.sh -DSYMPRUNE_WITH_CUDA=ON ...)" >&2
  exit 2
}
cmake --build "$build" --target symprune_gpu_tests cuda_kernels_bench symprune >/dev/null
binaries=("$build/tests/symprune_gpu_tests" "$build/bench/cuda_kernels_bench" "$build/apps/symprune")

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib"
cp "${binaries[@]}" "$bundle/bin/"
# Everything ldd resolves, except the C runtime (newer on the GPU machine's image: glibc's libresolv, libnss,
# ... bind private symbols of this machine's libc) and CUDA's own libraries (the GPU machine has them, and
# cuBLAS/NCCL alone are far over the carry limit).
ldd "${binaries[@]}" | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*.so.* | libstdc++.so.* | \
      libresolv.so.* | libnss_*.so.* | libanl.so.* | libutil.so.* | libmvec.so.* | \
      libgcc_s.so.* | libcuda.so.* | libcudart.so.* | libcublas*.so.* | libnccl.so.* | libnvidia*)
      ;;
    *) cp -L "$lib" "$bundle/lib/" ;;
  esac
done
# The data of the gpu tests' end-to-end prune (stories260K and its calibration/evaluation text, 1.8 MiB):
# the GPU machine gets the working tree but not ../shared.
data="${SYMPRUNE_DATA:-$root/../shared/data}"
for file in stories260K/stories260K.bin stories260K/tok512.bin tinystories/tinystories_val.txt; do
  mkdir -p "$bundle/data/$(dirname "$file")"
  cp "$data/$file" "$bundle/data/$file"
done
git -C "$root" rev-parse HEAD >"$bundle/commit"
tar -C "$bundle" -cf - . | xz -T0 -6 >"$bundle.tar.xz"
size_kib=$(du -k "$bundle.tar.xz" | cut -f1)
echo "gpu_bundle: $bundle.tar.xz ($((size_kib / 1024)) MiB; commit $(cut -c1-12 "$bundle/commit"))"
if ((size_kib > 60 * 1024)); then
  echo "gpu_bundle: over 60 MiB, the device tool carries 64 MiB at most" >&2
  exit 1
fi
