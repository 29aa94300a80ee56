#pragma once
// Host-only header: causal grouped-query attention with tensor-core products, for a run in lower precision
// (--dtype bf16/fp16). q, k and v are rounded to the 16-bit dtype. Heads of 16, 32, 64 or 128 (LLaMA's
// 128) go to the fused flash kernel (attention_kernels.h: no scores in global memory). Other sizes take
// the GEMM path: per sequence and per tile of queries, S = scale · Q Kᵀ over the keys the tile can see is
// one strided-batched GEMM (fp32 accumulation and output), the causal softmax rounds P to 16 bits, and
// O = P V is a second GEMM written into `out` in fp32. Memory is bounded by the tile (kAttentionTileBytes,
// core/backend.h), never an n_heads · T · T buffer.
#include <cstdint>

#include "core/cuda/device_memory.h"
#include "core/cuda/kernels/forward_kernels.h"
#include "core/dtype.h"

namespace symprune::cuda {

// Device buffers reused between calls (grown to the largest call); q, k and v hold attention_16bit's
// rounded operands.
struct AttentionScratch {
  DeviceArray<uint16_t> q, k, v, probs;
  DeviceArray<float> scores;
};

// Queries per tile: the most whose fp32 scores and 16-bit probabilities over `seq_len` keys for every
// head fit in `tile_bytes` (a multiple of 16 from 16 on, at least 1, at most seq_len).
int64_t attention_query_tile(int64_t n_heads, int64_t seq_len, int64_t tile_bytes);

// Which kernels attention_16bit runs: the flash kernel where it takes the head size (kAuto: its default
// rows per warp; kFlash16, kFlash32: 16 or 32 rows per warp), or the GEMM path always. All but kAuto are
// the benchmark's and the tests' comparisons.
enum class AttentionPath { kAuto, kFlash16, kFlash32, kGemm };

// The layout of launch_attention (forward_kernels.h); dtype bf16 or fp16; hd ≤ 256. `query_tile` is the
// GEMM path's. q, k and v are fp32 and rounded into the scratch here.
void attention_16bit(const float* q, const float* k, const float* v, int64_t n_seqs, int64_t seq_len,
                     int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale, DType dtype,
                     int64_t query_tile, AttentionScratch& scratch, float* out,
                     AttentionPath path = AttentionPath::kAuto);

// The same on operands already rounded to dtype (the CUDA backend's rounded copies). `out_rounded`, when
// set (in dtype), receives out rounded as well: by the flash kernel in the same pass, by a conversion after
// the GEMM path. write_fp32 false (out_rounded set): the flash kernel writes the rounded output only; the
// GEMM path, which computes out in its memory, writes both. Returns whether out's fp32 values were written.
bool attention_16bit_rounded(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t n_seqs,
                             int64_t seq_len, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                             float scale, DType dtype, int64_t query_tile, AttentionScratch& scratch,
                             float* out, RoundedOutput out_rounded = {},
                             AttentionPath path = AttentionPath::kAuto, bool write_fp32 = true);

}  // namespace symprune::cuda
