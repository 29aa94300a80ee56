#pragma once
// A CPU emulation of the CUDA execution model for the kernels of src/core/cuda/kernels (included
// through core/cuda/kernel_platform.cuh only, when SYMPRUNE_CUDA_EMULATION is defined).
//
// A launch runs every block of the grid in turn; each thread of a block is a fiber of its own stack on the
// launching thread (an OS thread in ThreadSanitizer builds, so TSan sees CUDA threads race: see
// block_executor.h). __syncthreads() is a real barrier of the block, warp shuffles and votes exchange values
// through a per-warp barrier, atomics are std::atomic_ref,
// `__shared__` variables are function statics (one block runs at a time) and dynamic shared memory
// is a buffer filled with 0xFF bytes (NaN floats) at every block, so reading it before writing shows.
// Fresh device allocations are filled with 0xFF too (emulation/device_memory_emulated.cc). What it checks
// beyond the results: a warp operation with a partial mask or in a partial warp, a block of more than
// 1024 threads, more than 48 KiB of dynamic shared memory without the kernel's opt-in, and a barrier that
// not every thread of a block reaches abort with a message. What it does not model: memory ordering without
// barriers, occupancy, timing (compute-sanitizer and the GPU benchmark do).
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <type_traits>

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct EmulatedStream;
using cudaStream_t = EmulatedStream*;

struct uint3 {
  unsigned x, y, z;
};
struct float4 {
  float x, y, z, w;
};
namespace symprune::cuda::emulation {
uint3 thread_index();
uint3 block_index();
}  // namespace symprune::cuda::emulation
// The calling thread's indices, read through functions: GCC's UBSan flags direct accesses to a
// thread_local defined in another file as null accesses in some kernels.
#define threadIdx (::symprune::cuda::emulation::thread_index())
#define blockIdx (::symprune::cuda::emulation::block_index())
extern dim3 blockDim;
extern dim3 gridDim;
constexpr int warpSize = 32;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

namespace symprune::cuda::emulation {

// Runs `body` as `kernel` (its address) over grid × block threads (one launch at a time, synchronously).
void launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, const void* kernel,
            const std::function<void()>& body);
void* dynamic_shared();
void sync_block();
void sync_warp(unsigned mask);
// Every lane of the calling thread's warp publishes `value`; returns the value published by `lane`
// (the caller's own when `lane` is outside the warp).
uint64_t warp_exchange(unsigned mask, uint64_t value, int source_lane);
// The predicates of all 32 lanes as a bit mask.
unsigned warp_ballot(unsigned mask, bool predicate);
// Every lane of the calling thread's warp publishes `bytes` (at most kMaxGatherBytes) from `mine`; `all`
// receives the 32 lanes' bytes in lane order (32 · bytes). What the warp-wide matrix instructions
// (mma.sync, ldmatrix) exchange in one step.
constexpr size_t kMaxGatherBytes = 64;
void warp_all_gather(unsigned mask, const void* mine, size_t bytes, void* all);
// Lets `kernel` (its address) use up to `bytes` of dynamic shared memory, above the 48 KiB every kernel may
// (cudaFuncSetAttribute's opt-in, per kernel as on a GPU; at most 227 KiB, the H100's limit).
void opt_in_dynamic_shared(const void* kernel, size_t bytes);

template <typename T>
uint64_t to_slot(T value) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>);
  uint64_t slot = 0;
  std::memcpy(&slot, &value, sizeof(T));
  return slot;
}
template <typename T>
T from_slot(uint64_t slot) {
  T value;
  std::memcpy(&value, &slot, sizeof(T));
  return value;
}
inline int lane_id() {
  const unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  return static_cast<int>(linear % 32u);
}

}  // namespace symprune::cuda::emulation

#define SYMPRUNE_LAUNCH(kernel, grid, block, shared_bytes, stream, ...) \
  ((void)(stream),                                                      \
   ::symprune::cuda::emulation::launch((grid), (block), (shared_bytes), \
                                       reinterpret_cast<const void*>(kernel), [&] { kernel(__VA_ARGS__); }))
#define SYMPRUNE_DYNAMIC_SHARED(type, name) \
  type* name = static_cast<type*>(::symprune::cuda::emulation::dynamic_shared())
#define SYMPRUNE_CHECK_LAUNCH() ((void)0)
#define SYMPRUNE_UNROLL
#define SYMPRUNE_UNROLL_BY(count)

inline void __syncthreads() {
  ::symprune::cuda::emulation::sync_block();
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::symprune::cuda::emulation::sync_warp(mask);
}

template <typename T>
T __shfl_sync(unsigned mask, T value, int source_lane, int width = 32) {
  namespace e = ::symprune::cuda::emulation;
  const int lane = e::lane_id();
  const int source = (lane / width) * width + (source_lane % width);
  return e::from_slot<T>(e::warp_exchange(mask, e::to_slot(value), source));
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask, int width = 32) {
  namespace e = ::symprune::cuda::emulation;
  const int lane = e::lane_id();
  const int source = lane ^ lane_mask;
  // A source outside the caller's width-segment returns the caller's own value (CUDA's rule).
  const bool inside = source / width == lane / width;
  return e::from_slot<T>(e::warp_exchange(mask, e::to_slot(value), inside ? source : lane));
}
template <typename T>
T __shfl_down_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  namespace e = ::symprune::cuda::emulation;
  const int lane = e::lane_id();
  const int source = lane + static_cast<int>(delta);
  const bool inside = source / width == lane / width;
  return e::from_slot<T>(e::warp_exchange(mask, e::to_slot(value), inside ? source : lane));
}
template <typename T>
T __shfl_up_sync(unsigned mask, T value, unsigned delta, int width = 32) {
  namespace e = ::symprune::cuda::emulation;
  const int lane = e::lane_id();
  const int source = lane - static_cast<int>(delta);
  const bool inside = source >= 0 && source / width == lane / width;
  return e::from_slot<T>(e::warp_exchange(mask, e::to_slot(value), inside ? source : lane));
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return ::symprune::cuda::emulation::warp_ballot(mask, predicate != 0);
}
inline int __any_sync(unsigned mask, int predicate) {
  return __ballot_sync(mask, predicate) != 0;
}
inline int __all_sync(unsigned mask, int predicate) {
  return __ballot_sync(mask, predicate) == mask;
}

template <typename T>
T atomicAdd(T* address, T value) {
  return std::atomic_ref<T>(*address).fetch_add(value);
}
template <typename T>
T atomicOr(T* address, T value) {
  return std::atomic_ref<T>(*address).fetch_or(value);
}
template <typename T>
T atomicMin(T* address, T value) {
  std::atomic_ref<T> ref(*address);
  T old = ref.load();
  while (value < old && !ref.compare_exchange_weak(old, value)) {
  }
  return old;
}
template <typename T>
T atomicMax(T* address, T value) {
  std::atomic_ref<T> ref(*address);
  T old = ref.load();
  while (value > old && !ref.compare_exchange_weak(old, value)) {
  }
  return old;
}

inline int __popc(unsigned x) {
  return std::popcount(x);
}
inline int __popcll(unsigned long long x) {
  return std::popcount(x);
}
inline int __clz(unsigned x) {
  return std::countl_zero(x);
}
inline int __ffs(unsigned x) {
  return x == 0 ? 0 : std::countr_zero(x) + 1;
}
inline unsigned __float_as_uint(float x) {
  return std::bit_cast<unsigned>(x);
}
inline float __uint_as_float(unsigned x) {
  return std::bit_cast<float>(x);
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}
// Round-to-nearest fp64 arithmetic without contraction (what the kernels use for CPU parity).
inline double __dadd_rn(double a, double b) {
  return a + b;
}
inline double __dsub_rn(double a, double b) {
  return a - b;
}
inline double __dmul_rn(double a, double b) {
  return a * b;
}
inline double __ddiv_rn(double a, double b) {
  return a / b;
}
inline double __dsqrt_rn(double a) {
  return std::sqrt(a);
}
inline float __fadd_rn(float a, float b) {
  return a + b;
}
inline float __fsub_rn(float a, float b) {
  return a - b;
}
inline float __fmul_rn(float a, float b) {
  return a * b;
}
inline float __fdiv_rn(float a, float b) {
  return a / b;
}
// expf, sqrt, fabs: the C library's, as in device code (<math.h> declares them globally).
#include <math.h>
