#pragma once
// Host-only header: the kernels of the 16-bit attention (device_attention.h) on DEVICE pointers.
#include <cstdint>

#include "core/cuda/device_memory.h"
#include "core/dtype.h"

namespace symprune::cuda {

// The causal softmax of a tile of queries: scores is [heads][tile][keys] fp32 (already scaled), the query
// at tile row i sees keys [0, first_query + i] (first_query + tile <= keys); probs (same layout, bf16 or
// fp16 = dtype) = softmax over the visible keys in fp32, rounded to dtype, 0 for the keys it cannot see.
void launch_causal_softmax_16bit(const float* scores, int64_t heads, int64_t tile, int64_t keys,
                                 int64_t first_query, DType dtype, void* probs, DeviceStream stream);

// Whether launch_flash_attention_16bit takes heads of this size.
bool flash_attention_supports(int64_t head_dim);

// Causal grouped-query attention fused in one kernel (flash attention on tensor cores): q [n_seqs·seq_len,
// n_heads·head_dim], k and v [.., n_kv_heads·head_dim] in the 16-bit dtype (bf16 or fp16), out fp32 in q's
// layout. S = scale·Q Kᵀ accumulates in fp32, the softmax runs in fp32 online over tiles of keys, P is
// rounded to the dtype for P V, which accumulates in fp32; no score leaves the chip. out_rounded, when not
// null, receives out rounded to the dtype too. head_dim 16, 32, 64 or 128 (flash_attention_supports); Error
// otherwise. rows_per_warp: the queries each warp keeps (16 or 32: more registers, fewer fragment loads);
// the default is the faster on the H100 (bench/results/cuda_kernels_bench.md times both).
constexpr int kFlashRowsPerWarp = 32;
void launch_flash_attention_16bit(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t n_seqs,
                                  int64_t seq_len, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                                  float scale, DType dtype, float* out, uint16_t* out_rounded,
                                  DeviceStream stream, int rows_per_warp = kFlashRowsPerWarp);

}  // namespace symprune::cuda
