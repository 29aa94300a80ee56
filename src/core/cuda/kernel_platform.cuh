#pragma once
// What a kernel file of src/core/cuda/kernels includes instead of <cuda_runtime.h>. Under nvcc it is
// the CUDA runtime. Compiled as plain C++ with SYMPRUNE_CUDA_EMULATION defined it is the CPU emulation
// of core/cuda/emulation (a fiber per CUDA thread, OS threads under TSan; real barriers and warp
// exchanges), so the
// kernels' logic is tested against the CPU backend on machines without a GPU, under ASan too. This is
// the one place that tells the two builds apart.
//
// Kernels launch with SYMPRUNE_LAUNCH(kernel, grid, block, dynamic_shared_bytes, stream, args...)
// (a template kernel through a function pointer variable), declare dynamic shared memory with
// SYMPRUNE_DYNAMIC_SHARED(type, name), check the launch with SYMPRUNE_CHECK_LAUNCH() and ask for a
// fully unrolled loop with SYMPRUNE_UNROLL (#pragma unroll under nvcc, nothing in the emulation), or one
// unrolled `count` times with SYMPRUNE_UNROLL_BY(count).
//
// 16-bit storage elements are uint16_t bit patterns, converted with bf16_bits_to_float & co.: CUDA's
// intrinsics under nvcc, core/dtype.h's conversions in the emulation; both round to nearest even and agree
// on every value except NaN payloads.
//
// The warp-wide matrix instructions of the flash attention (mma_m16n8k16, load_matrix_x4[_trans],
// copy_async_16 with its commit and wait, pack_pair) and the vector accesses (load_float4, store_float4,
// load_4x16, store_4x16) are inline PTX or CUDA's vector types under nvcc and emulation/emulated_mma.h's in
// the emulation, which documents their fragment layouts. A kernel that needs more than 48 KiB of dynamic
// shared memory opts in with SYMPRUNE_ALLOW_DYNAMIC_SHARED(kernel, bytes) before its launch.
#include <cstdint>

#if defined(SYMPRUNE_CUDA_EMULATION)
#include "core/cuda/emulation/emulated_cuda.h"
#include "core/cuda/emulation/emulated_mma.h"
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

// d += a · b, PTX mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 (fragment layouts in
// emulation/emulated_mma.h).
template <bool kBf16>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  if constexpr (kBf16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ unsigned shared_address(const void* pointer) {
  return static_cast<unsigned>(__cvta_generic_to_shared(pointer));
}
// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lane L gives row L % 8 of matrix L / 8.
__device__ __forceinline__ void load_matrix_x4(uint32_t (&r)[4], const uint16_t* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}
__device__ __forceinline__ void load_matrix_x4_trans(uint32_t (&r)[4], const uint16_t* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
}
// 16 bytes global → shared without passing through registers (zeros when !valid; `global` must still be
// a valid address).
__device__ __forceinline__ void copy_async_16(uint16_t* shared, const uint16_t* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copy_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most kPending committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// Four floats at p (16-byte aligned) as one access; four 16-bit values at p (8-byte aligned) as one store.
__device__ __forceinline__ float4 load_float4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ void store_float4(float* p, float4 value) {
  *reinterpret_cast<float4*>(p) = value;
}
__device__ __forceinline__ void load_4x16(const uint16_t* p, uint16_t (&values)[4]) {
  const uint2 word = *reinterpret_cast<const uint2*>(p);
  values[0] = static_cast<uint16_t>(word.x & 0xFFFFu);
  values[1] = static_cast<uint16_t>(word.x >> 16);
  values[2] = static_cast<uint16_t>(word.y & 0xFFFFu);
  values[3] = static_cast<uint16_t>(word.y >> 16);
}
__device__ __forceinline__ void store_4x16(uint16_t* p, uint16_t a, uint16_t b, uint16_t c, uint16_t d) {
  *reinterpret_cast<uint2*>(p) =
      make_uint2(a | static_cast<uint32_t>(b) << 16, c | static_cast<uint32_t>(d) << 16);
}
// Two floats rounded to the 16-bit type as one register (low: the first).
template <bool kBf16>
__device__ __forceinline__ uint32_t pack_pair(float low, float high) {
  if constexpr (kBf16) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<const uint32_t*>(&pair);
  } else {
    const __half2 pair = __floats2half2_rn(low, high);
    return *reinterpret_cast<const uint32_t*>(&pair);
  }
}
}  // namespace symprune::cuda

#define SYMPRUNE_ALLOW_DYNAMIC_SHARED(kernel, bytes) \
  SYMPRUNE_CUDA_CHECK(                               \
      cudaFuncSetAttribute((kernel), cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)))

#define SYMPRUNE_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  kernel<<<(grid), (block), (shared_bytes), (stream)>>>(__VA_ARGS__)
#define SYMPRUNE_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#define SYMPRUNE_CHECK_LAUNCH() SYMPRUNE_CUDA_CHECK(cudaGetLastError())
#define SYMPRUNE_UNROLL _Pragma("unroll")
#define SYMPRUNE_PRAGMA(text) _Pragma(#text)
#define SYMPRUNE_UNROLL_BY(count) SYMPRUNE_PRAGMA(unroll count)
#endif
