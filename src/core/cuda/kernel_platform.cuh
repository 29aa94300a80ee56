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
//
// 16-bit storage elements are uint16_t bit patterns, converted with bf16_bits_to_float & co.: CUDA's
// intrinsics under nvcc, core/dtype.h's conversions in the emulation; both round to nearest even and agree
// on every value except NaN payloads.
#include <cstdint>

#if defined(SYMPRUNE_CUDA_EMULATION)
#include "core/cuda/emulation/emulated_cuda.h"
#include "core/dtype.h"

namespace symprune::cuda {
inline float bf16_bits_to_float(uint16_t bits) {
  return bf16_to_float(bits);
}
inline uint16_t float_to_bf16_bits(float value) {
  return float_to_bf16(value);
}
inline float fp16_bits_to_float(uint16_t bits) {
  return fp16_to_float(bits);
}
inline uint16_t float_to_fp16_bits(float value) {
  return float_to_fp16(value);
}
}  // namespace symprune::cuda
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"

namespace symprune::cuda {
__device__ __forceinline__ float bf16_bits_to_float(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}
__device__ __forceinline__ uint16_t float_to_bf16_bits(float value) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(value));
}
__device__ __forceinline__ float fp16_bits_to_float(uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}
__device__ __forceinline__ uint16_t float_to_fp16_bits(float value) {
  return __half_as_ushort(__float2half_rn(value));
}
}  // namespace symprune::cuda

#define SYMPRUNE_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)
#define SYMPRUNE_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#define SYMPRUNE_CHECK_LAUNCH() SYMPRUNE_CUDA_CHECK(cudaGetLastError())
#define SYMPRUNE_UNROLL _Pragma("unroll")
#endif
