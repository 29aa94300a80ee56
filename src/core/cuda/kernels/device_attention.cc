// Tensor-core attention in lower precision (see device_attention.h).
#include "core/cuda/kernels/device_attention.h"

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/cuda/kernels/attention_kernels.h"
#include "core/cuda/kernels/convert_kernels.h"
#include "core/cuda/kernels/linear.h"
#include "core/error.h"

namespace symprune::cuda {
int64_t attention_query_tile(int64_t n_heads, int64_t seq_len, int64_t tile_bytes) {
  const int64_t per_query = std::max<int64_t>(n_heads * seq_len * (4 + 2), 1);
  int64_t tile = std::clamp<int64_t>(tile_bytes / per_query, 1, std::max<int64_t>(seq_len, 1));
  if (tile >= 16 && tile < seq_len) tile = tile / 16 * 16;
  return tile;
}

namespace {
void check_attention_shape(int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, DType dtype,
                           int64_t query_tile) {
  SYMPRUNE_CHECK(head_dim > 0 && head_dim <= 256 && n_kv_heads > 0 && n_heads % n_kv_heads == 0 &&
                     (dtype == DType::kBF16 || dtype == DType::kF16) && query_tile > 0,
                 "attention: head_dim {} (at most 256) with {} heads and {} kv heads in {}, tiles of {}",
                 head_dim, n_heads, n_kv_heads, dtype_name(dtype), query_tile);
}
}  // namespace

void attention_16bit(const float* q, const float* k, const float* v, int64_t n_seqs, int64_t seq_len,
                     int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale, DType dtype,
                     int64_t query_tile, AttentionScratch& scratch, float* out, AttentionPath path) {
  check_attention_shape(n_heads, n_kv_heads, head_dim, dtype, query_tile);
  if (n_seqs <= 0 || seq_len <= 0) return;
  const int64_t rows = n_seqs * seq_len, q_width = n_heads * head_dim, kv_width = n_kv_heads * head_dim;
  scratch.q.reserve(rows * q_width);
  scratch.k.reserve(rows * kv_width);
  scratch.v.reserve(rows * kv_width);
  launch_convert(q, DType::kF32, scratch.q.data(), dtype, rows * q_width, {});
  launch_convert(k, DType::kF32, scratch.k.data(), dtype, rows * kv_width, {});
  launch_convert(v, DType::kF32, scratch.v.data(), dtype, rows * kv_width, {});
  attention_16bit_rounded(scratch.q.data(), scratch.k.data(), scratch.v.data(), n_seqs, seq_len, n_heads,
                          n_kv_heads, head_dim, scale, dtype, query_tile, scratch, out, {}, path);
}

bool attention_16bit_rounded(const uint16_t* q, const uint16_t* k, const uint16_t* v, int64_t n_seqs,
                             int64_t seq_len, int64_t n_heads, int64_t n_kv_heads, int64_t head_dim,
                             float scale, DType dtype, int64_t query_tile, AttentionScratch& scratch,
                             float* out, RoundedOutput out_rounded, AttentionPath path, bool write_fp32) {
  check_attention_shape(n_heads, n_kv_heads, head_dim, dtype, query_tile);
  SYMPRUNE_CHECK(out_rounded.data == nullptr || out_rounded.dtype == dtype,
                 "attention: the output rounded to {} from operands in {}", dtype_name(out_rounded.dtype),
                 dtype_name(dtype));
  SYMPRUNE_CHECK(write_fp32 || out_rounded.data != nullptr, "attention: no output to write");
  if (n_seqs <= 0 || seq_len <= 0) return write_fp32;
  const int64_t rows = n_seqs * seq_len, group = n_heads / n_kv_heads;
  const int64_t q_width = n_heads * head_dim, kv_width = n_kv_heads * head_dim;
  // The flash kernel copies rows 16 bytes at a time (cp.async): its operands must start 16-byte aligned.
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (path != AttentionPath::kGemm && flash_attention_supports(head_dim) && n_seqs <= 65535 &&
      n_heads <= 65535 && aligned(q) && aligned(k) && aligned(v)) {
    const int rows_per_warp = path == AttentionPath::kFlash16   ? 16
                              : path == AttentionPath::kFlash32 ? 32
                                                                : kFlashRowsPerWarp;
    launch_flash_attention_16bit(q, k, v, n_seqs, seq_len, n_heads, n_kv_heads, head_dim, scale, dtype,
                                 write_fp32 ? out : nullptr, static_cast<uint16_t*>(out_rounded.data), {},
                                 rows_per_warp);
    return write_fp32;
  }
  const int64_t tile_cap = std::min(query_tile, seq_len);
  scratch.scores.reserve(n_heads * tile_cap * seq_len);
  scratch.probs.reserve(n_heads * tile_cap * seq_len);
  // With one query head per kv head the heads are one strided batch; with groups, one batch per kv head
  // whose query heads read the same K and V (stride 0).
  const int64_t calls = group == 1 ? 1 : n_kv_heads, batch = group == 1 ? n_heads : group;
  const int64_t kv_stride = group == 1 ? head_dim : 0;
  for (int64_t s = 0; s < n_seqs; ++s) {
    const uint16_t* q_seq = q + s * seq_len * q_width;
    const uint16_t* k_seq = k + s * seq_len * kv_width;
    const uint16_t* v_seq = v + s * seq_len * kv_width;
    for (int64_t t0 = 0; t0 < seq_len; t0 += tile_cap) {
      const int64_t tile = std::min(tile_cap, seq_len - t0), keys = t0 + tile;
      for (int64_t call = 0; call < calls; ++call) {
        const int64_t kv_head = group == 1 ? 0 : call, first_head = kv_head * group;
        // S_h [keys × tile] (column i: query t0 + i over its keys) = scale · K_hᵀ Q_h.
        launch_gemm_strided_batched_16bit(
            keys, tile, head_dim, scale, {k_seq + kv_head * head_dim, kv_width, kv_stride, true},
            {q_seq + t0 * q_width + first_head * head_dim, q_width, head_dim, false}, dtype,
            scratch.scores.data() + first_head * tile * keys, keys, tile * keys, batch, {});
      }
      launch_causal_softmax_16bit(scratch.scores.data(), n_heads, tile, keys, t0, dtype, scratch.probs.data(),
                                  {});
      for (int64_t call = 0; call < calls; ++call) {
        const int64_t kv_head = group == 1 ? 0 : call, first_head = kv_head * group;
        // O_h [head_dim × tile] (column i: query t0 + i, in out's rows) = V_h P_h.
        launch_gemm_strided_batched_16bit(
            head_dim, tile, keys, 1.0f, {v_seq + kv_head * head_dim, kv_width, kv_stride, false},
            {scratch.probs.data() + first_head * tile * keys, keys, tile * keys, false}, dtype,
            out + (s * seq_len + t0) * q_width + first_head * head_dim, q_width, head_dim, batch, {});
      }
    }
  }
  if (out_rounded.data != nullptr)
    launch_convert(out, DType::kF32, out_rounded.data, dtype, rows * q_width, {});
  return true;
}

}  // namespace symprune::cuda
