// A run in lower precision (--dtype bf16/fp16) on the CUDA backend against the CPU (the specification):
//  * storing a tensor in bf16/fp16 rounds as core/dtype.h's convert_from_f32 does, bit for bit, on upload,
//    on copy_rows between dtypes and back to fp32 (exact);
//  * the 16-bit linear equals the CPU's fp32 product of the rounded operands within fp32 reordering
//    (relative 1e-5 of the row's magnitude), and the unrounded fp32 product within the stated NMSE
//    (bf16 1e-4, fp16 2e-6);
//  * scores, masks and masked weights of a bf16 weight are the CPU's on its fp32 values, bit for bit.
//  * stored bytes reach the device unchanged from another thread (the weight prefetch's upload);
//  * the tensor-core attention (16-bit q, k, v and probabilities, fp32 accumulation) is within NMSE 1e-4
//    (bf16) and 2e-6 (fp16) of the fp32 attention, for every kind of query tile;
//  * the backend's rounded copies (an input rounded once for the linears that share it, or by the kernel
//    that wrote it) give bit for bit the results of rounding at every read, through every kind of write;
//    results read only rounded (read_as) are written only so, with the same results for their readers.
// The end-to-end prune in bf16 is in device_pipeline_test.cc.
// Built into the emulated tests (label unit) and into symprune_gpu_tests (label gpu, a real device).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <future>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/kernels/attention_kernels.h"
#include "core/cuda/kernels/cuda_backend.h"
#include "core/cuda/kernels/device_attention.h"
#include "core/dtype.h"
#include "kernel_test_support.h"

namespace symprune::kernel_test {
namespace {

Backend& device() {
  return cuda::cuda_backend();
}

// `host` rounded to `dtype` and back on the host (core/dtype.h).
Tensor rounded(const Tensor& host, DType dtype) {
  std::vector<uint16_t> bits(static_cast<size_t>(host.numel()));
  convert_from_f32(dtype, host.data(), bits.data(), host.numel());
  Tensor out(host.shape());
  convert_to_f32(dtype, bits.data(), out.data(), host.numel());
  return out;
}

void expect_bits_equal(const Tensor& actual, const Tensor& expected, const char* what) {
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  for (int64_t i = 0; i < expected.numel(); ++i)
    ASSERT_EQ(float_to_bits(actual[i]), float_to_bits(expected[i])) << what << " element " << i;
}

double nmse(const Tensor& actual, const Tensor& expected) {
  double error = 0.0, energy = 0.0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    const double e = static_cast<double>(actual[i]) - expected[i];
    error += e * e;
    energy += static_cast<double>(expected[i]) * expected[i];
  }
  return error / energy;
}

class LowPrecisionTest : public KernelTest {};

TEST_F(LowPrecisionTest, StoringRoundsAsTheHostConversion) {
  // Every kind of value: ordinary, halfway cases, tiny (fp16 subnormals and underflow), huge (fp16
  // overflow to infinity), signed zeros and infinities.
  std::vector<float> values = uniform_values(500, 11, -3.0f, 3.0f);
  for (float v : {0.0f, -0.0f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 512, 1e-5f, -3e-7f, 6e-8f, 1e-9f, 65504.0f,
                  65520.0f, -1e6f, 3e38f, INFINITY, -INFINITY})
    values.push_back(v);
  const Tensor host({static_cast<int64_t>(values.size()) / 2, 2}, values);
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor stored = device().to_backend(host, dtype);
    EXPECT_EQ(stored.dtype(), dtype);
    EXPECT_TRUE(stored.on_device());
    expect_bits_equal(device().to_host(stored), rounded(host, dtype), "upload");

    // copy_rows converts either way at row offsets: fp32 rows into a 16-bit tensor round, 16-bit rows into
    // an fp32 tensor widen exactly.
    const Tensor wide = device().to_backend(host);
    Tensor narrow = device().allocate(host.shape(), dtype);
    device().copy_rows(wide, 0, narrow, 0, host.dim(0));
    expect_bits_equal(device().to_host(narrow), rounded(host, dtype), "copy_rows to 16 bits");
    Tensor back = device().allocate({10, 2});
    device().copy_rows(narrow, 100, back, 3, 7);
    const Tensor back_host = device().to_host(back);
    const Tensor expected = rounded(host, dtype);
    for (int64_t r = 0; r < 7; ++r)
      for (int64_t j = 0; j < 2; ++j)
        ASSERT_EQ(float_to_bits(back_host.row(3 + r)[static_cast<size_t>(j)]),
                  float_to_bits(expected.row(100 + r)[static_cast<size_t>(j)]))
            << "row " << r;

    // duplicate keeps the dtype; to_backend of a 16-bit device tensor widens it on the device.
    EXPECT_EQ(device().duplicate(stored).dtype(), dtype);
    const Tensor widened = device().to_backend(stored, DType::kF32);
    EXPECT_EQ(widened.dtype(), DType::kF32);
    expect_bits_equal(device().to_host(widened), rounded(host, dtype), "widened");
  }
  // The CPU stores fp32 only.
  EXPECT_FALSE(cpu_backend().supports_dtype(DType::kBF16));
  EXPECT_TRUE(device().supports_dtype(DType::kF16));
}

TEST_F(LowPrecisionTest, LargeTensorsCrossTheBusInChunks) {
  // 16-bit tensors cross the bus as fp32 through a bounded buffer of 8 Mi values (a checkpoint's hidden
  // states are gigabytes): a whole chunk and a partial one at its offset.
  const int64_t count = (int64_t{8} << 20) + 1001;
  Tensor host({count / 7, 7});
  for (int64_t i = 0; i < host.numel(); ++i)
    host[i] = static_cast<float>((i * 2654435761u) % 100003) / 997.0f - 50.0f;
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor back = device().to_host(device().to_backend(host, dtype));
    const Tensor expected = rounded(host, dtype);
    ASSERT_EQ(back.shape(), expected.shape());
    int64_t differing = 0;
    for (int64_t i = 0; i < expected.numel(); ++i)
      differing += float_to_bits(back[i]) != float_to_bits(expected[i]);
    EXPECT_EQ(differing, 0);
  }
}

TEST_F(LowPrecisionTest, FromStoredUploadsTheStoredBytesFromAnotherThread) {
  // What the weight prefetch does: a background thread uploads a model file's bytes (through the pinned
  // staging buffer, in 64 MiB chunks: this fp32 tensor takes two) while this thread owns the device.
  const int64_t rows = 16400, cols = 1024;
  const Tensor wide({rows, cols}, uniform_values(rows * cols, 21, -2.0f, 2.0f));
  const std::vector<float> small = uniform_values(3000, 22, -2.0f, 2.0f);
  std::vector<uint16_t> narrow(small.size());
  convert_from_f32(DType::kBF16, small.data(), narrow.data(), static_cast<int64_t>(small.size()));
  auto uploads = std::async(std::launch::async, [&] {
    return std::vector<Tensor>{
        device().from_stored({rows, cols}, DType::kF32,
                             std::as_bytes(std::span<const float>(wide.data(), rows * cols))),
        device().from_stored({1000, 3}, DType::kBF16, std::as_bytes(std::span<const uint16_t>(narrow))),
        device().from_stored({0, 5}, DType::kF16, {})};
  });
  const std::vector<Tensor> stored = uploads.get();
  EXPECT_EQ(stored[0].dtype(), DType::kF32);
  EXPECT_TRUE(stored[0].on_device());
  expect_bits_equal(device().to_host(stored[0]), wide, "fp32 upload");
  EXPECT_EQ(stored[1].dtype(), DType::kBF16);
  expect_bits_equal(device().to_host(stored[1]), rounded(Tensor({1000, 3}, small), DType::kBF16),
                    "bf16 upload");
  EXPECT_EQ(stored[2].shape(), (std::vector<int64_t>{0, 5}));
  EXPECT_EQ(stored[2].dtype(), DType::kF16);
}

TEST_F(LowPrecisionTest, AttentionOnTensorCoresIsNearTheFp32Attention) {
  // Query tiles of every kind: one tile, several with a partial last one, one query each; grouped and
  // plain heads; through the backend (its own tile) and directly. Heads of 16, 32, 64 and 128 take the
  // flash kernel (the tile is then unused): sequences of several blocks of 64 or 128 queries and tiles of
  // 64 or 32 keys with partial last ones (150, 130, 200), exactly one (64), two stages in turn (200); heads
  // of 8 and 144 take the GEMM path. The cases with a tile and a flash head size run every path directly.
  const struct {
    int64_t n_seqs, seq_len, n_heads, n_kv_heads, head_dim, tile;
  } cases[] = {{2, 37, 4, 2, 16, 37},  {2, 37, 4, 2, 16, 16},   {1, 21, 2, 2, 64, 5},  {1, 9, 3, 1, 32, 1},
               {1, 1, 1, 1, 8, 1},     {2, 30, 2, 2, 128, 0},   {1, 150, 4, 2, 64, 0}, {2, 130, 2, 1, 128, 0},
               {1, 64, 2, 2, 16, 0},   {1, 19, 2, 1, 144, 0},   {1, 40, 2, 2, 144, 8}, {1, 200, 2, 2, 32, 0},
               {1, 150, 4, 2, 64, 64}, {2, 130, 2, 1, 128, 64}, {1, 200, 2, 2, 32, 64}};
  uint32_t seed = 60;
  for (const auto& c : cases) {
    const AttentionCase a = attention_case(c.n_seqs, c.seq_len, c.n_heads, c.n_kv_heads, c.head_dim, seed);
    seed += 3;
    for (DType dtype : {DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " T=" + std::to_string(c.seq_len) + " heads " +
                   std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " tile " +
                   std::to_string(c.tile));
      const Tensor dq = device().to_backend(a.q), dk = device().to_backend(a.k),
                   dv = device().to_backend(a.v);
      Tensor out;
      if (c.tile == 0) {
        device().attention(dq, dk, dv, a.batch, c.n_heads, c.n_kv_heads, a.scale, out, dtype);
      } else {
        out = device().allocate(a.expected.shape());
        cuda::AttentionScratch scratch;
        cuda::attention_16bit(dq.device_data(), dk.device_data(), dv.device_data(), c.n_seqs, c.seq_len,
                              c.n_heads, c.n_kv_heads, c.head_dim, a.scale, dtype, c.tile, scratch,
                              out.device_data());
      }
      const Tensor actual = device().to_host(out);
      ASSERT_EQ(actual.shape(), a.expected.shape());
      const double error = nmse(actual, a.expected);
      EXPECT_LT(error, dtype == DType::kBF16 ? 1e-4 : 2e-6);
      EXPECT_GT(error, 0.0) << "the operands were rounded";
      if (c.tile > 0 && cuda::flash_attention_supports(c.head_dim)) {
        // Every path on the same input: the GEMM path and both flash variants.
        for (const auto path :
             {cuda::AttentionPath::kGemm, cuda::AttentionPath::kFlash16, cuda::AttentionPath::kFlash32}) {
          SCOPED_TRACE("path " + std::to_string(static_cast<int>(path)));
          Tensor path_out = device().allocate(a.expected.shape());
          cuda::AttentionScratch scratch;
          cuda::attention_16bit(dq.device_data(), dk.device_data(), dv.device_data(), c.n_seqs, c.seq_len,
                                c.n_heads, c.n_kv_heads, c.head_dim, a.scale, dtype, c.tile, scratch,
                                path_out.device_data(), path);
          const double path_error = nmse(device().to_host(path_out), a.expected);
          EXPECT_LT(path_error, dtype == DType::kBF16 ? 1e-4 : 2e-6);
          EXPECT_GT(path_error, 0.0);
        }
      }
    }
  }
  // Tiles: the most queries whose scores and probabilities fit, multiples of 16, within [1, T].
  EXPECT_EQ(cuda::attention_query_tile(32, 2048, kAttentionTileBytes), 672);  // 7B: 256 MiB / (32·2048·6)
  EXPECT_EQ(cuda::attention_query_tile(64, 4096, kAttentionTileBytes), 160);  // 70B at T = 4096
  EXPECT_EQ(cuda::attention_query_tile(4, 37, kAttentionTileBytes), 37);
  EXPECT_EQ(cuda::attention_query_tile(64, 4096, 1000), 1);
  EXPECT_THAT(error_of([] {
                cuda::AttentionScratch scratch;
                cuda::attention_16bit(nullptr, nullptr, nullptr, 1, 4, 2, 2, 320, 1.0f, DType::kBF16, 4,
                                      scratch, nullptr);
              }),
              ::testing::HasSubstr("head_dim 320 (at most 256)"));
}

TEST_F(LowPrecisionTest, LinearMultipliesTheRoundedOperandsAccumulatingInFp32) {
  const int64_t rows = 37, n = 96, m = 40;
  const Tensor x({rows, n}, uniform_values(rows * n, 21));
  const Tensor w({m, n}, uniform_values(m * n, 22, -0.2f, 0.2f));
  const Tensor bias({m}, uniform_values(m, 23));
  Tensor exact;
  cpu_backend().linear(x, w, &bias, exact);
  struct Bound {
    DType dtype;
    double nmse;
  };
  for (const Bound& b : {Bound{DType::kBF16, 1e-4}, Bound{DType::kF16, 2e-6}}) {
    SCOPED_TRACE(dtype_name(b.dtype));
    const Tensor dx = device().to_backend(x), dw = device().to_backend(w, b.dtype),
                 dbias = device().to_backend(bias);
    Tensor dy;
    device().linear(dx, dw, &dbias, dy);
    EXPECT_EQ(dy.dtype(), DType::kF32);
    const Tensor y = device().to_host(dy);
    // The same products as the CPU's fp32 product of the rounded operands (exact in fp32), summed in
    // another order.
    Tensor of_rounded;
    cpu_backend().linear(rounded(x, b.dtype), rounded(w, b.dtype), &bias, of_rounded);
    for (int64_t r = 0; r < rows; ++r) {
      double magnitude = 0.0;
      for (int64_t k = 0; k < n; ++k) magnitude += std::fabs(x.row(r)[static_cast<size_t>(k)]) * 0.2;
      for (int64_t j = 0; j < m; ++j)
        ASSERT_NEAR(y.row(r)[static_cast<size_t>(j)], of_rounded.row(r)[static_cast<size_t>(j)],
                    1e-5 * (magnitude + 1.0))
            << "row " << r << " column " << j;
    }
    const double error = nmse(y, exact);
    EXPECT_LT(error, b.nmse);
    EXPECT_GT(error, 0.0);  // it did round
  }
}

TEST_F(LowPrecisionTest, RoundedCopiesGiveTheResultsOfRoundingAtEveryRead) {
  // A linear of `t` against the same linear of a fresh device copy of t's values (a storage never read
  // rounded, so rounded at this read): equal bit for bit after every kind of write to t.
  const int64_t rows = 24, n = 32, m = 16, heads = 2;
  Backend& be = device();
  const Tensor w_bf16 = be.to_backend(Tensor({m, n}, uniform_values(m * n, 71, -0.2f, 0.2f)), DType::kBF16);
  const Tensor w_fp16 = be.to_backend(Tensor({m, n}, uniform_values(m * n, 72, -0.2f, 0.2f)), DType::kF16);
  const Tensor x = be.to_backend(Tensor({rows, n}, uniform_values(rows * n, 73)));
  const Tensor other = be.to_backend(Tensor({rows, n}, uniform_values(rows * n, 74)));
  const Tensor norm_weight = be.to_backend(Tensor({n}, uniform_values(n, 75, 0.5f, 1.5f)));
  const SequenceBatch batch{2, rows / 2};
  int checks = 0;
  const auto expect_fresh = [&](const Tensor& t, const Tensor& w, const char* what) {
    SCOPED_TRACE(what);
    Tensor y, y_fresh;
    be.linear(t, w, nullptr, y);
    const Tensor fresh = be.to_backend(be.to_host(t));
    be.linear(fresh, w, nullptr, y_fresh);
    expect_bits_equal(be.to_host(y), be.to_host(y_fresh), what);
    ++checks;
  };
  Tensor h;
  be.rms_norm(x, norm_weight, 1e-5f, h);
  expect_fresh(h, w_bf16, "the first read rounds");
  expect_fresh(h, w_bf16, "the next read takes the copy");
  be.rms_norm(other, norm_weight, 1e-5f, h);
  expect_fresh(h, w_bf16, "rms_norm wrote the copy");
  be.add(h, other);
  expect_fresh(h, w_bf16, "add in place: stale");
  be.copy_rows(x, 3, h, 5, 4);
  expect_fresh(h, w_bf16, "copy_rows into it: stale");
  be.relu(h);
  expect_fresh(h, w_bf16, "relu in place: stale");
  be.rope(h, batch, heads, rope_inv_freq(n / heads, 10000.0, {}));
  expect_fresh(h, w_bf16, "RoPE in place wrote the copy");
  be.silu_mul(x, other, h);
  expect_fresh(h, w_bf16, "silu_mul wrote the copy");
  expect_fresh(h, w_fp16, "a copy of another dtype");
  be.rms_norm(x, norm_weight, 1e-5f, h);
  expect_fresh(h, w_fp16, "rms_norm wrote the fp16 copy");
  expect_fresh(h, w_bf16, "and bf16 again");
  // The attention's output, by the flash kernel (heads of 16) and by the GEMM path (heads of 8).
  for (const int64_t attention_heads : {heads, 2 * heads}) {
    Tensor out;
    be.attention(x, other, h, batch, attention_heads, attention_heads, 0.25f, out, DType::kBF16);
    expect_fresh(out, w_bf16, "the attention's output: first read");
    be.attention(other, x, h, batch, attention_heads, attention_heads, 0.25f, out, DType::kBF16);
    expect_fresh(out, w_bf16, "the attention wrote the copy");
    be.attention(other, h, x, batch, attention_heads, attention_heads, 0.25f, out, DType::kF16);
    expect_fresh(out, w_bf16, "an fp16 attention: stale");
  }
  // Outputs into an input's own memory: a linear into its input, an attention into its v.
  const Tensor w_square = be.to_backend(Tensor({n, n}, uniform_values(n * n, 76, -0.2f, 0.2f)), DType::kBF16);
  be.linear(h, w_square, nullptr, h);
  expect_fresh(h, w_bf16, "a linear into its own input");
  be.attention(x, other, h, batch, heads, heads, 0.25f, h, DType::kBF16);
  expect_fresh(h, w_bf16, "an attention into its own v");
  EXPECT_EQ(checks, 19);
}

// An fp32 device tensor's own memory, read past the backend (which refuses it after a rounded-only write).
std::vector<float> raw_fp32(const Tensor& t) {
  std::vector<float> values(static_cast<size_t>(t.numel()));
  cuda::copy_to_host(values.data(), t.device_bytes(), values.size() * sizeof(float));
  return values;
}

TEST_F(LowPrecisionTest, ResultsReadOnlyRoundedKeepTheRoundedValuesAlone) {
  // Each op that can (rms_norm, RoPE, silu_mul, the flash attention's output) given read_as bf16/fp16 writes
  // only the rounded copy: its reader (a linear of that dtype, the attention) gives bit for bit what the
  // fp32 write gives, and the fp32 memory keeps the sentinel it held (the pass that is saved). The GEMM
  // attention path computes in its output's memory, so there the fp32 values stay readable.
  const int64_t rows = 24, n = 32, m = 16, heads = 2;
  Backend& be = device();
  const SequenceBatch batch{2, rows / 2};
  const Tensor x = be.to_backend(Tensor({rows, n}, uniform_values(rows * n, 81)));
  const Tensor other = be.to_backend(Tensor({rows, n}, uniform_values(rows * n, 82)));
  const Tensor norm_weight = be.to_backend(Tensor({n}, uniform_values(n, 83, 0.5f, 1.5f)));
  const std::vector<float> sentinel(static_cast<size_t>(rows * n), 12345.0f);
  const std::vector<float> inv_freq = rope_inv_freq(n / heads, 10000.0, {});
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor w = be.to_backend(Tensor({m, n}, uniform_values(m * n, 84, -0.2f, 0.2f)), dtype);
    const auto product = [&](const Tensor& t) {
      Tensor y;
      be.linear(t, w, nullptr, y);
      return be.to_host(y);
    };
    // `write(t, read_as)` rewrites t; `kept`: whether the rounded-only write left the sentinel.
    const auto check = [&](const char* what, const std::function<void(Tensor&, DType)>& write, bool kept) {
      SCOPED_TRACE(what);
      Tensor full = be.to_backend(Tensor({rows, n}, sentinel));
      Tensor only = be.to_backend(Tensor({rows, n}, sentinel));
      write(full, DType::kF32);
      write(only, dtype);
      expect_bits_equal(product(only), product(full), "a linear of the result");
      if (kept) {
        EXPECT_EQ(raw_fp32(only), sentinel) << "the fp32 values were written";
      } else {
        expect_bits_equal(be.to_host(only), be.to_host(full), "the fp32 values");
      }
      return only;
    };
    Tensor normed = check(
        "rms_norm", [&](Tensor& t, DType read_as) { be.rms_norm(x, norm_weight, 1e-5f, t, read_as); }, true);
    check(
        "silu_mul", [&](Tensor& t, DType read_as) { be.silu_mul(x, other, t, read_as); }, true);
    check(
        "flash attention",
        [&](Tensor& t, DType read_as) {
          be.attention(x, other, x, batch, heads, heads, 0.25f, t, dtype, read_as);
        },
        true);
    check(
        "GEMM-path attention",
        [&](Tensor& t, DType read_as) {
          be.attention(x, other, x, batch, 2 * heads, 2 * heads, 0.25f, t, dtype, read_as);
        },
        false);
    // RoPE in place keeps the unrotated fp32 values; the attention reads the rotated ones rounded.
    for (const bool flash : {true, false}) {
      SCOPED_TRACE(flash ? "RoPE, then the flash attention" : "RoPE, then the GEMM-path attention");
      const int64_t attention_heads = flash ? heads : 2 * heads;
      Tensor q_full = be.duplicate(x), k_full = be.duplicate(other);
      Tensor q_only = be.duplicate(x), k_only = be.duplicate(other);
      be.rope(q_full, batch, heads, inv_freq);
      be.rope(k_full, batch, heads, inv_freq);
      be.rope(q_only, batch, heads, inv_freq, dtype);
      be.rope(k_only, batch, heads, inv_freq, dtype);
      const Tensor x_host = be.to_host(x);
      EXPECT_EQ(raw_fp32(q_only), std::vector<float>(x_host.values().begin(), x_host.values().end()));
      Tensor out_full, out_only;
      be.attention(q_full, k_full, x, batch, attention_heads, attention_heads, 0.25f, out_full, dtype);
      be.attention(q_only, k_only, x, batch, attention_heads, attention_heads, 0.25f, out_only, dtype);
      expect_bits_equal(be.to_host(out_only), be.to_host(out_full), "the attention of the rotated q, k");
    }
    // A full write makes the fp32 values current again.
    be.rms_norm(x, norm_weight, 1e-5f, normed);
    Tensor expected;
    be.rms_norm(x, norm_weight, 1e-5f, expected);
    expect_bits_equal(be.to_host(normed), be.to_host(expected), "rewritten in fp32");
  }
  if (!emulated_device()) return;  // death tests fork, which a CUDA context does not survive
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Tensor only;
  be.rms_norm(x, norm_weight, 1e-5f, only, DType::kBF16);
  EXPECT_DEATH(be.to_host(only), "written rounded to BF16 only");
  const Tensor w_fp16 = be.to_backend(Tensor({m, n}, uniform_values(m * n, 85, -0.2f, 0.2f)), DType::kF16);
  Tensor y;
  EXPECT_DEATH(be.linear(only, w_fp16, nullptr, y), "written rounded to BF16 only");
  EXPECT_DEATH(be.add(only, x), "written rounded to BF16 only");
}

TEST_F(LowPrecisionTest, FusedResidualStepsEqualTheOpsTheyJoin) {
  // add_rms_norm is add then rms_norm, copy_rows_rms_norm copy_rows then rms_norm, and add_into_rows add then
  // copy_rows, bit for bit: on the vector path (widths 64 and 3076, whose threads take several groups of four
  // each) and the scalar one (37 and 773), from and into fp32, bf16 and fp16 rows at an offset, in place.
  Backend& be = device();
  for (const int64_t width : {64, 37, 3076, 773}) {
    SCOPED_TRACE("width " + std::to_string(width));
    const int64_t rows = 10, dst_rows = 16, dst_row = 3;
    const Tensor x_host({rows, width}, uniform_values(rows * width, 91));
    const Tensor residual_host({rows, width}, uniform_values(rows * width, 92));
    const Tensor weight = be.to_backend(Tensor({width}, uniform_values(width, 93, 0.5f, 1.5f)));
    const Tensor residual = be.to_backend(residual_host);

    Tensor x_ops = be.to_backend(x_host), y_ops;
    be.add(x_ops, residual);
    be.rms_norm(x_ops, weight, 1e-5f, y_ops);
    Tensor x_fused = be.to_backend(x_host), y_fused;
    be.add_rms_norm(x_fused, residual, weight, 1e-5f, y_fused);
    expect_bits_equal(be.to_host(x_fused), be.to_host(x_ops), "add_rms_norm's x");
    expect_bits_equal(be.to_host(y_fused), be.to_host(y_ops), "add_rms_norm's y");
    Tensor x_rounded_only = be.to_backend(x_host), y_rounded_only;
    be.add_rms_norm(x_rounded_only, residual, weight, 1e-5f, y_rounded_only, DType::kBF16);
    expect_bits_equal(be.to_host(x_rounded_only), be.to_host(x_ops), "add_rms_norm's x, y read as bf16");
    const Tensor w =
        be.to_backend(Tensor({8, width}, uniform_values(8 * width, 94, -0.2f, 0.2f)), DType::kBF16);
    Tensor product_ops, product_fused;
    be.linear(y_ops, w, nullptr, product_ops);
    be.linear(y_rounded_only, w, nullptr, product_fused);
    expect_bits_equal(be.to_host(product_fused), be.to_host(product_ops), "a linear of y read as bf16");

    Tensor sum_host = x_host;
    for (int64_t i = 0; i < sum_host.numel(); ++i) sum_host[i] += residual_host[i];
    const Tensor sentinel({dst_rows, width}, uniform_values(dst_rows * width, 95));
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(std::string("copy_rows_rms_norm from ") + std::string(dtype_name(dtype)));
      const Tensor stored = be.to_backend(sentinel, dtype);
      Tensor x_copied = be.allocate({rows, width}), y_copied;
      be.copy_rows(stored, dst_row, x_copied, 0, rows);
      be.rms_norm(x_copied, weight, 1e-5f, y_copied);
      Tensor x_widened = be.allocate({rows, width}), y_widened;
      be.copy_rows_rms_norm(stored, dst_row, x_widened, weight, 1e-5f, y_widened);
      expect_bits_equal(be.to_host(x_widened), be.to_host(x_copied), "its x");
      expect_bits_equal(be.to_host(y_widened), be.to_host(y_copied), "its y");
      Tensor y_rounded, from_rounded, from_copied;
      be.copy_rows_rms_norm(stored, dst_row, x_widened, weight, 1e-5f, y_rounded, DType::kBF16);
      be.linear(y_rounded, w, nullptr, from_rounded);
      be.linear(y_copied, w, nullptr, from_copied);
      expect_bits_equal(be.to_host(from_rounded), be.to_host(from_copied), "a linear of y read as bf16");
    }
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(dtype_name(dtype));
      const Tensor x = be.to_backend(x_host);
      Tensor dst = be.to_backend(sentinel, dtype);
      be.add_into_rows(x, residual, dst, dst_row);
      Tensor expected = be.to_host(be.to_backend(sentinel, dtype));
      const Tensor sum_rounded = dtype == DType::kF32 ? sum_host : rounded(sum_host, dtype);
      std::copy(sum_rounded.values().begin(), sum_rounded.values().end(),
                expected.values().begin() + dst_row * width);
      expect_bits_equal(be.to_host(dst), expected, "add_into_rows at an offset");
      expect_bits_equal(be.to_host(x), x_host, "its x, unchanged");
    }
    Tensor in_place = be.to_backend(x_host);
    be.add_into_rows(in_place, residual, in_place, 0);
    expect_bits_equal(be.to_host(in_place), sum_host, "add_into_rows in place");
    // The CPU backend's, the specification's, are the same sums.
    Tensor cpu_dst = sentinel;
    cpu_backend().add_into_rows(x_host, residual_host, cpu_dst, dst_row);
    Tensor expected = sentinel;
    std::copy(sum_host.values().begin(), sum_host.values().end(),
              expected.values().begin() + dst_row * width);
    expect_bits_equal(cpu_dst, expected, "the CPU's add_into_rows");
  }
}

// Backend::first_non_finite on a device tensor of each dtype: the first NaN or ±Inf in row-major order and
// its value, as the CPU finds it on the same (rounded) values; nothing for a finite tensor.
TEST_F(LowPrecisionTest, FirstNonFiniteEntryIsTheCpusInEveryDtype) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor finite({37, 29}, uniform_values(37 * 29, 11, -0.2f, 0.2f));
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    EXPECT_FALSE(device().first_non_finite(device().to_backend(finite, dtype)).has_value())
        << dtype_name(dtype);
    for (const auto& [index, value] :
         std::vector<std::pair<int64_t, float>>{{0, nan}, {500, -inf}, {1072, inf}}) {
      Tensor poisoned = finite;
      poisoned[1072] = nan;  // the last entry: a later one is not the first
      poisoned[index] = value;
      const auto found = device().first_non_finite(device().to_backend(poisoned, dtype));
      const auto expected = cpu_backend().first_non_finite(poisoned);
      ASSERT_TRUE(found.has_value() && expected.has_value()) << dtype_name(dtype);
      EXPECT_EQ(found->index, index) << dtype_name(dtype);
      EXPECT_EQ(found->index, expected->index) << dtype_name(dtype);
      EXPECT_EQ(std::isnan(found->value), std::isnan(value)) << dtype_name(dtype);
      if (!std::isnan(value)) EXPECT_EQ(found->value, value) << dtype_name(dtype);
    }
  }
  EXPECT_FALSE(cpu_backend().first_non_finite(finite).has_value());
}

TEST_F(LowPrecisionTest, ScoresMasksAndMaskedWeightsOfA16BitWeightAreThoseOfItsValues) {
  const int64_t m = 16, n = 64;
  const Tensor w({m, n}, uniform_values(m * n, 31));
  const Tensor input({3 * 4, n}, uniform_values(3 * 4 * n, 32));
  const ActivationStats stats = cpu_backend().activation_stats(input, nullptr, nullptr, 3, 4);
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor dw = device().to_backend(w, dtype);
    const Tensor values = rounded(w, dtype);
    struct Case {
      ScoreMethod method;
      MaskSpec spec;
    };
    for (const Case& c :
         {Case{ScoreMethod::kWanda, MaskSpec::row(0.5)}, Case{ScoreMethod::kRIA, MaskSpec::nm(2, 4)},
          Case{ScoreMethod::kMagnitude, MaskSpec::layer(0.3)}}) {
      ScoreOptions options;
      options.row_begin = 2;
      options.row_end = 13;
      const Mask expected =
          cpu_backend().score_and_select(c.method, values, &stats, options, c.spec, nullptr);
      const Mask actual = device().score_and_select(c.method, dw, &stats, options, c.spec, nullptr);
      ASSERT_EQ(std::vector<uint8_t>(actual.flat().begin(), actual.flat().end()),
                std::vector<uint8_t>(expected.flat().begin(), expected.flat().end()))
          << score_method_name(c.method);
    }
    const Mask mask = cpu_backend().score_and_select(ScoreMethod::kWanda, values, &stats, ScoreOptions{},
                                                     MaskSpec::row(0.5), nullptr);
    for (MaskedPart part : {MaskedPart::kKept, MaskedPart::kPruned}) {
      const Tensor masked = device().mask_weight(dw, mask, part);
      EXPECT_EQ(masked.dtype(), dtype);
      expect_bits_equal(device().to_host(masked), cpu_backend().mask_weight(values, mask, part), "masked");
    }
  }
}

}  // namespace
}  // namespace symprune::kernel_test
