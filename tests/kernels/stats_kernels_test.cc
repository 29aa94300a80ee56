// Activation statistics of device-held activations against ActivationStats::accumulate on the host:
// the fp64 sums must be bit-identical after several calls (micro-batches), with and without outputs.
#include "core/cuda/kernels/stats_kernels.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/activation_stats.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/kernels/device_activation_stats.h"
#include "kernel_test_support.h"

namespace symprune::kernel_test {
namespace {

using ::testing::HasSubstr;

void expect_identical(const std::vector<double>& actual, const std::vector<double>& expected,
                      const char* field) {
  ASSERT_EQ(actual.size(), expected.size()) << field;
  for (size_t i = 0; i < expected.size(); ++i)
    ASSERT_EQ(actual[i], expected[i]) << field << "[" << i << "] differs by " << actual[i] - expected[i];
}

TEST_F(KernelTest, StatisticsSumLikeTheHostOverSeveralCalls) {
  const int64_t seq_len = 37;
  for (const auto& [n, m] : {std::pair<int64_t, int64_t>{1, 0}, {300, 0}, {70, 513}, {257, 3}}) {
    ActivationStats host;
    cuda::DeviceActivationStats device(n, m);
    uint32_t seed = static_cast<uint32_t>(n * 7 + m);
    for (int64_t seqs : {1, 3, 2}) {
      // Large offsets make the order of fp64 additions matter.
      const Tensor x({seqs * seq_len, n}, uniform_values(seqs * seq_len * n, seed++, -300.0f, 1000.0f));
      const Tensor y =
          m > 0 ? Tensor({seqs * seq_len, m}, uniform_values(seqs * seq_len * m, seed++, -5.0f, 5.0f))
                : Tensor();
      host.accumulate(x, y, seqs, seq_len);
      const cuda::DeviceArray<float> dx(x.data(), x.numel());
      const cuda::DeviceArray<float> dy(y.data(), y.numel());
      device.accumulate(dx.data(), m > 0 ? dy.data() : nullptr, seqs, seq_len);
    }
    const ActivationStats actual = device.download();
    expect_identical(actual.in_sumsq, host.in_sumsq, "in_sumsq");
    expect_identical(actual.in_sum, host.in_sum, "in_sum");
    expect_identical(actual.in_seqsq, host.in_seqsq, "in_seqsq");
    expect_identical(actual.out_sumsq, host.out_sumsq, "out_sumsq");
    EXPECT_EQ(actual.n_seqs, host.n_seqs);
    EXPECT_EQ(actual.seq_len, host.seq_len);
  }
}

TEST_F(KernelTest, SequenceSumsSplitOverLaunchesAreTheSame) {
  // As beyond the grid's 65535 sequences along y: 5 sequences two at a time, with an offset, bit for bit.
  // 21 tokens: a group of 16 loaded ahead of its additions, and a tail.
  const int64_t seqs = 5, seq_len = 21, width = 70;
  const std::vector<float> x = uniform_values(seqs * seq_len * width, 41, -3.0f, 5.0f);
  const std::vector<float> offset = uniform_values(width, 42);
  const cuda::DeviceArray<float> dx(x), doffset(offset);
  std::vector<std::vector<double>> results;
  for (int64_t per_launch : {int64_t{65535}, int64_t{2}}) {
    cuda::DeviceArray<double> sumsq(seqs * width), sum(seqs * width);
    cuda::launch_sequence_sums(dx.data(), doffset.data(), seqs, seq_len, width, sumsq.data(), sum.data(), {},
                               per_launch);
    std::vector<double> both = sumsq.download();
    const std::vector<double> sums = sum.download();
    both.insert(both.end(), sums.begin(), sums.end());
    results.push_back(both);
  }
  ASSERT_EQ(results[0].size(), results[1].size());
  for (size_t i = 0; i < results[0].size(); ++i) ASSERT_EQ(results[0][i], results[1][i]) << i;
  // And each sequence's channel holds the sums over its tokens, in token order.
  for (int64_t q = 0; q < seqs; ++q)
    for (int64_t c = 0; c < width; ++c) {
      double sumsq = 0.0, sum = 0.0;
      for (int64_t t = 0; t < seq_len; ++t) {
        const double v = static_cast<double>(x[static_cast<size_t>((q * seq_len + t) * width + c)]) -
                         static_cast<double>(offset[static_cast<size_t>(c)]);
        sumsq += v * v;
        sum += v;
      }
      const size_t at = static_cast<size_t>(q * width + c);
      // Bit for bit: the host's fp64 operations are the kernel's (x86-64 without FMA contracts none).
      ASSERT_EQ(results[1][at], sumsq) << "sequence " << q << " channel " << c;
      ASSERT_EQ(results[1][static_cast<size_t>(seqs * width) + at], sum) << "sequence " << q;
    }
}

TEST_F(KernelTest, StatisticsRejectWhatTheHostRejects) {
  const Tensor x({2 * 4, 8}, uniform_values(64, 3));
  const cuda::DeviceArray<float> dx(x.data(), x.numel());
  ActivationStats host;
  cuda::DeviceActivationStats device(8, 0);
  host.accumulate(x, Tensor(), 2, 4);
  device.accumulate(dx.data(), nullptr, 2, 4);
  const std::string expected = error_of([&] { host.accumulate(x, Tensor(), 4, 2); });
  EXPECT_THAT(expected, HasSubstr("sequence length 2 differs from the 4 of earlier calls"));
  EXPECT_EQ(error_of([&] { device.accumulate(dx.data(), nullptr, 4, 2); }), expected);
  EXPECT_THAT(error_of([&] { device.accumulate(dx.data(), nullptr, 0, 4); }),
              HasSubstr("need a positive sequence count and length"));
  EXPECT_THAT(error_of([&] { device.accumulate(dx.data(), dx.data(), 2, 4); }), HasSubstr("outputs given"));
}

}  // namespace
}  // namespace symprune::kernel_test
