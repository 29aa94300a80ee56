#pragma once
// Host-only header: ActivationStats accumulated from activations in device memory. The running sums stay
// on the device between calls (the pipeline calls once per micro-batch); download() brings the per-channel
// vectors to the host, equal bit for bit to ActivationStats::accumulate over the same calls.
#include <cstdint>

#include "core/activation_stats.h"
#include "core/cuda/device_memory.h"

namespace symprune::cuda {

class DeviceActivationStats {
 public:
  // in_features = n (input width); out_features = m, or 0 to collect no output statistic.
  DeviceActivationStats(int64_t in_features, int64_t out_features);

  // input: device [seqs · seq_len, n]; output: device [seqs · seq_len, m], or null when out_features is 0.
  // The same argument checks (and error texts) as ActivationStats::accumulate.
  // output_bias [out_features] or null: subtracted from the outputs (ActivationStats::accumulate).
  void accumulate(const float* input, const float* output, int64_t seqs, int64_t seq_len,
                  const float* output_bias = nullptr);
  ActivationStats download() const;

 private:
  double* in_sumsq() { return totals_.data(); }
  double* in_sum() { return totals_.data() + n_; }
  double* in_seqsq() { return totals_.data() + 2 * n_; }
  double* out_sumsq() { return totals_.data() + 3 * n_; }

  int64_t n_, m_;
  int64_t n_seqs_ = 0, seq_len_ = 0;
  // in_sumsq, in_sum, in_seqsq [n] and out_sumsq [m] end to end: one zeroing and one copy to the host (the
  // pipeline makes four of these per micro-batch, and every copy to the host waits for the device).
  DeviceArray<double> totals_;
  DeviceArray<double> seq_sumsq_, seq_sum_;  // per-call scratch, grown as needed
};

}  // namespace symprune::cuda
