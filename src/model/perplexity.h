#pragma once
// Perplexity with the protocol of the pruning papers (reference-implementations.md §1.3): the text is
// tokenized once (one BOS at its start, done by the caller), cut into non-overlapping chunks of
// `seqlen` tokens with the tail dropped; each chunk's loss is the mean next-token NLL over its
// seqlen-1 predictions; PPL = exp(mean over chunks of the chunk losses).
#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "model/decoder_model.h"

namespace symprune::model {

// Chunks of `seqlen` tokens per forward pass by default: about 8192 tokens, one chunk at least.
inline int64_t default_batch_sequences(int64_t seqlen) {
  return std::max<int64_t>(1, 8192 / std::max<int64_t>(seqlen, 1));
}

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
// Called after each block with (blocks done, blocks total).
using BlockProgress = std::function<void(int64_t done, int64_t total)>;
// Runs one batch slot of local_chunk_nll: its work (the batch's final norm, head and NLLs, or nothing for a
// part that has run out of batches), with what must come before it. The default checks for an interrupt,
// then runs the work.
using BatchSlot = std::function<void(const std::function<void()>& batch)>;

// Perplexity computed block by block, for a pipeline that visits every block once (the pruning loop runs
// a dense and a pruned stream beside its calibration passes) and for evaluate_perplexity. The chunks are
// cut into batches of options.batch_sequences chunks (each batch one forward shape, the same however the
// work is split); batches are split over `parts` contiguously (dist::partition) and this stream holds
// part `part`'s hidden states. run_block(b) moves them through block b with the model's current weights;
// after the last block, local_chunk_nll() gives the NLL of each local chunk, in order. The chunks' NLLs of
// all parts, concatenated in part order, give the same perplexity as one stream over everything.
class PerplexityStream {
 public:
  // Throws symprune::Error like evaluate_perplexity for a bad seqlen or too few tokens.
  PerplexityStream(DecoderModel& model, std::span<const int32_t> tokens, const PerplexityOptions& options,
                   int parts = 1, int part = 0);
  int64_t chunks() const { return chunks_; }            // all parts
  int64_t first_chunk() const { return first_chunk_; }  // this part's
  int64_t local_chunks() const { return local_chunks_; }
  int64_t seqlen() const { return seqlen_; }
  int64_t tokens() const { return tokens_; }
  void run_block(int64_t block);
  // This part's hidden states, its chunks in order ([local_chunks · seqlen, d] values), for a checkpoint;
  // restore_hidden puts such values back (same part, any number of parts on the saving side).
  std::vector<float> local_hidden() const;
  void restore_hidden(std::span<const float> values);
  // Final norm, head and NLL, batch by batch; `progress` gets (local chunks done, local chunks). Each batch
  // runs inside a call of `slot`, and every part calls it the same number of times (batch_slots(): the
  // most batches a part holds; a part with fewer runs empty slots after its last batch), so that a slot
  // may be a collective: where the ranks agree to stop (or on an error) between batches.
  std::vector<double> local_chunk_nll(const PerplexityProgress& progress = {}, const BatchSlot& slot = {});
  int64_t batch_slots() const { return batch_slots_; }

 private:
  DecoderModel& model_;
  std::span<const int32_t> all_tokens_;
  int64_t seqlen_ = 0, chunks_ = 0, batch_ = 0, first_chunk_ = 0, local_chunks_ = 0, tokens_ = 0;
  int64_t batch_slots_ = 0;
  std::vector<Tensor> hidden_;  // per local batch
};

// The result from every chunk's NLL (all parts, chunk order): mean in chunk order, exp.
PerplexityResult perplexity_from_chunks(std::vector<double> chunk_nll, int64_t tokens, int64_t seqlen);

// Throws symprune::Error when seqlen < 2, seqlen exceeds the model's max_seq_len(), or the
// tokens do not fill one chunk ("N tokens, fewer than one chunk of T"). Runs one PerplexityStream over all
// blocks, evicting each block's stored weights after use (DecoderModel::evict_block).
PerplexityResult evaluate_perplexity(DecoderModel& model, std::span<const int32_t> tokens,
                                     const PerplexityOptions& options,
                                     const PerplexityProgress& progress = {},
                                     const BlockProgress& block_progress = {});

}  // namespace symprune::model
