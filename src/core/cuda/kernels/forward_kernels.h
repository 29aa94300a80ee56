#pragma once
// Host-only header: the forward-pass ops of core::Backend (core/backend.h) on DEVICE pointers, fp32. Each
// matches the CPU backend: bit for bit where the CPU's arithmetic is order-free (relu, add, embedding,
// positions, RoPE from the same tables), within stated tolerances where the CPU reduces in another order
// or calls libm (norms, SiLU, attention); tests/kernels/forward_kernels_test.cc states them.
#include <cstdint>

#include "core/cuda/device_memory.h"
#include "core/dtype.h"

namespace symprune::cuda {

// Where a kernel also writes its fp32 output rounded to a 16-bit dtype (bf16 or fp16), in the same pass:
// for a run in lower precision, whose next op reads that output rounded (cuda_backend.cc's rounded
// copies). `data` null: no rounded copy.
struct RoundedOutput {
  void* data = nullptr;
  DType dtype = DType::kBF16;
};

// y = x / sqrt(mean(x²) + eps) · weight per row of width d (sums in fp64, as the CPU). y may be null when
// `rounded` is given: the rounded result only (the same for silu_mul's out).
void launch_rms_norm(const float* x, const float* weight, int64_t rows, int64_t d, float eps, float* y,
                     DeviceStream stream, RoundedOutput rounded = {});
// x += residual, then y = rms_norm(x), in one pass: x and y bit for bit those of launch_add and
// launch_rms_norm in turn. y shares no memory with x or residual.
void launch_add_rms_norm(float* x, const float* residual, const float* weight, int64_t rows, int64_t d,
                         float eps, float* y, DeviceStream stream, RoundedOutput rounded = {});
// x = source (rows × d elements of source_dtype) widened to fp32, then y = rms_norm(x), in one pass: x and y
// bit for bit those of launch_convert and launch_rms_norm in turn. y shares no memory with x or source.
void launch_widen_rms_norm(const void* source, DType source_dtype, float* x, const float* weight,
                           int64_t rows, int64_t d, float eps, float* y, DeviceStream stream,
                           RoundedOutput rounded = {});
// y = (x − mean) / sqrt(var + eps) (· weight) (+ bias) per row; weight / bias may be null.
void launch_layer_norm(const float* x, const float* weight, const float* bias, int64_t rows, int64_t d,
                       float eps, float* y, DeviceStream stream);
// In-place rotate-half RoPE on x [rows, n_heads · 2·half]; row r has position r % seq_len; cos/sin are
// core::rope_tables' [seq_len, half] tables on the device. write_fp32 false (`rounded` given): x keeps its
// values and the rotated ones go to the rounded copy only.
void launch_rope(float* x, int64_t rows, int64_t seq_len, int64_t n_heads, int64_t half,
                 const float* cos_table, const float* sin_table, DeviceStream stream,
                 RoundedOutput rounded = {}, bool write_fp32 = true);
// out = silu(gate) · up; x = max(x, 0); x += y (count elements each). rms_norm, RoPE and silu_mul may
// also write their result rounded (RoundedOutput).
void launch_silu_mul(const float* gate, const float* up, int64_t count, float* out, DeviceStream stream,
                     RoundedOutput rounded = {});
void launch_relu(float* x, int64_t count, DeviceStream stream);
void launch_add(float* x, const float* y, int64_t count, DeviceStream stream);
// out = x + y in out_dtype (fp32, or rounded to bf16/fp16 as launch_convert rounds); out may be x (fp32).
void launch_add_into(const float* x, const float* y, int64_t count, void* out, DType out_dtype,
                     DeviceStream stream);
// out[i, :] = table[ids[i], :] (ids on the device, checked by the caller); out is [count, d].
void launch_embedding(const float* table, const int32_t* ids, int64_t count, int64_t d, float* out,
                      DeviceStream stream);
// x[r, :] += table[row_offset + r % seq_len, :] (OPT's learned positions).
void launch_add_position_rows(float* x, const float* table, int64_t rows, int64_t seq_len, int64_t row_offset,
                              int64_t d, DeviceStream stream);
// Causal grouped-query attention per sequence, flash-style: K/V tiles in shared memory and an online
// softmax, so memory stays O(rows · width) at any length (no T × T buffer). q [n_seqs·T, n_heads·hd],
// k/v [n_seqs·T, n_kv_heads·hd], out like q; hd ≤ 256. Launched seqs_per_launch sequences at a time (the
// grid's z; 65535 is CUDA's limit, tests pass fewer to cover the split).
void launch_attention(const float* q, const float* k, const float* v, int64_t n_seqs, int64_t seq_len,
                      int64_t n_heads, int64_t n_kv_heads, int64_t head_dim, float scale, float* out,
                      DeviceStream stream, int64_t seqs_per_launch = 65535);

}  // namespace symprune::cuda
