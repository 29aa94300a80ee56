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

inline cudaStream_t native(DeviceStream stream) {
  return static_cast<cudaStream_t>(stream.handle);
}

}  // namespace symprune::cuda::kernels
