#include "core/activation_stats.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace symprune {
namespace {

// Columns per OpenMP work item: each item owns its channels, so sums never cross threads.
constexpr int64_t kColumnChunk = 64;
// Below this many values a parallel region costs more than it saves (results are identical either way).
constexpr int64_t kParallelMin = 1 << 15;

}  // namespace

int64_t checked_activation_width(const Tensor& tensor, int64_t rows, const char* what) {
  SYMPRUNE_CHECK(tensor.rank() >= 2, "activation statistics: {} must have rank >= 2, got shape {}", what,
                 tensor.shape_string());
  const int64_t width = tensor.dim(-1);
  SYMPRUNE_CHECK(width > 0 && tensor.numel() == rows * width,
                 "activation statistics: {} shape {} does not hold {} token rows", what,
                 tensor.shape_string(), rows);
  return width;
}

void check_output_bias(const Tensor* output_bias, bool with_output, int64_t out_features) {
  SYMPRUNE_CHECK(output_bias == nullptr || (with_output && output_bias->numel() == out_features),
                 "activation statistics: an output bias of {} values for {} output channels",
                 output_bias ? output_bias->numel() : 0, out_features);
}

namespace {

void check_index(int64_t index, size_t size, const char* what) {
  SYMPRUNE_ASSERT(index >= 0 && static_cast<size_t>(index) < size, "{} index {} out of {}", what, index,
                  size);
}

}  // namespace

double ActivationStats::input_norm(int64_t c) const {
  check_index(c, in_sumsq.size(), "input channel");
  return n_seqs > 0 ? std::sqrt(in_sumsq[static_cast<size_t>(c)] / static_cast<double>(n_seqs)) : 0.0;
}

double ActivationStats::output_norm(int64_t r) const {
  check_index(r, out_sumsq.size(), "output channel");
  return n_seqs > 0 ? std::sqrt(out_sumsq[static_cast<size_t>(r)] / static_cast<double>(n_seqs)) : 0.0;
}

double ActivationStats::input_mean_sum(int64_t c) const {
  check_index(c, in_sum.size(), "input channel");
  return n_seqs > 0 ? in_sum[static_cast<size_t>(c)] / static_cast<double>(n_seqs) : 0.0;
}

double ActivationStats::input_variance(int64_t c) const {
  check_index(c, in_seqsq.size(), "input channel");
  if (n_seqs <= 0 || seq_len <= 0) return 0.0;
  const double t = static_cast<double>(seq_len);
  const double v = (in_sumsq[static_cast<size_t>(c)] - in_seqsq[static_cast<size_t>(c)] / t) /
                   (static_cast<double>(n_seqs) * t);
  return std::max(v, 0.0);
}

void ActivationStats::accumulate(const Tensor& input, const Tensor& output, int64_t call_seqs,
                                 int64_t call_seq_len, const Tensor* output_bias) {
  SYMPRUNE_CHECK(call_seqs > 0 && call_seq_len > 0,
                 "activation statistics: need a positive sequence count and length, got {} x {}", call_seqs,
                 call_seq_len);
  SYMPRUNE_CHECK(seq_len == 0 || seq_len == call_seq_len,
                 "activation statistics: sequence length {} differs from the {} of earlier calls",
                 call_seq_len, seq_len);
  const int64_t rows = call_seqs * call_seq_len;
  const int64_t n = checked_activation_width(input, rows, "input");
  SYMPRUNE_CHECK(in_sumsq.empty() || in_features() == n,
                 "activation statistics: input width {} differs from the {} of earlier calls", n,
                 in_features());
  const bool with_output = !output.empty();
  int64_t m = 0;
  if (with_output) {
    m = checked_activation_width(output, rows, "output");
    SYMPRUNE_CHECK(n_seqs == 0 || (has_output() && out_features() == m),
                   "activation statistics: output width {} differs from earlier calls ({})", m,
                   has_output() ? std::to_string(out_features()) : std::string("no outputs"));
  } else {
    SYMPRUNE_CHECK(!has_output(), "activation statistics: outputs missing, but earlier calls had them");
  }
  check_output_bias(output_bias, with_output, m);

  if (in_sumsq.empty()) {
    in_sumsq.assign(static_cast<size_t>(n), 0.0);
    in_sum.assign(static_cast<size_t>(n), 0.0);
    in_seqsq.assign(static_cast<size_t>(n), 0.0);
  }
  if (with_output && out_sumsq.empty()) out_sumsq.assign(static_cast<size_t>(m), 0.0);

  const float* x = input.data();
  const int64_t in_chunks = (n + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for schedule(static) if (rows * n >= kParallelMin)
  for (int64_t chunk = 0; chunk < in_chunks; ++chunk) {
    const int64_t c0 = chunk * kColumnChunk;
    const int64_t width = std::min(kColumnChunk, n - c0);
    double sumsq[kColumnChunk] = {};
    double sum[kColumnChunk] = {};
    double seqsq[kColumnChunk] = {};
    // Per sequence first, then the sequences in order: the order a GPU reproduces with one thread per
    // (channel, sequence) (core/cuda/kernels/stats_kernels.cu).
    for (int64_t s = 0; s < call_seqs; ++s) {
      double seq_sumsq[kColumnChunk] = {};
      double seq_sum[kColumnChunk] = {};
      for (int64_t t = 0; t < call_seq_len; ++t) {
        const float* row = x + (s * call_seq_len + t) * n + c0;
        for (int64_t j = 0; j < width; ++j) {
          const double v = row[j];
          seq_sumsq[j] += v * v;
          seq_sum[j] += v;
        }
      }
      for (int64_t j = 0; j < width; ++j) {
        sumsq[j] += seq_sumsq[j];
        sum[j] += seq_sum[j];
        seqsq[j] += seq_sum[j] * seq_sum[j];
      }
    }
    for (int64_t j = 0; j < width; ++j) {
      const size_t c = static_cast<size_t>(c0 + j);
      in_sumsq[c] += sumsq[j];
      in_sum[c] += sum[j];
      in_seqsq[c] += seqsq[j];
    }
  }

  if (with_output) {
    const float* y = output.data();
    const float* bias = output_bias ? output_bias->data() : nullptr;
    const int64_t out_chunks = (m + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for schedule(static) if (rows * m >= kParallelMin)
    for (int64_t chunk = 0; chunk < out_chunks; ++chunk) {
      const int64_t r0 = chunk * kColumnChunk;
      const int64_t width = std::min(kColumnChunk, m - r0);
      double sumsq[kColumnChunk] = {};
      for (int64_t s = 0; s < call_seqs; ++s) {
        double seq_sumsq[kColumnChunk] = {};
        for (int64_t t = 0; t < call_seq_len; ++t) {
          const float* row = y + (s * call_seq_len + t) * m + r0;
          for (int64_t j = 0; j < width; ++j) {
            const double v = bias ? static_cast<double>(row[j]) - bias[r0 + j] : row[j];
            seq_sumsq[j] += v * v;
          }
        }
        for (int64_t j = 0; j < width; ++j) sumsq[j] += seq_sumsq[j];
      }
      for (int64_t j = 0; j < width; ++j) out_sumsq[static_cast<size_t>(r0 + j)] += sumsq[j];
    }
  }

  n_seqs += call_seqs;
  seq_len = call_seq_len;
}

void ActivationStats::merge(const ActivationStats& other) {
  if (other.n_seqs == 0 && other.in_sumsq.empty()) return;
  if (n_seqs == 0 && in_sumsq.empty()) {
    *this = other;
    return;
  }
  SYMPRUNE_CHECK(seq_len == other.seq_len, "activation statistics: cannot merge sequence lengths {} and {}",
                 seq_len, other.seq_len);
  SYMPRUNE_CHECK(in_features() == other.in_features() && in_sum.size() == other.in_sum.size() &&
                     in_seqsq.size() == other.in_seqsq.size(),
                 "activation statistics: cannot merge input widths {} and {}", in_features(),
                 other.in_features());
  SYMPRUNE_CHECK(out_features() == other.out_features(),
                 "activation statistics: cannot merge output widths {} and {}", out_features(),
                 other.out_features());
  for (size_t c = 0; c < in_sumsq.size(); ++c) {
    in_sumsq[c] += other.in_sumsq[c];
    in_sum[c] += other.in_sum[c];
    in_seqsq[c] += other.in_seqsq[c];
  }
  for (size_t r = 0; r < out_sumsq.size(); ++r) out_sumsq[r] += other.out_sumsq[r];
  n_seqs += other.n_seqs;
}

}  // namespace symprune
