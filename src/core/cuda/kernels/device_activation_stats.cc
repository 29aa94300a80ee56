// ActivationStats on the device (see device_activation_stats.h).
#include "core/cuda/kernels/device_activation_stats.h"

#include <algorithm>
#include <vector>

#include "core/cuda/kernels/stats_kernels.h"
#include "core/error.h"

namespace symprune::cuda {

DeviceActivationStats::DeviceActivationStats(int64_t in_features, int64_t out_features)
    : n_(in_features), m_(out_features) {
  SYMPRUNE_CHECK(in_features > 0 && out_features >= 0, "activation statistics: invalid widths {} and {}",
                 in_features, out_features);
  totals_ = DeviceArray<double>(3 * n_ + m_);
  totals_.zero();
}

void DeviceActivationStats::accumulate(const float* input, const float* output, int64_t seqs, int64_t seq_len,
                                       const float* output_bias) {
  SYMPRUNE_CHECK(seqs > 0 && seq_len > 0,
                 "activation statistics: need a positive sequence count and length, got {} x {}", seqs,
                 seq_len);
  SYMPRUNE_CHECK(seq_len_ == 0 || seq_len_ == seq_len,
                 "activation statistics: sequence length {} differs from the {} of earlier calls", seq_len,
                 seq_len_);
  SYMPRUNE_CHECK((output != nullptr) == (m_ > 0), "activation statistics: outputs {} but {} expected",
                 output != nullptr ? "given" : "missing", m_ > 0 ? "they are" : "none are");
  const int64_t scratch = seqs * std::max(n_, m_);
  if (seq_sumsq_.size() < scratch) {
    seq_sumsq_ = DeviceArray<double>(scratch);
    seq_sum_ = DeviceArray<double>(scratch);
  }
  launch_sequence_sums(input, nullptr, seqs, seq_len, n_, seq_sumsq_.data(), seq_sum_.data(), {});
  launch_combine_sequences(seq_sumsq_.data(), seq_sum_.data(), seqs, n_, in_sumsq(), in_sum(), in_seqsq(),
                           {});
  if (m_ > 0) {
    launch_sequence_sums(output, output_bias, seqs, seq_len, m_, seq_sumsq_.data(), nullptr, {});
    launch_combine_sequences(seq_sumsq_.data(), nullptr, seqs, m_, out_sumsq(), nullptr, nullptr, {});
  }
  n_seqs_ += seqs;
  seq_len_ = seq_len;
}

ActivationStats DeviceActivationStats::download() const {
  const std::vector<double> totals = totals_.download();
  const auto part = [&](int64_t first, int64_t count) {
    return std::vector<double>(totals.begin() + first, totals.begin() + first + count);
  };
  ActivationStats stats;
  stats.in_sumsq = part(0, n_);
  stats.in_sum = part(n_, n_);
  stats.in_seqsq = part(2 * n_, n_);
  if (m_ > 0) stats.out_sumsq = part(3 * n_, m_);
  stats.n_seqs = n_seqs_;
  stats.seq_len = seq_len_;
  return stats;
}

}  // namespace symprune::cuda
