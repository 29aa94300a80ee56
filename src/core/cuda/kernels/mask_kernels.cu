// Mask selection kernels (see mask_kernels.h). Per-row selection is a radix select of the 32-bit order
// keys (4 passes of 8 bits, one block per row, the row's keys cached in shared memory when they fit),
// never a sort; ties at the threshold key are cut by column with a block-wide prefix count.
#include "core/cuda/kernel_platform.cuh"
#include "core/cuda/kernels/block_select.cuh"
#include "core/cuda/kernels/launch_shape.cuh"
#include "core/cuda/kernels/mask_kernels.h"

namespace symprune::cuda {
namespace {

using namespace kernels;

// Row keys cached in dynamic shared memory up to this width (11008 = LLaMA-7B's MLP width fits).
constexpr int64_t kMaxCachedCols = 11264;

__global__ void __launch_bounds__(kThreads)
    select_rows_kernel(const float* __restrict__ scores, int64_t cols, int64_t k, uint8_t* __restrict__ mask,
                       bool cached) {
  SYMPRUNE_DYNAMIC_SHARED(uint32_t, cached_keys);
  const int64_t row = blockIdx.x;
  const float* s = scores + row * cols;
  uint8_t* m = mask + row * cols;
  if (cached) {
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) cached_keys[c] = order_key(s[c]);
    __syncthreads();
  }
  const auto key_at = [&](int64_t c) { return cached ? cached_keys[c] : order_key(s[c]); };
  int64_t equal_to_prune = 0;
  // The key at position k is the first one kept; below it everything is pruned, plus the first
  // `equal_to_prune` of its ties.
  const uint32_t threshold = row_radix_select(
      key_at, [](int64_t) { return true; }, cols, k, &equal_to_prune);
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) m[c] = key_at(c) < threshold ? 1 : 0;
  __syncthreads();
  mark_first_equal(key_at, cols, threshold, equal_to_prune, m);
}

__global__ void select_nm_kernel(const float* __restrict__ scores, int64_t groups, int n, int m,
                                 uint8_t* __restrict__ mask) {
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* s = scores + g * m;
    uint8_t* p = mask + g * m;
    // Rank by counting, ties by index in the group: the same total order as the CPU's.
    for (int i = 0; i < m; ++i) {
      const uint32_t ki = order_key(s[i]);
      int rank = 0;
      for (int j = 0; j < m && rank < n; ++j) {
        const uint32_t kj = order_key(s[j]);
        rank += (kj < ki) || (kj == ki && j < i);
      }
      p[i] = rank < n ? 1 : 0;
    }
  }
}

__global__ void first_nan_kernel(const float* __restrict__ scores, int64_t count, unsigned long long* first) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if ((__float_as_uint(scores[i]) & 0x7fffffffu) > 0x7f800000u)
      atomicMin(first, static_cast<unsigned long long>(i));
  }
}

__global__ void key_histogram_kernel(const float* __restrict__ scores, int64_t count, uint32_t prefix,
                                     uint32_t prefix_mask, int shift, int bins, unsigned long long* hist) {
  SYMPRUNE_DYNAMIC_SHARED(unsigned, local);
  for (int b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0;
  __syncthreads();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t key = order_key(scores[i]);
    if ((key & prefix_mask) == prefix)
      atomicAdd(&local[(key >> shift) & static_cast<uint32_t>(bins - 1)], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < bins; b += blockDim.x)
    if (local[b] != 0) atomicAdd(&hist[b], static_cast<unsigned long long>(local[b]));
}

__global__ void __launch_bounds__(kThreads)
    prune_below_key_kernel(const float* __restrict__ scores, int64_t cols, uint32_t threshold,
                           uint8_t* __restrict__ mask, int64_t* equal_in_row) {
  __shared__ int64_t warp_sums[kWarps];
  const int64_t row = blockIdx.x;
  const float* s = scores + row * cols;
  uint8_t* m = mask + row * cols;
  int64_t equal = 0;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    const uint32_t key = order_key(s[c]);
    m[c] = key < threshold ? 1 : 0;
    equal += key == threshold;
  }
  for (int offset = 16; offset > 0; offset /= 2) equal += __shfl_down_sync(kFullMask, equal, offset);
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = equal;
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t total = 0;
    for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
    equal_in_row[row] = total;
  }
}

__global__ void __launch_bounds__(kThreads)
    prune_first_equal_kernel(const float* __restrict__ scores, int64_t cols, uint32_t threshold,
                             const int64_t* __restrict__ quota, uint8_t* __restrict__ mask) {
  const int64_t row = blockIdx.x;
  const int64_t row_quota = quota[row];
  if (row_quota == 0) return;  // the whole block leaves together
  const float* s = scores + row * cols;
  mark_first_equal([&](int64_t c) { return order_key(s[c]); }, cols, threshold, row_quota, mask + row * cols);
}

__global__ void prune_at_most_kernel(const float* __restrict__ scores, int64_t count, float theta,
                                     uint8_t* __restrict__ mask) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    mask[i] = scores[i] <= theta ? 1 : 0;
}

__global__ void pack_bits_kernel(const uint8_t* __restrict__ mask, int64_t count,
                                 uint8_t* __restrict__ bits) {
  const int64_t bytes = (count + 7) / 8;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < bytes;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    unsigned byte = 0;
    for (int j = 0; j < 8 && b * 8 + j < count; ++j) byte |= (mask[b * 8 + j] ? 1u : 0u) << j;
    bits[b] = static_cast<uint8_t>(byte);
  }
}

__global__ void unpack_bits_kernel(const uint8_t* __restrict__ bits, int64_t count,
                                   uint8_t* __restrict__ mask) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    mask[i] = (bits[i / 8] >> (i % 8)) & 1u;
}

// Element: float, or the uint16_t bits of bf16/fp16 (whose zero is +0 in both).
template <typename Element>
__global__ void mask_weight_kernel(const Element* weight, const uint8_t* __restrict__ bits, int64_t count,
                                   bool keep_pruned, Element* out) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool pruned = ((bits[i >> 3] >> (i & 7)) & 1u) != 0;
    out[i] = pruned == keep_pruned ? weight[i] : Element{0};
  }
}

template <typename Element>
void launch_mask_weight_of(const void* weight, const uint8_t* bits, int64_t count, bool keep_pruned,
                           void* out, DeviceStream stream) {
  auto* kernel = mask_weight_kernel<Element>;
  SYMPRUNE_LAUNCH(kernel, grid_for(count), kThreads, 0, native(stream), static_cast<const Element*>(weight),
                  bits, count, keep_pruned, static_cast<Element*>(out));
  SYMPRUNE_CHECK_LAUNCH();
}

}  // namespace

void launch_first_nan(const float* scores, int64_t count, int64_t* first, DeviceStream stream) {
  if (count <= 0) return;
  static_assert(sizeof(unsigned long long) == sizeof(int64_t));
  SYMPRUNE_LAUNCH(first_nan_kernel, grid_for(count), kThreads, 0, native(stream), scores, count,
                  reinterpret_cast<unsigned long long*>(first));
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_select_rows(const float* scores, int64_t rows, int64_t cols, int64_t k, uint8_t* mask,
                        DeviceStream stream) {
  if (rows <= 0 || cols <= 0) return;
  const bool cached = cols <= kMaxCachedCols;
  const size_t shared = cached ? static_cast<size_t>(cols) * sizeof(uint32_t) : 0;
  SYMPRUNE_LAUNCH(select_rows_kernel, static_cast<unsigned>(rows), kThreads, shared, native(stream), scores,
                  cols, k, mask, cached);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_select_nm(const float* scores, int64_t rows, int64_t cols, int n, int m, uint8_t* mask,
                      DeviceStream stream) {
  const int64_t groups = rows * (cols / m);
  if (groups <= 0) return;
  SYMPRUNE_LAUNCH(select_nm_kernel, grid_for(groups), kThreads, 0, native(stream), scores, groups, n, m,
                  mask);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_key_histogram(const float* scores, int64_t count, uint32_t prefix, uint32_t prefix_mask,
                          int shift, int bits, int64_t* hist, DeviceStream stream) {
  const int bins = 1 << bits;
  zero_device(hist, static_cast<size_t>(bins) * sizeof(int64_t), stream);
  if (count <= 0) return;
  SYMPRUNE_LAUNCH(key_histogram_kernel, grid_for(count), kThreads,
                  static_cast<size_t>(bins) * sizeof(unsigned), native(stream), scores, count, prefix,
                  prefix_mask, shift, bins, reinterpret_cast<unsigned long long*>(hist));
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_prune_below_key(const float* scores, int64_t rows, int64_t cols, uint32_t threshold_key,
                            uint8_t* mask, int64_t* equal_in_row, DeviceStream stream) {
  if (rows <= 0) return;
  SYMPRUNE_LAUNCH(prune_below_key_kernel, static_cast<unsigned>(rows), kThreads, 0, native(stream), scores,
                  cols, threshold_key, mask, equal_in_row);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_prune_first_equal(const float* scores, int64_t rows, int64_t cols, uint32_t threshold_key,
                              const int64_t* quota, uint8_t* mask, DeviceStream stream) {
  if (rows <= 0 || cols <= 0) return;
  SYMPRUNE_LAUNCH(prune_first_equal_kernel, static_cast<unsigned>(rows), kThreads, 0, native(stream), scores,
                  cols, threshold_key, quota, mask);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_prune_at_most(const float* scores, int64_t count, float theta, uint8_t* mask,
                          DeviceStream stream) {
  if (count <= 0) return;
  SYMPRUNE_LAUNCH(prune_at_most_kernel, grid_for(count), kThreads, 0, native(stream), scores, count, theta,
                  mask);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_pack_mask_bits(const uint8_t* mask, int64_t count, uint8_t* bits, DeviceStream stream) {
  if (count <= 0) return;
  SYMPRUNE_LAUNCH(pack_bits_kernel, grid_for((count + 7) / 8), kThreads, 0, native(stream), mask, count,
                  bits);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_unpack_mask_bits(const uint8_t* bits, int64_t count, uint8_t* mask, DeviceStream stream) {
  if (count <= 0) return;
  SYMPRUNE_LAUNCH(unpack_bits_kernel, grid_for(count), kThreads, 0, native(stream), bits, count, mask);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_mask_weight(const void* weight, int64_t element_bytes, const uint8_t* bits, int64_t count,
                        bool keep_pruned, void* out, DeviceStream stream) {
  if (count <= 0) return;
  if (element_bytes == 4)
    launch_mask_weight_of<float>(weight, bits, count, keep_pruned, out, stream);
  else
    launch_mask_weight_of<uint16_t>(weight, bits, count, keep_pruned, out, stream);
}

}  // namespace symprune::cuda
