// DSnoT and R²-DSnoT on the CUDA backend (Backend::refine_dsnot, dsnot_kernels.cu) against the CPU's
// refine_dsnot (the specification): the refined mask, the swap count and the mean errors before and
// after are the CPU's exactly, for unstructured and N:M masks, every R²-DSnoT key (relative factors,
// p = 1, 2, ∞, both regularizers, two regrow orders), var_power 0 / 0.5 / 1, same-sign, zero-variance
// channels (NaN regrow keys), tied weights, windows that cover the whole row, row slices with the whole
// matrix's column norms, and a bf16 weight (refined on its fp32 values). initial_column_l1 on the device
// equals the CPU's bit for bit, and bad arguments give the CPU's errors.
// Built into the emulated tests (label unit) and into symprune_gpu_tests (label gpu, a real device).
#include "core/cuda/kernels/dsnot_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/cuda/kernels/cuda_backend.h"
#include "core/cuda/kernels/device_dsnot.h"
#include "core/masks.h"
#include "core/refine_dsnot.h"
#include "kernel_test_support.h"

namespace symprune::kernel_test {
namespace {

Backend& device() {
  return cuda::cuda_backend();
}

// A layer's inputs: weight, the statistics DSnoT reads, and a Wanda-like initial mask (per row the
// smallest |w|·a, or the n smallest of every group of m).
struct Layer {
  Tensor w;
  std::vector<double> mu, var, act;
  Mask mask;
};

Layer make_layer(int64_t rows, int64_t cols, uint32_t seed, std::optional<NmPattern> nm, bool tied = false,
                 int zero_variance_every = 0) {
  Layer layer;
  layer.w =
      Tensor({rows, cols}, tied ? tied_values(rows * cols, seed, 7) : uniform_values(rows * cols, seed));
  std::mt19937 rng(seed + 1);
  std::uniform_real_distribution<double> mean(-1.0, 1.0), positive(0.05, 2.0);
  for (int64_t c = 0; c < cols; ++c) {
    layer.mu.push_back(mean(rng));
    const bool flat = zero_variance_every > 0 && c % zero_variance_every == 0;
    layer.var.push_back(flat ? 0.0 : positive(rng));
    layer.act.push_back(positive(rng));
  }
  layer.mask = Mask(rows, cols);
  const int64_t group = nm ? nm->m : cols, prune = nm ? nm->n : cols / 2;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t start = 0; start < cols; start += group) {
      std::vector<int64_t> order(static_cast<size_t>(group));
      std::iota(order.begin(), order.end(), start);
      const auto score = [&](int64_t c) { return std::fabs(layer.w[r * cols + c]) * layer.act[c]; };
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score(a) < score(b); });
      for (int64_t i = 0; i < prune; ++i) layer.mask.set(r, order[static_cast<size_t>(i)], true);
    }
  return layer;
}

// Refines on the CPU and on the device and expects the same mask and figures exactly.
void expect_device_equals_cpu(const Layer& layer, const DsnotOptions& options, std::optional<NmPattern> nm,
                              const std::vector<double>* column_l1 = nullptr, DType dtype = DType::kF32) {
  Mask cpu_mask = layer.mask, device_mask = layer.mask;
  const RefineStats cpu =
      refine_dsnot(layer.w, layer.mu, layer.var, layer.act, cpu_mask, options, nm, column_l1);
  const Tensor w = device().to_backend(layer.w, dtype);
  const RefineStats gpu =
      device().refine_dsnot(w, layer.mu, layer.var, layer.act, device_mask, options, nm, column_l1);
  EXPECT_GT(cpu.swaps, 0) << "the case should refine something";
  EXPECT_EQ(gpu.swaps, cpu.swaps);
  EXPECT_EQ(gpu.mean_abs_error_before, cpu.mean_abs_error_before);
  EXPECT_EQ(gpu.mean_abs_error_after, cpu.mean_abs_error_after);
  EXPECT_FALSE(gpu.recon_sq_change.has_value());
  ASSERT_EQ(device_mask.rows(), cpu_mask.rows());
  for (int64_t r = 0; r < cpu_mask.rows(); ++r)
    ASSERT_TRUE(std::equal(cpu_mask.row(r).begin(), cpu_mask.row(r).end(), device_mask.row(r).begin()))
        << "row " << r;
}

R2Options r2_keys(double reg_p, double gamma_grow, double gamma_prune, double alpha = 0.5) {
  R2Options r2;
  r2.reg_p = reg_p;
  r2.gamma_grow = gamma_grow;
  r2.gamma_prune = gamma_prune;
  r2.alpha = alpha;
  return r2;
}

class DsnotKernelTest : public KernelTest {};

TEST_F(DsnotKernelTest, UnstructuredDsnotEqualsTheCpu) {
  const Layer layer = make_layer(10, 300, 1, std::nullopt);
  expect_device_equals_cpu(layer, DsnotOptions{}, std::nullopt);
  DsnotOptions signed_sqrt;
  signed_sqrt.same_sign = true;
  signed_sqrt.var_power = 0.5;
  signed_sqrt.threshold = 0.0;
  expect_device_equals_cpu(layer, signed_sqrt, std::nullopt);
  DsnotOptions no_variance;
  no_variance.var_power = 0.0;
  no_variance.max_cycles = 7;
  expect_device_equals_cpu(layer, no_variance, std::nullopt);
}

// The row's sums (error, R²-DSnoT's norms, the error after the swaps) are staged 1024 columns at a time for
// thread 0's in-order chain: rows of several tiles and a tail, with and without R²-DSnoT's norms.
TEST_F(DsnotKernelTest, RowsWiderThanOneStagedTileEqualTheCpu) {
  const Layer layer = make_layer(3, 2500, 21, std::nullopt);
  expect_device_equals_cpu(layer, DsnotOptions{}, std::nullopt);
  DsnotOptions r2;
  r2.r2 = r2_keys(2.0, 5e-3, 5e-3);
  expect_device_equals_cpu(layer, r2, std::nullopt);
  DsnotOptions r2_max;
  r2_max.r2 = r2_keys(std::numeric_limits<double>::infinity(), 1e-2, 1e-2);
  expect_device_equals_cpu(layer, r2_max, std::nullopt);
}

TEST_F(DsnotKernelTest, NmDsnotEqualsTheCpu) {
  for (const NmPattern nm : {NmPattern{2, 4}, NmPattern{4, 8}}) {
    SCOPED_TRACE(std::to_string(nm.n) + ":" + std::to_string(nm.m));
    const Layer layer = make_layer(20, 288, 2 + static_cast<uint32_t>(nm.m), nm);
    expect_device_equals_cpu(layer, DsnotOptions{}, nm);
    DsnotOptions reference_pick;  // --compat dsnot
    reference_pick.nm_prune_any_sign = true;
    expect_device_equals_cpu(layer, reference_pick, nm);
  }
}

// The hand-traced rows of RefineDsnot.NmSkipsARegrowCandidateWhoseBlockKeepsOnlyEntriesThatMoveTheErrorAway
// (e > 0 and e < 0): the first regrow candidate's block has no prune candidate and is passed over, the
// second one swaps. With two cycles a row that stopped at the first block would make no swap.
TEST_F(DsnotKernelTest, NmBlockWithoutAPruneCandidateIsPassedOverAsOnTheCpu) {
  Layer layer;
  layer.w = Tensor({2, 8}, {0.9f, 0.2f, 0.5f, 0.6f, 0.3f, 0.1f, -0.4f, 0.7f,  //
                            -0.9f, -0.2f, -0.5f, -0.6f, -0.3f, -0.1f, 0.4f, -0.7f});
  layer.mu = layer.var = layer.act = std::vector<double>(8, 1.0);
  layer.mask = Mask(2, 8);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c : {0, 1, 4, 5}) layer.mask.set(r, c, true);
  expect_device_equals_cpu(layer, DsnotOptions{}, NmPattern{2, 4});
  DsnotOptions two_cycles;
  two_cycles.max_cycles = 2;
  expect_device_equals_cpu(layer, two_cycles, NmPattern{2, 4});
}

TEST_F(DsnotKernelTest, R2DsnotKeysEqualTheCpu) {
  const Layer layer = make_layer(8, 260, 3, std::nullopt);
  for (const R2Options& keys : {R2Options{}, r2_keys(1.0, 1e-2, 0.0), r2_keys(2.0, 5e-3, 5e-3, 1.0),
                                r2_keys(std::numeric_limits<double>::infinity(), 0.0, 1e-2, 0.25)}) {
    SCOPED_TRACE("reg_p " + std::to_string(keys.reg_p) + " gamma " + std::to_string(keys.gamma_grow) + "/" +
                 std::to_string(keys.gamma_prune));
    DsnotOptions options;
    options.r2 = keys;
    expect_device_equals_cpu(layer, options, std::nullopt);
  }
  DsnotOptions one_sided;
  one_sided.r2 = r2_keys(2.0, 1e-3, 0.0);
  one_sided.r2->grow_relative = false;
  one_sided.var_power = 0.5;
  expect_device_equals_cpu(layer, one_sided, std::nullopt);
  const Layer nm_layer = make_layer(16, 128, 4, NmPattern{2, 4});
  DsnotOptions nm_options;
  nm_options.r2 = r2_keys(1.0, 1e-2, 1e-2);
  expect_device_equals_cpu(nm_layer, nm_options, NmPattern{2, 4});
}

TEST_F(DsnotKernelTest, NanKeysTiesAndWholeRowWindowsEqualTheCpu) {
  // Every fifth channel has zero variance (regrow key 0/0 = NaN for its pruned and kept entries), the
  // weights take 7 values (ties everywhere), and 200 cycles make the windows the whole row.
  const Layer layer = make_layer(16, 120, 5, std::nullopt, /*tied=*/true, /*zero_variance_every=*/5);
  DsnotOptions options;
  options.max_cycles = 200;
  options.threshold = 0.0;
  expect_device_equals_cpu(layer, options, std::nullopt);
  options.r2 = r2_keys(2.0, 1e-3, 1e-3);
  expect_device_equals_cpu(layer, options, std::nullopt);
  const Layer nm_layer = make_layer(12, 96, 6, NmPattern{2, 4}, /*tied=*/true, /*zero_variance_every=*/3);
  expect_device_equals_cpu(nm_layer, DsnotOptions{}, NmPattern{2, 4});
}

TEST_F(DsnotKernelTest, RowSlicesWithTheWholeMatrixColumnNormsEqualTheCpu) {
  const Layer layer = make_layer(30, 200, 7, std::nullopt);
  const Tensor device_w = device().to_backend(layer.w);
  const std::vector<double> cpu_l1 = initial_column_l1(layer.w, layer.mask);
  const std::vector<double> device_l1 = device().initial_column_l1(device_w, layer.mask);
  ASSERT_EQ(device_l1.size(), cpu_l1.size());
  for (size_t c = 0; c < cpu_l1.size(); ++c) ASSERT_EQ(device_l1[c], cpu_l1[c]) << "column " << c;

  // Rows [11, 30) as a rank of a distributed run holds them.
  const int64_t begin = 11, rows = 19, cols = 200;
  Layer slice = layer;
  slice.w =
      Tensor({rows, cols}, std::vector<float>(layer.w.data() + begin * cols, layer.w.data() + 30 * cols));
  slice.mask = Mask(rows, cols);
  for (int64_t r = 0; r < rows; ++r)
    std::copy(layer.mask.row(begin + r).begin(), layer.mask.row(begin + r).end(), slice.mask.row(r).begin());
  DsnotOptions options;
  options.r2 = R2Options{};
  expect_device_equals_cpu(slice, options, std::nullopt, &cpu_l1);
}

TEST_F(DsnotKernelTest, Bf16WeightIsRefinedOnItsValues) {
  Layer layer = make_layer(16, 256, 8, std::nullopt);
  // The CPU reference refines the bf16-rounded values (what the device weight holds).
  const Tensor rounded = device().to_host(device().to_backend(layer.w, DType::kBF16));
  layer.w = rounded;
  expect_device_equals_cpu(layer, DsnotOptions{}, std::nullopt, nullptr, DType::kBF16);
}

TEST_F(DsnotKernelTest, BadArgumentsGiveTheCpuErrors) {
  const Layer layer = make_layer(4, 16, 9, std::nullopt);
  const Tensor w = device().to_backend(layer.w);
  const std::vector<double> short_mu(15, 1.0);
  const auto cpu_error = [&](const DsnotOptions& options, std::optional<NmPattern> nm,
                             const std::vector<double>& mu) {
    Mask mask = layer.mask;
    return error_of([&] { refine_dsnot(layer.w, mu, layer.var, layer.act, mask, options, nm); });
  };
  const auto device_error = [&](const DsnotOptions& options, std::optional<NmPattern> nm,
                                const std::vector<double>& mu) {
    Mask mask = layer.mask;
    return error_of([&] { device().refine_dsnot(w, mu, layer.var, layer.act, mask, options, nm, nullptr); });
  };
  EXPECT_EQ(device_error(DsnotOptions{}, std::nullopt, short_mu),
            cpu_error(DsnotOptions{}, std::nullopt, short_mu));
  EXPECT_NE(cpu_error(DsnotOptions{}, std::nullopt, short_mu).find("mean-sum vector (mu) has 15 entries"),
            std::string::npos);
  DsnotOptions negative;
  negative.max_cycles = -1;
  EXPECT_EQ(device_error(negative, std::nullopt, layer.mu), cpu_error(negative, std::nullopt, layer.mu));
  EXPECT_EQ(device_error(DsnotOptions{}, NmPattern{2, 5}, layer.mu),
            cpu_error(DsnotOptions{}, NmPattern{2, 5}, layer.mu));
  EXPECT_NE(device_error(DsnotOptions{}, NmPattern{2, 5}, layer.mu).find("does not fit"), std::string::npos);
}

// The memory plan counts kDeviceRefineScratchBytes for DSnoT's scratch: the blocks' scratch stays within it
// at the widths of LLaMA-2-7B/70B and LLaMA-3 for any --max-cycles, and 7B's q_proj still gets the 1056
// blocks that fill an H100.
TEST(DsnotScratchTest, BlocksScratchStaysWithinThePlannedAllowance) {
  for (const int64_t n : {4096, 8192, 11008, 14336, 28672})
    for (const int max_cycles : {0, 1, 50, 1'000'000, std::numeric_limits<int>::max()})
      for (const int64_t rows : {1, 4096, 28672}) {
        const int64_t per_block = cuda::dsnot_scratch_bytes_per_block(n, max_cycles);
        const int blocks = cuda::dsnot_blocks(rows, n, max_cycles);
        EXPECT_LE(per_block, 26 * n + 8) << n << " columns, " << max_cycles << " cycles";
        EXPECT_GE(blocks, 1);
        EXPECT_LE(blocks, rows);
        EXPECT_LE(blocks * per_block, kDeviceRefineScratchBytes)
            << n << " columns, " << max_cycles << " cycles";
      }
  EXPECT_EQ(cuda::dsnot_blocks(4096, 4096, 50), 1056);
  // Wide rows with every entry reachable: fewer blocks, the allowance nearly used.
  const int64_t wide = cuda::dsnot_scratch_bytes_per_block(28672, 1'000'000);
  EXPECT_EQ(cuda::dsnot_blocks(28672, 28672, 1'000'000), kDeviceRefineScratchBytes / wide);
}

}  // namespace
}  // namespace symprune::kernel_test
