#include "model/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/interrupt.h"

namespace symprune::model {
namespace {

constexpr int64_t kDefaultTokensPerBatch = 8192;
constexpr int64_t kLogitRowsPerSlab = 512;         // bounds the [rows, vocab] logits buffer
constexpr int64_t kParallelMinElements = 1 << 15;  // smaller reductions run on one thread

// -log softmax(row)[target], in double.
double row_nll(const float* row, int64_t vocab, int32_t target) {
  float mx = row[0];
  for (int64_t j = 1; j < vocab; ++j) mx = std::max(mx, row[j]);
  double sum = 0.0;
  for (int64_t j = 0; j < vocab; ++j) sum += std::exp(static_cast<double>(row[j]) - mx);
  return std::log(sum) + mx - static_cast<double>(row[target]);
}

}  // namespace

double sequence_mean_nll(const Tensor& logits, std::span<const int32_t> tokens) {
  const int64_t vocab = logits.dim(-1);
  const int64_t T = static_cast<int64_t>(tokens.size());
  SYMPRUNE_ASSERT(T >= 2 && logits.numel() == T * vocab, "logits {} for {} tokens", logits.shape_string(), T);
  double total = 0.0;
#pragma omp parallel for reduction(+ : total) schedule(static) if ((T - 1) * vocab >= kParallelMinElements)
  for (int64_t t = 0; t < T - 1; ++t)
    total += row_nll(logits.data() + t * vocab, vocab, tokens[static_cast<size_t>(t + 1)]);
  return total / static_cast<double>(T - 1);
}

PerplexityResult evaluate_perplexity(DecoderModel& model, std::span<const int32_t> tokens,
                                     const PerplexityOptions& options, const PerplexityProgress& progress) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t T = options.seqlen;
  const int64_t n_tokens = static_cast<int64_t>(tokens.size());
  SYMPRUNE_CHECK(T >= 2, "perplexity needs a sequence length of at least 2, got {}", T);
  SYMPRUNE_CHECK(T <= model.max_seq_len(), "{}: sequence length {} exceeds max_position_embeddings {}",
                 (model.dir() / "config.json").string(), T, model.max_seq_len());
  SYMPRUNE_CHECK(n_tokens >= T, "{} tokens, fewer than one chunk of {}", n_tokens, T);
  int64_t chunks = n_tokens / T;  // the tail is dropped
  if (options.max_chunks > 0) chunks = std::min(chunks, options.max_chunks);
  const int64_t batch = options.batch_sequences > 0 ? options.batch_sequences
                                                    : std::max<int64_t>(1, kDefaultTokensPerBatch / T);
  const int64_t vocab = model.vocab_size();

  PerplexityResult result;
  result.tokens = n_tokens;
  result.seqlen = T;
  result.chunks = chunks;
  result.evaluated_tokens = chunks * T;
  result.chunk_nll.reserve(static_cast<size_t>(chunks));

  Tensor slab, logits;
  for (int64_t c0 = 0; c0 < chunks; c0 += batch) {
    interrupt::check();
    const int64_t n = std::min(batch, chunks - c0);
    const auto batch_tokens = tokens.subspan(static_cast<size_t>(c0 * T), static_cast<size_t>(n * T));
    Tensor h = model.embed(batch_tokens, n, T);
    for (int64_t b = 0; b < model.num_blocks(); ++b) model.run_block(b, h, n, T);
    const Tensor final = model.final_hidden(h);
    const int64_t width = final.dim(-1);
    for (int64_t s = 0; s < n; ++s) {
      double total = 0.0;
      // Predictions come from positions 0..T-2 of the sequence.
      for (int64_t r0 = 0; r0 < T - 1; r0 += kLogitRowsPerSlab) {
        const int64_t rows = std::min(kLogitRowsPerSlab, T - 1 - r0);
        slab.resize({rows, width});
        std::memcpy(slab.data(), final.data() + (s * T + r0) * width,
                    static_cast<size_t>(rows * width) * sizeof(float));
        model.lm_head(slab, logits);
        const int32_t* next = batch_tokens.data() + s * T + r0 + 1;
#pragma omp parallel for reduction(+ : total) schedule(static) if (rows * vocab >= kParallelMinElements)
        for (int64_t r = 0; r < rows; ++r) total += row_nll(logits.data() + r * vocab, vocab, next[r]);
      }
      // NaN/Inf logits would only show up as a NaN perplexity at the end: name the chunk instead.
      SYMPRUNE_CHECK(std::isfinite(total),
                     "perplexity: chunk {} (tokens {}..{}) has a non-finite loss: the model's fp32 forward "
                     "produces NaN or Inf (overflowing or corrupt weights)",
                     c0 + s, (c0 + s) * T, (c0 + s + 1) * T - 1);
      result.chunk_nll.push_back(total / static_cast<double>(T - 1));
    }
    if (progress) progress(c0 + n, chunks);
  }
  double sum = 0.0;
  for (double v : result.chunk_nll) sum += v;
  result.mean_nll = sum / static_cast<double>(chunks);
  result.perplexity = std::exp(result.mean_nll);
  result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace symprune::model
