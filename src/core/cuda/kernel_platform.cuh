#pragma once
// What a kernel file of src/core/cuda/kernels includes instead of <cuda_runtime.h>. Under nvcc it is
// the CUDA runtime. Compiled as plain C++ with SYMPRUNE_CUDA_EMULATION defined it is the CPU emulation
// of core/cuda/emulation (one OS thread per CUDA thread, real barriers and warp exchanges), so the
// kernels' logic is tested against the CPU backend on machines without a GPU, under ASan too. This is
// the one place that tells the two builds apart.
//
// Kernels launch with SYMPRUNE_LAUNCH(kernel, grid, block, dynamic_shared_bytes, stream, args...)
// (a template kernel through a function pointer variable), declare dynamic shared memory with
// SYMPRUNE_DYNAMIC_SHARED(type, name), check the launch with SYMPRUNE_CHECK_LAUNCH() and ask for a
// fully unrolled loop with SYMPRUNE_UNROLL (#pragma unroll under nvcc, nothing in the emulation).
#if defined(SYMPRUNE_CUDA_EMULATION)
#include "core/cuda/emulation/emulated_cuda.h"
#else
#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"

#define SYMPRUNE_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)
#define SYMPRUNE_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#define SYMPRUNE_CHECK_LAUNCH() SYMPRUNE_CUDA_CHECK(cudaGetLastError())
#define SYMPRUNE_UNROLL _Pragma("unroll")
#endif
