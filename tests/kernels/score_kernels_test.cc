// Scores of a device-held weight against core::compute_scores on the host: every method, bit for bit
// (the same fp64 formulas in the same order), and the same errors.
#include "core/cuda/kernels/score_kernels.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "core/activation_stats.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/kernels/device_scores.h"
#include "core/scores.h"
#include "kernel_test_support.h"

namespace symprune::kernel_test {
namespace {

using ::testing::HasSubstr;

// A weight with exact zeros (whole zero rows and columns too, for the 1/0 := 0 rules) and mixed signs.
Tensor test_weight(int64_t m, int64_t n, uint32_t seed) {
  std::vector<float> values = uniform_values(m * n, seed, -2.0f, 2.0f);
  for (int64_t i = 0; i < m * n; i += 7) values[static_cast<size_t>(i)] = 0.0f;
  for (int64_t c = 0; c < n; ++c) values[static_cast<size_t>(c)] = -0.0f;  // row 0 all zero
  if (n > 2)
    for (int64_t r = 0; r < m; ++r) values[static_cast<size_t>(r * n + 2)] = 0.0f;  // column 2 all zero
  return Tensor({m, n}, values);
}

ActivationStats test_stats(int64_t m, int64_t n, uint32_t seed) {
  ActivationStats stats;
  const auto in = uniform_values(n, seed, 0.0f, 50.0f);
  const auto out = uniform_values(m, seed + 1, 0.0f, 50.0f);
  stats.in_sumsq.assign(in.begin(), in.end());
  stats.in_sumsq[0] = 0.0;  // a dead input channel
  stats.in_sum.assign(static_cast<size_t>(n), 0.0);
  stats.in_seqsq.assign(static_cast<size_t>(n), 0.0);
  stats.out_sumsq.assign(out.begin(), out.end());
  stats.n_seqs = 3;
  stats.seq_len = 5;
  return stats;
}

Tensor device_scores(ScoreMethod method, const Tensor& weight, const ActivationStats* stats,
                     const ScoreOptions& options) {
  const int64_t m = weight.dim(0), n = weight.dim(1);
  const int64_t rows = (options.row_end < 0 ? m : options.row_end) - options.row_begin;
  const cuda::DeviceArray<float> device_weight(weight.data(), weight.numel());
  cuda::DeviceArray<float> out(rows * n);
  // Only --compat ria reads a host copy of the weight: every other method is given none.
  cuda::compute_scores_on_device(method, device_weight.data(), m, n,
                                 options.compat_ria_fp16 ? &weight : nullptr, stats, options, out.data());
  return Tensor({rows, n}, out.download());
}

void expect_bit_identical(ScoreMethod method, const Tensor& weight, const ActivationStats* stats,
                          const ScoreOptions& options, const std::string& what) {
  const Tensor expected = compute_scores(method, weight, stats, options);
  const Tensor actual = device_scores(method, weight, stats, options);
  ASSERT_EQ(actual.shape(), expected.shape()) << what;
  int64_t differing = 0, first = -1;
  for (int64_t i = 0; i < expected.numel(); ++i)
    if (std::bit_cast<uint32_t>(actual[i]) != std::bit_cast<uint32_t>(expected[i])) {
      if (first < 0) first = i;
      ++differing;
    }
  EXPECT_EQ(differing, 0) << what << ": " << differing << " of " << expected.numel()
                          << " scores differ, first at " << first << " ("
                          << (first >= 0 ? actual[first] : 0.0f) << " vs "
                          << (first >= 0 ? expected[first] : 0.0f) << ")";
}

// The norm sums stage tiles of 32 lines × 128 elements: shapes with one partial tile, several tiles with
// tails along both rows and columns.
const struct { int64_t m, n; } kShapes[] = {{1, 1}, {3, 5}, {17, 33}, {64, 300}, {150, 40}};

TEST_F(KernelTest, EveryMethodScoresLikeTheHost) {
  uint32_t seed = 1;
  for (const auto& shape : kShapes) {
    const Tensor weight = test_weight(shape.m, shape.n, seed++);
    const ActivationStats stats = test_stats(shape.m, shape.n, seed++);
    for (ScoreMethod method :
         {ScoreMethod::kMagnitude, ScoreMethod::kWanda, ScoreMethod::kOWanda, ScoreMethod::kSymWanda,
          ScoreMethod::kSymWandaSq, ScoreMethod::kSymmetric, ScoreMethod::kSymmetricSq, ScoreMethod::kRI,
          ScoreMethod::kRIA, ScoreMethod::kRIARowOnly, ScoreMethod::kRIAColOnly, ScoreMethod::kStochRIA}) {
      ScoreOptions options;
      options.matrix_name = "blk.mlp";
      options.seed = 7;
      expect_bit_identical(method, weight, &stats, options,
                           std::string(score_method_name(method)) + " " + weight.shape_string());
      if (score_method_uses_alpha(method))
        for (double alpha : {0.0, 0.5, 1.0, 2.0, 0.3}) {
          options.alpha = alpha;
          expect_bit_identical(method, weight, &stats, options,
                               std::string(score_method_name(method)) + " alpha " + std::to_string(alpha));
        }
    }
  }
}

// stochria's samples are drawn by the host's sampler and summed on the device (no host copy of W): the
// scores are the host's for τ = 1, a few and all of min(m, n), wide and tall weights, other seeds and
// blocks.
TEST_F(KernelTest, StochriaSampledSumsAreTheHostsForEveryBeta) {
  uint32_t seed = 40;
  for (const auto& shape : {std::pair<int64_t, int64_t>{64, 300}, {300, 17}, {2, 2}})
    for (double beta : {0.01, 0.37, 1.0}) {
      const Tensor weight = test_weight(shape.first, shape.second, seed++);
      const ActivationStats stats = test_stats(shape.first, shape.second, seed++);
      ScoreOptions options;
      options.matrix_name = "3.mlp.down_proj";
      options.block = 3;
      options.seed = seed;
      options.beta = beta;
      expect_bit_identical(ScoreMethod::kStochRIA, weight, &stats, options,
                           "stochria beta " + std::to_string(beta) + " " + weight.shape_string());
    }
}

// The fp64 row and column norm sums themselves, bit for bit the host's chain over each line in order (the
// fp32 scores hide an fp64 sum's last bits, so the order of the additions shows here only): one partial
// tile, several tiles with tails, lines in partial blocks of 32; magnitudes over twelve decades, so that
// most sums round differently in any other order.
TEST_F(KernelTest, NormSumsAddEveryLineInOrder) {
  uint32_t seed = 90;
  for (const auto& [m, n] : {std::pair<int64_t, int64_t>{150, 40}, {64, 300}, {33, 129}}) {
    std::vector<float> values = uniform_values(m * n, seed++, -1.0f, 1.0f);
    const std::vector<float> scales = uniform_values(m * n, seed++, -6.0f, 6.0f);
    for (size_t i = 0; i < values.size(); ++i) values[i] *= std::pow(10.0f, scales[i]);
    const cuda::DeviceArray<float> weight(values);
    for (double p : {0.0, 1.0, 2.0, 3.0, 4.0, std::numeric_limits<double>::infinity()}) {
      cuda::DeviceArray<double> rows(m), columns(n);
      cuda::launch_row_norm_sums(weight.data(), m, n, p, rows.data(), {});
      cuda::launch_column_norm_sums(weight.data(), m, n, p, columns.data(), {});
      std::vector<double> expected_rows(static_cast<size_t>(m), 0.0),
          expected_columns(static_cast<size_t>(n), 0.0);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c) {
          const double magnitude = std::fabs(static_cast<double>(values[static_cast<size_t>(r * n + c)]));
          expected_rows[static_cast<size_t>(r)] =
              norm_accumulate(p, expected_rows[static_cast<size_t>(r)], magnitude);
          expected_columns[static_cast<size_t>(c)] =
              norm_accumulate(p, expected_columns[static_cast<size_t>(c)], magnitude);
        }
      // Column sums that pass over the entries a mask marks (DSnoT's norms of the kept entries).
      std::vector<uint8_t> skip(static_cast<size_t>(m * n));
      for (size_t i = 0; i < skip.size(); ++i) skip[i] = (i * 2654435761u >> 7) % 3 == 0;
      const cuda::DeviceArray<uint8_t> device_skip(skip);
      cuda::DeviceArray<double> kept_columns(n);
      cuda::launch_column_norm_sums(weight.data(), m, n, p, kept_columns.data(), {}, device_skip.data());
      std::vector<double> expected_kept(static_cast<size_t>(n), 0.0);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c)
          if (!skip[static_cast<size_t>(r * n + c)])
            expected_kept[static_cast<size_t>(c)] =
                norm_accumulate(p, expected_kept[static_cast<size_t>(c)],
                                std::fabs(static_cast<double>(values[static_cast<size_t>(r * n + c)])));
      EXPECT_EQ(kept_columns.download(), expected_kept) << "kept column sums p=" << p;
      EXPECT_EQ(rows.download(), expected_rows) << "row sums p=" << p << " [" << m << ", " << n << "]";
      EXPECT_EQ(columns.download(), expected_columns)
          << "column sums p=" << p << " [" << m << ", " << n << "]";
    }
  }
}

// Every norm's row and column sums (the ℓ2..ℓ4 powers round, so their sums depend on the order of the
// additions): one partial tile, and several tiles with tails in both directions.
TEST_F(KernelTest, LpNormsAndStrategiesScoreLikeTheHost) {
  for (const auto& [m, n] : {std::pair<int64_t, int64_t>{19, 41}, {150, 40}, {64, 300}}) {
    const Tensor weight = test_weight(m, n, 3);
    const ActivationStats stats = test_stats(m, n, 4);
    for (double p : {0.0, 1.0, 2.0, 3.0, 4.0, std::numeric_limits<double>::infinity()})
      for (int strategy = 1; strategy <= 4; ++strategy) {
        ScoreOptions options;
        options.p = p;
        options.strategy = strategy;
        expect_bit_identical(
            ScoreMethod::kLp, weight, &stats, options,
            "lp p=" + std::to_string(p) + " S" + std::to_string(strategy) + " " + weight.shape_string());
      }
  }
}

TEST_F(KernelTest, RowRangesAndCompatRiaScoreLikeTheHost) {
  const Tensor weight = test_weight(23, 30, 5);
  const ActivationStats stats = test_stats(23, 30, 6);
  for (const auto& [begin, end] : {std::pair<int64_t, int64_t>{0, 23}, {5, 11}, {22, 23}, {7, 7}}) {
    ScoreOptions options;
    options.row_begin = begin;
    options.row_end = end;
    for (ScoreMethod method :
         {ScoreMethod::kWanda, ScoreMethod::kRIA, ScoreMethod::kSymWanda, ScoreMethod::kStochRIA})
      expect_bit_identical(method, weight, &stats, options,
                           std::string(score_method_name(method)) + " rows " + std::to_string(begin) + ".." +
                               std::to_string(end));
    options.compat_ria_fp16 = true;
    expect_bit_identical(ScoreMethod::kRIA, weight, &stats, options, "compat ria");
  }
}

// Scores beyond fp32's range (above FLT_MAX, or positive and rounding to 0) are refused with the host's
// message naming the first such entry, on the device as on the host; scores just inside are bit-identical.
TEST_F(KernelTest, SaturatedScoresAreRefusedLikeTheHost) {
  const auto same_error = [&](ScoreMethod method, const Tensor& weight, const ActivationStats* stats,
                              const char* expected) {
    ScoreOptions options;
    options.matrix_name = "0.self_attn.q_proj";
    const std::string host = error_of([&] { (void)compute_scores(method, weight, stats, options); });
    EXPECT_THAT(host, HasSubstr(expected));
    EXPECT_EQ(error_of([&] { (void)device_scores(method, weight, stats, options); }), host);
  };
  std::vector<float> values(8 * 8, 1.0f);
  values[13] = -3.0e38f;
  values[50] = 3.0e38f;
  ActivationStats stats = test_stats(8, 8, 9);
  for (double& v : stats.in_sumsq) v = 1.0e30;
  same_error(ScoreMethod::kWanda, Tensor({8, 8}, values), &stats,
             "the wanda score of weight [1, 5] = -3e+38 is 1.73205e+53, above the range of fp32 scores");
  same_error(ScoreMethod::kSymmetricSq, Tensor({8, 8}, values), nullptr, "weight [1, 2] = 1 is 4.24264e+38");
  std::vector<float> tiny(8 * 8, 1.0e-25f);
  tiny[3] = 0.0f;  // a zero weight's zero score is exact, not an underflow
  same_error(ScoreMethod::kSymmetric, Tensor({8, 8}, tiny), nullptr,
             "the symmetric score of weight [0, 0] = 1e-25 is 5.47418e-50, below the range of fp32 scores");
  for (float& v : values) v = std::min(std::fabs(v), 1.0e30f);  // scores up to 1e45: refused
  for (double& v : stats.in_sumsq) v = 1.0e14;                  // norms 1e7: scores up to 1e37, inside
  expect_bit_identical(ScoreMethod::kWanda, Tensor({8, 8}, values), &stats, ScoreOptions{}, "wanda near max");
}

TEST_F(KernelTest, ScoreErrorsAreTheHostErrors) {
  Tensor weight = test_weight(4, 6, 11);
  weight[2 * 6 + 3] = std::numeric_limits<float>::infinity();
  ActivationStats stats = test_stats(4, 6, 12);
  ScoreOptions options;
  options.matrix_name = "3.mlp.up_proj";
  const std::string host =
      error_of([&] { (void)compute_scores(ScoreMethod::kWanda, weight, &stats, options); });
  EXPECT_THAT(host, HasSubstr("weight [2, 3] is inf"));
  EXPECT_EQ(error_of([&] { (void)device_scores(ScoreMethod::kWanda, weight, &stats, options); }), host);

  weight[2 * 6 + 3] = 1.0f;
  const std::string no_stats =
      error_of([&] { (void)compute_scores(ScoreMethod::kRIA, weight, nullptr, options); });
  EXPECT_THAT(no_stats, HasSubstr("needs calibration statistics"));
  EXPECT_EQ(error_of([&] { (void)device_scores(ScoreMethod::kRIA, weight, nullptr, options); }), no_stats);

  stats.in_sumsq[1] = std::nan("");
  const std::string bad_stat =
      error_of([&] { (void)compute_scores(ScoreMethod::kWanda, weight, &stats, options); });
  EXPECT_THAT(bad_stat, HasSubstr("in_sumsq[1]"));
  EXPECT_EQ(error_of([&] { (void)device_scores(ScoreMethod::kWanda, weight, &stats, options); }), bad_stat);
}

}  // namespace
}  // namespace symprune::kernel_test
