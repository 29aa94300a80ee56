#pragma once
// Per-linear-layer activation statistics of DESIGN.md §3.1, accumulated over the calibration set.
// Every field is a plain sum (fp64), so partial statistics from several calls, blocks of sequences
// or ranks merge by summation (merge(), or an all-reduce of the vectors plus n_seqs).
//
// Layout: input channel c indexes the columns of W[m, n] (length-n vectors), output channel r its
// rows (length-m vectors). Paper ‖X_{:j}‖ is our input_norm(c)·√N, paper ‖Y_{k:}‖ our output_norm(r)·√N.
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace symprune {

struct ActivationStats {
  std::vector<double> in_sumsq;   // [n] Σ_t X[t,c]²
  std::vector<double> in_sum;     // [n] Σ_t X[t,c]
  std::vector<double> in_seqsq;   // [n] Σ_s (Σ_{t∈s} X[t,c])²   (for the DSnoT variance)
  std::vector<double> out_sumsq;  // [m] Σ_t Y[t,r]²  (empty when outputs were not collected)
  int64_t n_seqs = 0;             // N: sequences seen so far
  int64_t seq_len = 0;            // T: tokens per sequence (the same for every call)

  int64_t in_features() const { return static_cast<int64_t>(in_sumsq.size()); }
  int64_t out_features() const { return static_cast<int64_t>(out_sumsq.size()); }
  bool has_output() const { return !out_sumsq.empty(); }

  // a_c = sqrt(in_sumsq[c] / N)   (Wanda's scaler_row is a_c²).
  double input_norm(int64_t c) const;
  // b_r = sqrt(out_sumsq[r] / N).
  double output_norm(int64_t r) const;
  // μ̃_c = in_sum[c] / N: DSnoT's mean of per-sequence sums (T × the mean activation).
  double input_mean_sum(int64_t c) const;
  // v_c = (in_sumsq[c] − in_seqsq[c]/T) / (N·T): the mean over sequences of each sequence's
  // population variance (DSnoT's definition; the spread between sequence means is not included).
  // Clamped at 0 (cancellation can leave a tiny negative value for constant channels).
  double input_variance(int64_t c) const;

  // Adds one call's tensors: `input` holds n_seqs·seq_len rows of n input features (shape [N_b·T, n]
  // or [N_b, T, n]), `output` the dense outputs [N_b·T, m] (or [N_b, T, m]); an empty `output`
  // skips the output statistic, which must then be skipped on every call. Sums are fp64 in a fixed
  // order: per channel, each sequence's tokens in order from zero, then the sequences' partial sums in
  // order, then this call's total added to the running one; so the result depends neither on the thread
  // count nor on the backend (the GPU kernels sum in the same order).
  // Throws symprune::Error on inconsistent shapes or a seq_len differing from earlier calls.
  // output_bias [m] (or null): subtracted from every output row first, so that out_sumsq is that of X Wᵀ
  // (DESIGN.md §2) for a linear whose output includes a bias.
  void accumulate(const Tensor& input, const Tensor& output, int64_t n_seqs, int64_t seq_len,
                  const Tensor* output_bias = nullptr);

  // Adds another partial statistic (same widths and seq_len, or either side empty).
  void merge(const ActivationStats& other);
};

// The width of an activation tensor of `rows` token rows (rank >= 2, numel = rows · width, width > 0), or
// ActivationStats::accumulate's error naming `what` ("input", "output"); for backends' own accumulators.
int64_t checked_activation_width(const Tensor& tensor, int64_t rows, const char* what);
// ActivationStats::accumulate's check of its output bias: null, or `out_features` values with outputs.
void check_output_bias(const Tensor* output_bias, bool with_output, int64_t out_features);

}  // namespace symprune
