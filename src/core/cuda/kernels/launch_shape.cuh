#pragma once
// Launch shapes shared by the kernel files of this folder (included after core/cuda/kernel_platform.cuh).
#include <cstdint>

#include "core/cuda/device_memory.h"

namespace symprune::cuda::kernels {

constexpr int kThreads = 256;  // threads per block: a multiple of the warp size
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFullMask = 0xffffffffu;

// The most blocks a grid may have along y or z (CUDA's limit; x allows 2^31 − 1).
constexpr int64_t kMaxGridYz = 65535;

// Calls launch(first, count) for consecutive slices of [0, total) of at most per_launch items (clamped to
// [1, kMaxGridYz]): a grid with the items along y or z, in as many launches as the limit needs.
template <typename Launch>
void for_each_grid_slice(int64_t total, int64_t per_launch, Launch launch) {
  const int64_t step = per_launch < 1 ? 1 : (per_launch < kMaxGridYz ? per_launch : kMaxGridYz);
  for (int64_t first = 0; first < total; first += step)
    launch(first, total - first < step ? total - first : step);
}

// Blocks for a grid-stride loop over `count` items: enough to cover it, at most 4096 (the loop does the
// rest).
inline int grid_for(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

// Whether p is aligned to `bytes` (null passes): the vector kernels' 16-byte float4 and 8-byte 4 × 16-bit
// accesses need it.
inline bool aligned_to(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// A grid-stride loop over i in [0, count).
#define SYMPRUNE_GRID_STRIDE(i, count)                                                       \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (count); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

inline cudaStream_t native(DeviceStream stream) {
  return static_cast<cudaStream_t>(stream.handle);
}

}  // namespace symprune::cuda::kernels
