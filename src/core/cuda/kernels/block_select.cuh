#pragma once
// Block-wide building blocks of the selection kernels (mask_kernels.cu, dsnot_kernels.cu; included after
// core/cuda/kernel_platform.cuh): the CPU's order keys, a block prefix count and a
// per-row radix select. Blocks have kThreads threads.
#include <cstdint>

#include "core/cuda/kernels/launch_shape.cuh"

namespace symprune::cuda::kernels {

// score_order_key of core/masks.h: monotone in the float order, -0 == +0, every NaN above +inf.
__device__ __forceinline__ uint32_t order_key(float score) {
  uint32_t bits = __float_as_uint(score);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;
  if (bits == 0x80000000u) bits = 0;
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Exclusive prefix count of `flag` over the block's threads in thread order; *total gets the sum.
// Every thread of the block must call it.
__device__ inline int block_exclusive_count(bool flag, int* total) {
  __shared__ int warp_counts[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const unsigned ballot = __ballot_sync(kFullMask, flag);
  const int before_in_warp = __popc(ballot & ((1u << lane) - 1u));
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  int before = before_in_warp, sum = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) before += warp_counts[w];
    sum += warp_counts[w];
  }
  __syncthreads();  // warp_counts is reused by the next call
  *total = sum;
  return before;
}

// Marks the first `quota` columns (in column order) whose key equals `threshold`; the other entries
// of `mask` are left alone. The whole block calls it for one row.
template <typename KeyAt>
__device__ void mark_first_equal(KeyAt key_at, int64_t cols, uint32_t threshold, int64_t quota,
                                 uint8_t* mask) {
  int64_t taken = 0;
  for (int64_t base = 0; base < cols && taken < quota; base += kThreads) {
    const int64_t c = base + threadIdx.x;
    const bool equal = c < cols && key_at(c) == threshold;
    int chunk_total = 0;
    const int before = block_exclusive_count(equal, &chunk_total);
    if (equal && taken + before < quota) mask[c] = 1;
    taken += chunk_total;  // the same value in every thread, so the loop exits together
  }
}

// Radix select of the key at 0-based `rank` among the columns c < cols with included(c) (4 passes of 8
// bits); *equal_before = how many of those keys equal to it precede it in the order (rank < their
// count). Every thread gets both.
template <typename KeyAt, typename Included>
__device__ uint32_t row_radix_select(KeyAt key_at, Included included, int64_t cols, int64_t rank,
                                     int64_t* equal_before) {
  __shared__ unsigned hist[256];
  __shared__ uint32_t chosen_bin;
  __shared__ int64_t rank_in_bin;
  uint32_t prefix = 0, prefix_mask = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    hist[threadIdx.x] = 0;  // kThreads == 256 bins
    __syncthreads();
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
      if (!included(c)) continue;
      const uint32_t key = key_at(c);
      if ((key & prefix_mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xffu], 1u);
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Lane l owns bins 8l..8l+7: an inclusive scan of the lanes' sums finds the lane holding `rank`.
      const int lane = threadIdx.x;
      int64_t own = 0;
      for (int b = 0; b < 8; ++b) own += hist[lane * 8 + b];
      int64_t inclusive = own;
      for (int offset = 1; offset < 32; offset *= 2) {
        const int64_t other = __shfl_up_sync(kFullMask, inclusive, offset);
        if (lane >= offset) inclusive += other;
      }
      const int64_t exclusive = inclusive - own;
      if (rank >= exclusive && rank < inclusive) {
        int64_t r = rank - exclusive;
        int b = lane * 8;
        while (r >= static_cast<int64_t>(hist[b])) r -= hist[b++];
        chosen_bin = static_cast<uint32_t>(b);
        rank_in_bin = r;
      }
    }
    __syncthreads();
    prefix |= chosen_bin << shift;
    prefix_mask |= 0xffu << shift;
    rank = rank_in_bin;
    __syncthreads();  // chosen_bin / rank_in_bin are rewritten by the next pass
  }
  *equal_before = rank;
  return prefix;
}

}  // namespace symprune::cuda::kernels
