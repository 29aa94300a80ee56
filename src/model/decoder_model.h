#pragma once
// LLaMA and OPT decoder-only models in fp32 on a core Backend, built for the layer-wise pipeline
// (DESIGN.md §3.5): embed(tokens) -> H [rows, d]; run_block(i, H, ...) in place, block by block,
// with an optional observer that sees every linear's input and output and optional replacement
// weights; final_logits(H). Block weights are loaded from safetensors on first use (converted from
// bf16/fp16/fp32) and can be released, so a big model need not be resident at once.
#include <compare>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"
#include "io/hf_config.h"
#include "io/model_layout.h"
#include "io/model_resolver.h"
#include "io/tensor_source.h"

namespace symprune::model {

// Names one linear layer: decoder block index and the Hugging Face module name inside the block,
// e.g. {3, "self_attn.q_proj"}, {0, "mlp.down_proj"} (LLaMA) or {1, "fc1"} (OPT).
struct LinearId {
  int64_t block = 0;
  std::string name;
  auto operator<=>(const LinearId&) const = default;
  // "model.layers.3.self_attn.q_proj" style is the caller's business; this is "3.self_attn.q_proj".
  std::string to_string() const;
};

// Sees each linear of a block as it runs: input [rows, n] and dense output [rows, m] (before
// RoPE / activation / scaling), which includes the linear's bias `output_bias` [m] (null without one: OPT
// has biases, LLaMA none). Rows are whole sequences of seq_len tokens, sequence-major: run_block may split
// a large batch into micro-batches of whole sequences (set_max_tokens_per_pass) and then calls the
// observer once per micro-batch, in sequence order.
class LinearObserver {
 public:
  virtual ~LinearObserver() = default;
  virtual void on_linear(const LinearId& id, const Tensor& input, const Tensor& output,
                         const Tensor* output_bias) = 0;
  // Whether on_linear takes the backend's own tensors (device memory on a device backend; the observer
  // then reads them through the backend). Otherwise a device backend hands it host copies.
  virtual bool reads_backend_tensors() const { return false; }
};

// Weights used instead of the stored ones (same shape [m, n]; the stored bias is kept).
using WeightOverrides = std::map<LinearId, Tensor>;

struct LinearWeights {
  Tensor weight;  // [m, n]
  Tensor bias;    // [m] or empty
};

struct BlockWeights {
  // LLaMA: norm1 = input_layernorm, norm2 = post_attention_layernorm (weights only).
  // OPT: norm1 = self_attn_layer_norm, norm2 = final_layer_norm (weight + bias, possibly empty).
  Tensor norm1_weight, norm1_bias, norm2_weight, norm2_bias;
  // Qwen3: self_attn.q_norm and k_norm, the RMSNorms of each head of q and k (empty elsewhere).
  Tensor q_norm_weight, k_norm_weight;
  std::map<std::string, LinearWeights> linears;  // by module name, e.g. "self_attn.q_proj"

  // The block's tensors other than the linears', with their names in the block ("input_layernorm.weight"),
  // the empty ones left out.
  std::vector<std::pair<std::string, const Tensor*>> norm_tensors(const io::ModelConfig& config) const;
};

// The canonical name prefix of block `block`'s tensors: "model.layers.3." (OPT "model.decoder.layers.3.").
std::string block_tensor_prefix(const io::ModelConfig& config, int64_t block);

// Assembles a block from its tensors: `tensor(e)` gives the fp32 value of each expected tensor
// (io::expected_block_tensors) in turn.
BlockWeights assemble_block_weights(const io::ModelConfig& config, int64_t block,
                                    const std::function<Tensor(const io::ExpectedTensor&)>& tensor);

// The Error for a NaN or ±Inf entry of a model tensor (entry `index` in row-major order of `shape`), one
// message for the tensors checked when the model opens and the block tensors the pipeline checks.
[[noreturn]] void fail_non_finite_tensor(std::string_view name, const std::vector<int64_t>& shape,
                                         int64_t index, float value);

// What --dtype NAME means for a model whose files store the linear weights in `stored`: "fp32", "bf16",
// "fp16", or "auto" (the stored dtype where the backend keeps it, else fp32: fp32 on the CPU). Throws for
// an unknown name and for a dtype the backend does not store (Backend::supports_dtype).
DType resolve_storage_dtype(std::string_view name, const Backend& backend, DType stored);
// The --dtype spelling of a weight dtype: "fp32", "bf16" or "fp16".
std::string_view dtype_option_name(DType dtype);

class DecoderModel {
 public:
  // Reads config.json, opens the weights of `dir` (io::open_weights_dir: safetensors or pytorch_model.bin),
  // validates every tensor the config implies (io::validate_model_tensors: names and shapes) and loads
  // embeddings, final norm and head.
  static DecoderModel open(const std::filesystem::path& dir, Backend& backend = cpu_backend());
  // What io::resolve_model found: a directory, or a synthetic model (generated, never stored).
  static DecoderModel open(const io::ResolvedModel& resolved, Backend& backend = cpu_backend());
  DecoderModel(DecoderModel&&) noexcept;
  DecoderModel& operator=(DecoderModel&&) noexcept;
  ~DecoderModel();

  const io::ModelConfig& config() const { return config_; }
  const std::filesystem::path& dir() const { return dir_; }  // empty for a synthetic model
  const io::TensorSource& tensors() const { return *weights_; }
  // config.json's path (or the synthetic model's name), for messages.
  std::string config_file() const { return config_.source.empty() ? "config.json" : config_.source; }
  int64_t num_blocks() const { return config_.num_layers; }
  int64_t hidden_size() const { return config_.hidden_size; }
  int64_t vocab_size() const { return config_.vocab_size; }
  // Positions a sequence may use (max_position_embeddings, or a shorter sliding window).
  int64_t max_seq_len() const { return config_.max_seq_len(); }
  // What bounds it: "max_position_embeddings N" or "sliding_window N" (ModelConfig::max_seq_len_limit).
  std::string max_seq_len_limit() const { return config_.max_seq_len_limit(); }
  // Linear module names of one block, in forward order.
  const std::vector<std::string>& linear_names() const;
  // Their weight shapes [out, in] (the same in every block).
  struct LinearShape {
    std::string name;
    int64_t out = 0, in = 0;
  };
  std::vector<LinearShape> linear_shapes() const;
  // Linears fed the very same input tensor, in forward order: LLaMA {q,k,v} {o} {gate,up} {down};
  // OPT {q,k,v} {out} {fc1} {fc2}.
  std::vector<std::vector<std::string>> linear_input_groups() const;
  Backend& backend() const { return *backend_; }

  // tokens: n_seqs · seq_len ids, sequence-major. Returns H [n_seqs·seq_len, hidden_size] in the storage
  // dtype (OPT: embeddings, project_in, learned positions). Throws for ids outside the vocabulary and
  // for seq_len above max_seq_len(). In a 16-bit storage dtype the sequences are embedded a micro-batch at
  // a time (set_max_tokens_per_pass) into H: never all of them in fp32 at once.
  Tensor embed(std::span<const int32_t> tokens, int64_t n_seqs, int64_t seq_len);

  // Runs decoder block `block` on hidden [n_seqs·seq_len, d] in place.
  void run_block(int64_t block, Tensor& hidden, int64_t n_seqs, int64_t seq_len,
                 LinearObserver* observer = nullptr, const WeightOverrides* overrides = nullptr);

  // Final norm (+ OPT project_out) and lm_head: hidden [rows, d] -> logits [rows, vocab].
  // `hidden` is left unchanged.
  Tensor final_logits(const Tensor& hidden);
  // The final-norm part alone (hidden [rows, d] -> [rows, head input width]) and the lm_head product,
  // so callers can produce logits for a few rows at a time.
  Tensor final_hidden(const Tensor& hidden);
  void lm_head(const Tensor& final_hidden_rows, Tensor& logits);

  // All blocks then final_logits, for one batch of equal-length sequences.
  Tensor forward(std::span<const int32_t> tokens, int64_t n_seqs, int64_t seq_len);

  // Block weights, loaded (and cached) on first use.
  const BlockWeights& block_weights(int64_t block);
  // Installs a block's weights obtained elsewhere (read by another rank and exchanged); they are used as
  // if block_weights(block) had loaded them (same eviction rules).
  void set_block_weights(int64_t block, BlockWeights weights);
  // Drops a cached block (it is reloaded from the files on next use). Blocks changed through
  // set_linear_weight are dropped too, losing the change.
  void release_block(int64_t block);
  // Drops a cached block unless its weights were changed with set_linear_weight (reloading would lose
  // the change); a caller done with a block calls it to bound memory.
  void evict_block(int64_t block);
  // Replaces a linear's weight in memory (e.g. with its pruned version) for all later runs; the
  // block stays resident from then on (never evicted by set_max_resident_blocks). Same shape required.
  void set_linear_weight(const LinearId& id, Tensor weight);
  // Keep at most this many blocks cached (least recently loaded released first); 0 = no limit.
  void set_max_resident_blocks(int64_t count) { max_resident_blocks_ = count; }
  // run_block processes at most this many tokens per micro-batch (whole sequences, at least one).
  void set_max_tokens_per_pass(int64_t tokens) { max_tokens_per_pass_ = tokens; }
  int64_t max_tokens_per_pass() const { return max_tokens_per_pass_; }
  // Called after each micro-batch of run_block with the number of sequences it ran, so that a caller can
  // show how far a long pass is (empty: none). On a device backend the work may still be queued then
  // (Backend::synchronize waits for it).
  void set_pass_progress(std::function<void(int64_t sequences)> progress) {
    pass_progress_ = std::move(progress);
  }

  // The dtype the files store the linear weights in (block 0's first linear): what --dtype auto means on
  // a device backend.
  DType stored_weight_dtype() const;
  // The name under which the model's files store the weight of linear `id` (OPT files may omit "model.").
  std::string stored_weight_name(const LinearId& id) const;
  // The dtype the linear weights (blocks and head) and the hidden states between blocks are kept in (a
  // run in lower precision, --dtype; fp32 by default). Set once, before any block is loaded; a value other
  // than fp32 needs a backend that stores it (Backend::supports_dtype). Every op still computes in fp32:
  // the linears multiply in this dtype and accumulate in fp32; run_block widens the states micro-batch by
  // micro-batch and rounds them back.
  void set_storage_dtype(DType dtype);
  DType storage_dtype() const { return storage_dtype_; }

 private:
  DecoderModel() = default;
  static DecoderModel open_source(std::unique_ptr<io::TensorSource> tensors, io::ModelConfig config,
                                  const std::filesystem::path& dir, Backend& backend);
  struct Workspace;
  void load_globals();
  BlockWeights load_block(int64_t block) const;
  // One block on the fp32 rows x, its result written into dst's rows from dst_row on (dst may be x). With
  // src, x is first filled from src's rows from src_row on (the block's first op reads them).
  struct BlockRows {
    Tensor& x;
    Tensor& dst;
    int64_t dst_row = 0;
    const Tensor* src = nullptr;
    int64_t src_row = 0;
  };
  void run_llama_block(int64_t block, const BlockWeights& w, BlockRows rows, int64_t n_seqs, int64_t seq_len,
                       LinearObserver* observer, const WeightOverrides* overrides);
  void run_opt_block(int64_t block, const BlockWeights& w, BlockRows rows, int64_t n_seqs, int64_t seq_len,
                     LinearObserver* observer, const WeightOverrides* overrides);
  // y [rows, heads·head_dim] = the RMSNorm of each head's head_dim values of x (Qwen3's q_norm, k_norm).
  void normalize_heads(Tensor& x, const Tensor& weight, float eps, Tensor& y);

  std::filesystem::path dir_;
  io::ModelConfig config_;
  std::unique_ptr<io::TensorSource> weights_;
  Backend* backend_ = nullptr;
  std::vector<std::string> linear_names_;
  std::vector<float> inv_freq_;

  // embed's fp32 rows of n_seqs whole sequences.
  Tensor embed_fp32(std::span<const int32_t> tokens, int64_t n_seqs, int64_t seq_len);

  Tensor embed_tokens_, embed_positions_, project_in_, project_out_, final_norm_weight_, final_norm_bias_,
      lm_head_;
  bool lm_head_tied_ = false;

  std::vector<std::unique_ptr<BlockWeights>> blocks_;
  std::vector<int64_t> load_order_;  // evictable cached blocks, oldest first
  int64_t max_resident_blocks_ = 0;
  int64_t max_tokens_per_pass_ = 16384;
  std::function<void(int64_t)> pass_progress_;
  DType storage_dtype_ = DType::kF32;
  std::unique_ptr<Workspace> workspace_;
};

}  // namespace symprune::model
