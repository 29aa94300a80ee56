#pragma once
// Perplexity with the protocol of the pruning papers (reference-implementations.md §1.3): the text is
// tokenized once (one BOS at its start, done by the caller), cut into non-overlapping chunks of
// `seqlen` tokens with the tail dropped; each chunk's loss is the mean next-token NLL over its
// seqlen-1 predictions; PPL = exp(mean over chunks of the chunk losses).
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/decoder_model.h"

namespace symprune::model {

struct PerplexityOptions {
  int64_t seqlen = 2048;
  int64_t batch_sequences = 0;  // chunks per forward pass; 0 = max(1, 8192 / seqlen)
  int64_t max_chunks = 0;       // evaluate only the first K chunks; 0 = all
};

struct PerplexityResult {
  double perplexity = 0.0;
  double mean_nll = 0.0;         // mean over chunks of the chunk losses (natural log)
  int64_t chunks = 0;            // chunks evaluated
  int64_t tokens = 0;            // tokens in the input (BOS included)
  int64_t evaluated_tokens = 0;  // chunks · seqlen
  int64_t seqlen = 0;
  double wall_seconds = 0.0;
  std::vector<double> chunk_nll;  // per chunk loss, in order
};

// Called after each batch of chunks with (chunks done, chunks total).
using PerplexityProgress = std::function<void(int64_t done, int64_t total)>;

// Throws symprune::Error when seqlen < 2, seqlen exceeds the model's max_position_embeddings, or the
// tokens do not fill one chunk ("N tokens, fewer than one chunk of T").
PerplexityResult evaluate_perplexity(DecoderModel& model, std::span<const int32_t> tokens,
                                     const PerplexityOptions& options,
                                     const PerplexityProgress& progress = {});

// Mean next-token NLL of one sequence's logits [T, vocab] against its tokens (T-1 predictions),
// accumulated in double. Exposed for tests.
double sequence_mean_nll(const Tensor& logits, std::span<const int32_t> tokens);

}  // namespace symprune::model
