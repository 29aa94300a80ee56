#include "model/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/interrupt.h"
#include "dist/partition.h"

namespace symprune::model {
namespace {

constexpr int64_t kLogitRowsPerSlab = 512;  // bounds the [rows, vocab] logits buffer

// Σ of the backend's per-row NLLs, added in row order (independent of threads and backends).
double sum_row_nll(Backend& backend, const Tensor& logits, std::span<const int32_t> targets) {
  double total = 0.0;
  for (double v : backend.row_nll(logits, targets)) total += v;
  return total;
}

}  // namespace

PerplexityStream::PerplexityStream(DecoderModel& model, std::span<const int32_t> tokens,
                                   const PerplexityOptions& options, int parts, int part)
    : model_(model),
      all_tokens_(tokens),
      seqlen_(options.seqlen),
      tokens_(static_cast<int64_t>(tokens.size())) {
  const int64_t T = seqlen_;
  SYMPRUNE_CHECK(T >= 2, "perplexity needs a sequence length of at least 2, got {}", T);
  SYMPRUNE_CHECK(T <= model.max_seq_len(), "{}: sequence length {} exceeds {}", model.config_file(), T,
                 model.max_seq_len_limit());
  SYMPRUNE_CHECK(tokens_ >= T, "{} tokens, fewer than one chunk of {}", tokens_, T);
  chunks_ = tokens_ / T;  // the tail is dropped
  if (options.max_chunks > 0) chunks_ = std::min(chunks_, options.max_chunks);
  batch_ = options.batch_sequences > 0 ? options.batch_sequences : default_batch_sequences(T);
  const int64_t batches = (chunks_ + batch_ - 1) / batch_;
  const dist::Range mine = dist::partition(batches, parts, part);
  first_chunk_ = std::min(mine.begin * batch_, chunks_);
  local_chunks_ = std::min(mine.end * batch_, chunks_) - first_chunk_;
  batch_slots_ = (batches + parts - 1) / parts;  // the largest part's (partition sizes differ by one at most)
  for (int64_t c0 = first_chunk_; c0 < first_chunk_ + local_chunks_; c0 += batch_) {
    const int64_t n = std::min(batch_, first_chunk_ + local_chunks_ - c0);
    hidden_.push_back(
        model_.embed(all_tokens_.subspan(static_cast<size_t>(c0 * T), static_cast<size_t>(n * T)), n, T));
  }
}

void PerplexityStream::run_block(int64_t block) {
  for (Tensor& h : hidden_) {
    interrupt::check();
    model_.run_block(block, h, h.numel() / (seqlen_ * model_.hidden_size()), seqlen_);
  }
}

std::vector<float> PerplexityStream::local_hidden() const {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(local_chunks_ * seqlen_ * model_.hidden_size()));
  for (const Tensor& h : hidden_) {
    Tensor copy;
    const Tensor& host = model_.backend().host_view(h, copy);
    out.insert(out.end(), host.data(), host.data() + host.numel());
  }
  return out;
}

void PerplexityStream::restore_hidden(std::span<const float> values) {
  SYMPRUNE_CHECK(static_cast<int64_t>(values.size()) == local_chunks_ * seqlen_ * model_.hidden_size(),
                 "evaluation hidden states: {} values for {} chunks of {} x {}", values.size(), local_chunks_,
                 seqlen_, model_.hidden_size());
  size_t at = 0;
  for (Tensor& h : hidden_) {
    const auto count = static_cast<size_t>(h.numel());
    h = model_.backend().to_backend(
        Tensor(h.shape(), std::vector<float>(values.data() + at, values.data() + at + count)),
        model_.storage_dtype());
    at += count;
  }
}

std::vector<double> PerplexityStream::local_chunk_nll(const PerplexityProgress& progress,
                                                      const BatchSlot& slot) {
  const int64_t T = seqlen_;
  std::vector<double> nll;
  nll.reserve(static_cast<size_t>(local_chunks_));
  Backend& backend = model_.backend();
  Tensor slab, logits;
  int64_t c0 = first_chunk_;
  const auto score_batch = [&](Tensor& h) {
    const int64_t n = h.numel() / (T * model_.hidden_size());
    const Tensor final = model_.final_hidden(h);
    h = Tensor();  // this batch's hidden states are no longer needed
    const int64_t width = final.dim(-1);
    for (int64_t s = 0; s < n; ++s) {
      double total = 0.0;
      // Predictions come from positions 0..T-2 of the sequence.
      for (int64_t r0 = 0; r0 < T - 1; r0 += kLogitRowsPerSlab) {
        const int64_t rows = std::min(kLogitRowsPerSlab, T - 1 - r0);
        if (slab.shape() != std::vector<int64_t>{rows, width})
          slab = backend.to_backend(Tensor({rows, width}));
        backend.copy_rows(final, s * T + r0, slab, 0, rows);
        model_.lm_head(slab, logits);
        total += sum_row_nll(
            backend, logits,
            all_tokens_.subspan(static_cast<size_t>((c0 + s) * T + r0 + 1), static_cast<size_t>(rows)));
      }
      // NaN/Inf logits would only show up as a NaN perplexity at the end: name the chunk instead.
      SYMPRUNE_CHECK(std::isfinite(total),
                     "perplexity: chunk {} (tokens {}..{}) has a non-finite loss: the model's {} forward "
                     "produces NaN or Inf ({})",
                     c0 + s, (c0 + s) * T, (c0 + s + 1) * T - 1, dtype_option_name(model_.storage_dtype()),
                     model_.storage_dtype() == DType::kF16
                         ? "fp16 holds values up to 65504 only: use --dtype bf16 or fp32"
                         : "overflowing or corrupt weights");
      nll.push_back(total / static_cast<double>(T - 1));
    }
    c0 += n;
    if (progress) progress(c0 - first_chunk_, local_chunks_);
  };
  const BatchSlot run_slot = slot ? slot : [](const std::function<void()>& batch) {
    interrupt::check();
    batch();
  };
  SYMPRUNE_ASSERT(static_cast<int64_t>(hidden_.size()) <= batch_slots_, "{} local batches for {} slots",
                  hidden_.size(), batch_slots_);
  for (int64_t i = 0; i < batch_slots_; ++i) {
    const auto b = static_cast<size_t>(i);
    run_slot([&] {
      if (b < hidden_.size()) score_batch(hidden_[b]);
    });
  }
  hidden_.clear();
  return nll;
}

PerplexityResult perplexity_from_chunks(std::vector<double> chunk_nll, int64_t tokens, int64_t seqlen) {
  PerplexityResult result;
  result.tokens = tokens;
  result.seqlen = seqlen;
  result.chunks = static_cast<int64_t>(chunk_nll.size());
  result.evaluated_tokens = result.chunks * seqlen;
  double sum = 0.0;
  for (double v : chunk_nll) sum += v;
  result.mean_nll = sum / static_cast<double>(result.chunks);
  result.perplexity = std::exp(result.mean_nll);
  result.chunk_nll = std::move(chunk_nll);
  return result;
}

PerplexityResult evaluate_perplexity(DecoderModel& model, std::span<const int32_t> tokens,
                                     const PerplexityOptions& options, const PerplexityProgress& progress,
                                     const BlockProgress& block_progress) {
  const auto start = std::chrono::steady_clock::now();
  PerplexityStream stream(model, tokens, options);
  for (int64_t b = 0; b < model.num_blocks(); ++b) {
    stream.run_block(b);
    model.evict_block(b);  // one pass over the model: no block is needed twice
    if (block_progress) block_progress(b + 1, model.num_blocks());
  }
  PerplexityResult result =
      perplexity_from_chunks(stream.local_chunk_nll(progress), stream.tokens(), stream.seqlen());
  result.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

}  // namespace symprune::model
