// The forward-pass kernels against the CPU backend (core/backend.h). Bit-identical: relu, add,
// embedding, OPT positions and RoPE (same tables, no contractions), and the 16-bit copies RoPE, RMSNorm and
// SiLU·up write beside their outputs (their outputs rounded), on the vector paths and the scalar ones. Within
// tolerance, since the CPU sums in another order or its libm differs from CUDA's: RMSNorm / LayerNorm 2e-6
// relative to the row's largest output, SiLU·up 1e-6 relative, attention 2e-6 absolute on O(1) values, the
// tiled linear 1e-5 relative to the largest output (fp32 sums in another order than OpenBLAS), the row NLL
// 1e-12 relative to an fp64 sequential reference.
#include "core/cuda/kernels/forward_kernels.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <optional>

#include "core/backend.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/kernels/gemm_kernels.h"
#include "core/cuda/kernels/loss_kernels.h"
#include "kernel_test_support.h"

namespace symprune::kernel_test {
namespace {

using cuda::DeviceArray;

DeviceArray<float> on_device(const Tensor& t) {
  return DeviceArray<float>(t.data(), t.numel());
}

Tensor from_device(const DeviceArray<float>& d, std::vector<int64_t> shape) {
  return Tensor(std::move(shape), d.download());
}

void expect_bitwise_equal(const Tensor& actual, const Tensor& expected, const std::string& what) {
  ASSERT_EQ(actual.numel(), expected.numel()) << what;
  for (int64_t i = 0; i < expected.numel(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(actual[i]), std::bit_cast<uint32_t>(expected[i]))
        << what << " element " << i << ": " << actual[i] << " vs " << expected[i];
}

// The 16-bit copy a kernel wrote beside its fp32 output (RoundedOutput) is that output rounded, bit for bit.
void expect_rounded_copy(const DeviceArray<float>& output, const DeviceArray<uint16_t>& rounded, DType dtype,
                         const std::string& what) {
  const std::vector<float> values = output.download();
  const std::vector<uint16_t> bits = rounded.download();
  std::vector<uint16_t> expected(values.size());
  convert_from_f32(dtype, values.data(), expected.data(), static_cast<int64_t>(values.size()));
  ASSERT_EQ(bits.size(), expected.size()) << what;
  for (size_t i = 0; i < expected.size(); ++i) ASSERT_EQ(bits[i], expected[i]) << what << " element " << i;
}

// max |a − e| over the tensor, against `tolerance` × (1 or the largest |e|, as `relative` says).
void expect_close(const Tensor& actual, const Tensor& expected, double tolerance, bool relative,
                  const std::string& what) {
  ASSERT_EQ(actual.numel(), expected.numel()) << what;
  double max_error = 0.0, scale = 0.0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    max_error = std::max(max_error, std::fabs(static_cast<double>(actual[i]) - expected[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(expected[i])));
  }
  EXPECT_LE(max_error, tolerance * (relative ? std::max(scale, 1e-30) : 1.0)) << what;
}

TEST_F(KernelTest, ElementwiseOpsEqualTheCpuBitForBit) {
  // 37 x 301: the vector kernels' groups of four and a last element on its own.
  const int64_t rows = 37, d = 301;
  const Tensor a({rows, d}, uniform_values(rows * d, 1, -3.0f, 3.0f));
  const Tensor b({rows, d}, uniform_values(rows * d, 2, -3.0f, 3.0f));
  {
    Tensor expected = a;
    cpu_backend().relu(expected);
    DeviceArray<float> x = on_device(a);
    cuda::launch_relu(x.data(), x.size(), {});
    expect_bitwise_equal(from_device(x, {rows, d}), expected, "relu");
  }
  {
    Tensor expected = a;
    cpu_backend().add(expected, b);
    DeviceArray<float> x = on_device(a);
    const DeviceArray<float> y = on_device(b);
    cuda::launch_add(x.data(), y.data(), x.size(), {});
    expect_bitwise_equal(from_device(x, {rows, d}), expected, "add");
  }
  {
    const Tensor table({50, d}, uniform_values(50 * d, 3));
    const std::vector<int32_t> ids = {0, 49, 7, 7, 12, 3, 0};
    Tensor expected;
    cpu_backend().embedding(table, ids, expected);
    const DeviceArray<float> dt = on_device(table);
    const DeviceArray<int32_t> dids(ids);
    DeviceArray<float> out(static_cast<int64_t>(ids.size()) * d);
    cuda::launch_embedding(dt.data(), dids.data(), static_cast<int64_t>(ids.size()), d, out.data(), {});
    expect_bitwise_equal(from_device(out, {7, d}), expected, "embedding");
  }
  {
    const Tensor table({20, d}, uniform_values(20 * d, 4));
    const SequenceBatch batch{3, 5};
    const Tensor x0({15, d}, uniform_values(15 * d, 5));
    Tensor expected = x0;
    cpu_backend().add_position_rows(expected, table, batch, 2);
    DeviceArray<float> x = on_device(x0);
    const DeviceArray<float> dt = on_device(table);
    cuda::launch_add_position_rows(x.data(), dt.data(), 15, 5, 2, d, {});
    expect_bitwise_equal(from_device(x, {15, d}), expected, "add_position_rows");
  }
}

TEST_F(KernelTest, RopeEqualsTheCpuBitForBit) {
  for (const auto& scaling :
       {std::optional<Llama3RopeScaling>(), std::optional<Llama3RopeScaling>(Llama3RopeScaling{})}) {
    for (const int64_t head_dim : {64, 10}) {  // four frequencies at a time (float4), or one (5 of them)
      const int64_t n_heads = 3;
      const SequenceBatch batch{2, 41};
      const std::vector<float> inv_freq = rope_inv_freq(head_dim, 500000.0, scaling);
      const Tensor x0({batch.rows(), n_heads * head_dim},
                      uniform_values(batch.rows() * n_heads * head_dim, 6));
      Tensor expected = x0;
      cpu_backend().rope(expected, batch, n_heads, inv_freq);
      const RopeTables tables = rope_tables(inv_freq, batch.seq_len);
      DeviceArray<float> x = on_device(x0);
      const DeviceArray<float> c(tables.cos), s(tables.sin);
      DeviceArray<uint16_t> rounded(x0.numel());
      cuda::launch_rope(x.data(), batch.rows(), batch.seq_len, n_heads, head_dim / 2, c.data(), s.data(), {},
                        {rounded.data(), DType::kBF16});
      expect_bitwise_equal(from_device(x, x0.shape()), expected, scaling ? "rope llama3" : "rope");
      expect_rounded_copy(x, rounded, DType::kBF16, "rope's bf16 copy, head_dim " + std::to_string(head_dim));
    }
  }
}

TEST_F(KernelTest, NormsAndSiluMatchTheCpu) {
  for (const int64_t d : {1, 64, 257, 1000}) {
    const int64_t rows = 9;
    const Tensor x({rows, d}, uniform_values(rows * d, static_cast<uint32_t>(d), -4.0f, 6.0f));
    const Tensor w({d}, uniform_values(d, 7, 0.5f, 1.5f));
    const Tensor bias({d}, uniform_values(d, 8));
    const DeviceArray<float> dx = on_device(x), dw = on_device(w), db = on_device(bias);
    DeviceArray<float> y(rows * d);
    Tensor expected;
    cpu_backend().rms_norm(x, w, 1e-5f, expected);
    DeviceArray<uint16_t> rounded(rows * d);
    cuda::launch_rms_norm(dx.data(), dw.data(), rows, d, 1e-5f, y.data(), {}, {rounded.data(), DType::kF16});
    expect_close(from_device(y, {rows, d}), expected, 2e-6, true, "rms_norm d=" + std::to_string(d));
    expect_rounded_copy(y, rounded, DType::kF16, "rms_norm's fp16 copy, d=" + std::to_string(d));
    cpu_backend().layer_norm(x, &w, &bias, 1e-5f, expected);
    cuda::launch_layer_norm(dx.data(), dw.data(), db.data(), rows, d, 1e-5f, y.data(), {});
    expect_close(from_device(y, {rows, d}), expected, 2e-6, true, "layer_norm d=" + std::to_string(d));
    cpu_backend().layer_norm(x, nullptr, nullptr, 1e-5f, expected);
    cuda::launch_layer_norm(dx.data(), nullptr, nullptr, rows, d, 1e-5f, y.data(), {});
    expect_close(from_device(y, {rows, d}), expected, 2e-6, true, "layer_norm plain d=" + std::to_string(d));
    const Tensor up({rows, d}, uniform_values(rows * d, 9, -2.0f, 2.0f));
    const DeviceArray<float> dup = on_device(up);
    cpu_backend().silu_mul(x, up, expected);
    cuda::launch_silu_mul(dx.data(), dup.data(), rows * d, y.data(), {}, {rounded.data(), DType::kBF16});
    expect_rounded_copy(y, rounded, DType::kBF16, "silu_mul's bf16 copy, count " + std::to_string(rows * d));
    const Tensor actual = from_device(y, {rows, d});
    for (int64_t i = 0; i < rows * d; ++i)
      ASSERT_NEAR(actual[i], expected[i], 1e-6 * std::max(1.0f, std::fabs(expected[i]))) << "silu_mul " << i;
  }
}

TEST_F(KernelTest, AttentionMatchesTheCpu) {
  const struct {
    int64_t n_seqs, seq_len, n_heads, n_kv_heads, head_dim;
  } cases[] = {{1, 1, 1, 1, 8},    {2, 7, 4, 2, 8},    {2, 33, 2, 2, 64},
               {1, 40, 2, 1, 128}, {1, 19, 2, 2, 160}, {1, 9, 1, 1, 256}};
  uint32_t seed = 20;
  for (const auto& c : cases) {
    const AttentionCase a = attention_case(c.n_seqs, c.seq_len, c.n_heads, c.n_kv_heads, c.head_dim, seed);
    seed += 3;
    const DeviceArray<float> dq = on_device(a.q), dk = on_device(a.k), dv = on_device(a.v);
    DeviceArray<float> out(a.expected.numel());
    cuda::launch_attention(dq.data(), dk.data(), dv.data(), c.n_seqs, c.seq_len, c.n_heads, c.n_kv_heads,
                           c.head_dim, a.scale, out.data(), {});
    expect_close(from_device(out, a.expected.shape()), a.expected, 2e-6, false,
                 "attention T=" + std::to_string(c.seq_len) + " hd=" + std::to_string(c.head_dim));
  }
  // Sequences split over launches (as beyond the grid's 65535 along z): two, then one.
  const AttentionCase split = attention_case(3, 7, 4, 2, 8, seed);
  const DeviceArray<float> dq = on_device(split.q), dk = on_device(split.k), dv = on_device(split.v);
  DeviceArray<float> out(split.expected.numel());
  cuda::launch_attention(dq.data(), dk.data(), dv.data(), 3, 7, 4, 2, 8, split.scale, out.data(), {}, 2);
  expect_close(from_device(out, split.expected.shape()), split.expected, 2e-6, false,
               "attention in 2 launches");
  EXPECT_THAT(
      error_of([] { cuda::launch_attention(nullptr, nullptr, nullptr, 1, 4, 2, 2, 320, 1.0f, nullptr, {}); }),
      ::testing::HasSubstr("head_dim 320 (at most 256)"));
}

TEST_F(KernelTest, TiledLinearMatchesTheCpu) {
  const struct {
    int64_t rows, n, m;
  } cases[] = {{1, 1, 1}, {3, 5, 7}, {70, 33, 65}, {129, 300, 96}, {64, 16, 64}};
  uint32_t seed = 40;
  for (const auto& c : cases)
    for (bool with_bias : {false, true}) {
      const Tensor x({c.rows, c.n}, uniform_values(c.rows * c.n, seed++));
      const Tensor w({c.m, c.n}, uniform_values(c.m * c.n, seed++));
      const Tensor b({c.m}, uniform_values(c.m, seed++));
      Tensor expected;
      cpu_backend().linear(x, w, with_bias ? &b : nullptr, expected);
      const DeviceArray<float> dx = on_device(x), dw = on_device(w), db = on_device(b);
      DeviceArray<float> y(c.rows * c.m);
      cuda::launch_linear_tiled(dx.data(), dw.data(), with_bias ? db.data() : nullptr, c.rows, c.n, c.m,
                                y.data(), {});
      expect_close(
          from_device(y, {c.rows, c.m}), expected, 1e-5, true,
          "linear " + std::to_string(c.rows) + "x" + std::to_string(c.n) + "x" + std::to_string(c.m));
    }
}

TEST_F(KernelTest, RowNllMatchesAnFp64Reference) {
  for (const int64_t vocab : {1, 31, 512, 4099}) {
    const int64_t rows = 6;
    const Tensor logits({rows, vocab},
                        uniform_values(rows * vocab, static_cast<uint32_t>(vocab), -20.0f, 20.0f));
    std::vector<int32_t> targets;
    for (int64_t r = 0; r < rows; ++r) targets.push_back(static_cast<int32_t>((r * 7919) % vocab));
    const DeviceArray<float> dl = on_device(logits);
    const DeviceArray<int32_t> dt(targets);
    DeviceArray<double> nll(rows);
    cuda::launch_row_nll(dl.data(), dt.data(), rows, vocab, nll.data(), {});
    const std::vector<double> actual = nll.download();
    for (int64_t r = 0; r < rows; ++r) {
      const float* row = logits.data() + r * vocab;
      double mx = row[0];
      for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, static_cast<double>(row[j]));
      double sum = 0.0;
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
      const double expected = std::log(sum) + mx - row[targets[static_cast<size_t>(r)]];
      EXPECT_NEAR(actual[static_cast<size_t>(r)], expected, 1e-12 * std::max(1.0, std::fabs(expected)))
          << "vocab " << vocab << " row " << r;
    }
  }
}

}  // namespace
}  // namespace symprune::kernel_test
