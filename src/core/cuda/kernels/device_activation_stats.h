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
  int64_t n_, m_;
  int64_t n_seqs_ = 0, seq_len_ = 0;
  DeviceArray<double> in_sumsq_, in_sum_, in_seqsq_, out_sumsq_;
  DeviceArray<double> seq_sumsq_, seq_sum_;  // per-call scratch, grown as needed
};

}  // namespace symprune::cuda
