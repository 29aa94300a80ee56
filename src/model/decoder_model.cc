#include "model/decoder_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/interrupt.h"
#include "io/model_layout.h"
#include "io/safetensors.h"
#include "io/synthetic_model.h"
#include "io/torch_checkpoint.h"

namespace symprune::model {

std::string LinearId::to_string() const {
  return std::to_string(block) + "." + name;
}

struct DecoderModel::Workspace {
  Tensor x;  // micro-batch hidden copy (only when the batch is split)
  Tensor h, q, k, v, attn, o, gate, up, act, down;
  Tensor q_normed, k_normed;  // q and k normalized per head (Qwen3)
};

namespace {

const std::vector<std::string> kLlamaLinears = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                "mlp.down_proj"};
const std::vector<std::string> kOptLinears = {
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "fc1", "fc2"};

constexpr int64_t kOptPositionOffset = 2;  // OPTLearnedPositionalEmbedding: position p uses row p + 2
constexpr float kOptLayerNormEps = 1e-5f;  // nn.LayerNorm default; OPT configs carry no eps

// NaN/Inf in the embeddings, the final norm or the head would show only as a non-finite loss at the end of a
// run (and not at all in a prune without evaluation, which would copy them): named when the model opens.
void check_finite(const Tensor& t, std::string_view name) {
  const int64_t i = first_non_finite(t);
  if (i >= 0) fail_non_finite_tensor(name, t.shape(), i, t.data()[i]);
}

}  // namespace

void fail_non_finite_tensor(std::string_view name, const std::vector<int64_t>& shape, int64_t index,
                            float value) {
  const int64_t width = shape.empty() ? 1 : shape.back();
  fail(
      "{}: entry {} is {}: the model's weights hold NaN or Inf (a damaged checkpoint, or one saved after a "
      "diverged training step); use a good checkpoint",
      name,
      shape.size() == 1 ? fmt::format("[{}]", index) : fmt::format("[{}, {}]", index / width, index % width),
      value);
}

DecoderModel::DecoderModel(DecoderModel&&) noexcept = default;
DecoderModel& DecoderModel::operator=(DecoderModel&&) noexcept = default;
DecoderModel::~DecoderModel() = default;

DecoderModel DecoderModel::open(const std::filesystem::path& dir, Backend& backend) {
  const auto config_path = dir / "config.json";
  SYMPRUNE_CHECK(std::filesystem::is_directory(dir), "{}: not a model directory", dir.string());
  SYMPRUNE_CHECK(std::filesystem::exists(config_path), "{}: missing config.json", dir.string());
  io::ModelConfig config = io::load_config(config_path);
  auto weights = io::open_weights_dir(dir);
  return open_source(std::move(weights), std::move(config), dir, backend);
}

DecoderModel DecoderModel::open(const io::ResolvedModel& resolved, Backend& backend) {
  if (!resolved.is_synthetic()) return open(resolved.dir, backend);
  auto synthetic = std::make_unique<io::SyntheticModel>(*resolved.synthetic);
  io::ModelConfig config = synthetic->config();
  return open_source(std::move(synthetic), std::move(config), {}, backend);
}

DecoderModel DecoderModel::open_source(std::unique_ptr<io::TensorSource> tensors, io::ModelConfig config,
                                       const std::filesystem::path& dir, Backend& backend) {
  DecoderModel m;
  m.dir_ = dir;
  m.config_ = std::move(config);
  m.weights_ = std::move(tensors);
  m.backend_ = &backend;
  m.workspace_ = std::make_unique<Workspace>();
  const auto& c = m.config_;
  const std::string config_path = c.source.empty() ? std::string("config.json") : c.source;
  if (c.family == io::ModelFamily::kLlama) {
    SYMPRUNE_CHECK(c.hidden_act == "silu", "{}: unsupported LLaMA hidden_act '{}' (supported: silu)",
                   config_path, c.hidden_act);
    m.linear_names_ = kLlamaLinears;
    std::optional<Llama3RopeScaling> scaling;
    // io::parse_config refused every other type, naming the supported ones.
    const std::string type = c.rope_scaling ? c.rope_scaling->type : "default";
    SYMPRUNE_ASSERT(type == "default" || type == "llama3" || type == "linear" || type == "dynamic",
                    "rope_scaling type '{}' passed io::parse_config", type);
    if (type == "llama3")
      scaling = Llama3RopeScaling{c.rope_scaling->factor, c.rope_scaling->low_freq_factor,
                                  c.rope_scaling->high_freq_factor,
                                  static_cast<double>(c.rope_scaling->original_max_position_embeddings)};
    m.inv_freq_ = rope_inv_freq(c.head_dim, c.rope_theta, scaling);
    // linear: positions divided by the factor, i.e. every frequency (transformers: inv_freq /= factor, in
    // fp32). dynamic (NTK): transformers raises theta only for sequences longer than max_position_embeddings,
    // which symprune refuses, so the frequencies are the plain ones.
    if (type == "linear")
      for (float& f : m.inv_freq_) f /= static_cast<float>(c.rope_scaling->factor);
  } else {
    SYMPRUNE_CHECK(c.activation_function == "relu",
                   "{}: unsupported OPT activation_function '{}' (supported: relu)", config_path,
                   c.activation_function);
    m.linear_names_ = kOptLinears;
  }
  io::validate_model_tensors(m.config_, *m.weights_);
  m.load_globals();
  if (backend.device_resident())
    for (Tensor* t : {&m.embed_tokens_, &m.embed_positions_, &m.project_in_, &m.project_out_,
                      &m.final_norm_weight_, &m.final_norm_bias_, &m.lm_head_})
      if (!t->empty()) *t = backend.to_backend(std::move(*t));
  m.blocks_.resize(static_cast<size_t>(c.num_layers));
  return m;
}

const std::vector<std::string>& DecoderModel::linear_names() const {
  return linear_names_;
}

std::vector<DecoderModel::LinearShape> DecoderModel::linear_shapes() const {
  const std::string prefix = block_tensor_prefix(config_, 0);
  std::vector<LinearShape> shapes;
  for (const auto& name : linear_names_)
    for (const auto& e : io::expected_block_tensors(config_, 0))
      if (e.name == prefix + name + ".weight") shapes.push_back({name, e.shape[0], e.shape[1]});
  SYMPRUNE_ASSERT(shapes.size() == linear_names_.size(), "linear shapes of {}", config_file());
  return shapes;
}

std::vector<std::vector<std::string>> DecoderModel::linear_input_groups() const {
  // Mirrors run_llama_block / run_opt_block: which linears read the same workspace tensor.
  if (config_.family == io::ModelFamily::kLlama)
    return {{"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"},
            {"self_attn.o_proj"},
            {"mlp.gate_proj", "mlp.up_proj"},
            {"mlp.down_proj"}};
  return {
      {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"}, {"self_attn.out_proj"}, {"fc1"}, {"fc2"}};
}

void DecoderModel::load_globals() {
  const auto& c = config_;
  const auto& st = *weights_;
  auto load = [&](const std::string& name, std::vector<int64_t> shape) {
    Tensor t = io::load_model_tensor(st, c, name, shape);
    check_finite(t, name);
    return t;
  };
  const int64_t d = c.hidden_size;
  const int64_t head_in = c.family == io::ModelFamily::kOpt ? c.word_embed_proj_dim : d;
  if (c.family == io::ModelFamily::kLlama) {
    embed_tokens_ = load("model.embed_tokens.weight", {c.vocab_size, d});
    final_norm_weight_ = load("model.norm.weight", {d});
  } else {
    embed_tokens_ = load("model.decoder.embed_tokens.weight", {c.vocab_size, head_in});
    embed_positions_ =
        load("model.decoder.embed_positions.weight", {c.max_position_embeddings + kOptPositionOffset, d});
    if (c.has_project_in_out()) {
      project_in_ = load("model.decoder.project_in.weight", {d, head_in});
      project_out_ = load("model.decoder.project_out.weight", {head_in, d});
    }
    if (c.do_layer_norm_before && !c.remove_final_layer_norm && c.layer_norm_elementwise_affine) {
      final_norm_weight_ = load("model.decoder.final_layer_norm.weight", {d});
      final_norm_bias_ = load("model.decoder.final_layer_norm.bias", {d});
    }
  }
  // transformers ties lm_head to the input embedding when tie_word_embeddings is set, whatever the file
  // holds under lm_head.weight.
  lm_head_tied_ = c.tie_word_embeddings;
  if (!lm_head_tied_) lm_head_ = load("lm_head.weight", {c.vocab_size, head_in});
}

std::string block_tensor_prefix(const io::ModelConfig& config, int64_t block) {
  return (config.family == io::ModelFamily::kLlama ? "model.layers." : "model.decoder.layers.") +
         std::to_string(block) + ".";
}

BlockWeights assemble_block_weights(const io::ModelConfig& c, int64_t block,
                                    const std::function<Tensor(const io::ExpectedTensor&)>& tensor) {
  const std::string p = block_tensor_prefix(c, block);
  BlockWeights w;
  // The layout module lists exactly the tensors this config implies (biases, affine norms).
  for (const auto& expected : io::expected_block_tensors(c, block)) {
    SYMPRUNE_ASSERT(expected.name.starts_with(p), "block tensor {} outside {}", expected.name, p);
    const std::string local = expected.name.substr(p.size());
    Tensor t = tensor(expected);
    SYMPRUNE_ASSERT(t.shape() == expected.shape, "{}: shape {} for {}", expected.name, t.shape_string(),
                    shape_to_string(expected.shape));
    const auto dot = local.rfind('.');
    const std::string module = local.substr(0, dot), kind = local.substr(dot + 1);
    if (module == "input_layernorm" || module == "self_attn_layer_norm") {
      (kind == "weight" ? w.norm1_weight : w.norm1_bias) = std::move(t);
    } else if (module == "post_attention_layernorm" || module == "final_layer_norm") {
      (kind == "weight" ? w.norm2_weight : w.norm2_bias) = std::move(t);
    } else if (module == "self_attn.q_norm" || module == "self_attn.k_norm") {
      SYMPRUNE_ASSERT(kind == "weight", "{}: a head norm has a weight only", expected.name);
      (module == "self_attn.q_norm" ? w.q_norm_weight : w.k_norm_weight) = std::move(t);
    } else {
      LinearWeights& lw = w.linears[module];
      (kind == "weight" ? lw.weight : lw.bias) = std::move(t);
    }
  }
  return w;
}

std::vector<std::pair<std::string, const Tensor*>> BlockWeights::norm_tensors(
    const io::ModelConfig& c) const {
  const bool llama = c.family == io::ModelFamily::kLlama;
  const std::pair<std::string, const Tensor*> all[] = {
      {llama ? "input_layernorm.weight" : "self_attn_layer_norm.weight", &norm1_weight},
      {"self_attn_layer_norm.bias", &norm1_bias},
      {"self_attn.q_norm.weight", &q_norm_weight},
      {"self_attn.k_norm.weight", &k_norm_weight},
      {llama ? "post_attention_layernorm.weight" : "final_layer_norm.weight", &norm2_weight},
      {"final_layer_norm.bias", &norm2_bias}};
  std::vector<std::pair<std::string, const Tensor*>> present;
  for (const auto& entry : all)
    if (!entry.second->empty()) present.push_back(entry);
  return present;
}

BlockWeights DecoderModel::load_block(int64_t block) const {
  BlockWeights w = assemble_block_weights(config_, block, [&](const io::ExpectedTensor& e) {
    return io::load_model_tensor(*weights_, config_, e.name, e.shape);
  });
  for (const auto& name : linear_names_)
    SYMPRUNE_ASSERT(w.linears.count(name) && !w.linears.at(name).weight.empty(), "block {} lacks {}", block,
                    name);
  return w;
}

DType resolve_storage_dtype(std::string_view name, const Backend& backend, DType stored) {
  if (name == "auto") return backend.supports_dtype(stored) ? stored : DType::kF32;
  DType dtype = DType::kF32;
  if (name == "bf16")
    dtype = DType::kBF16;
  else if (name == "fp16")
    dtype = DType::kF16;
  else
    SYMPRUNE_CHECK(name == "fp32", "--dtype: unknown dtype '{}' (auto, bf16, fp16 or fp32)", name);
  SYMPRUNE_CHECK(backend.supports_dtype(dtype),
                 "--dtype {}: the {} backend computes in fp32 only; lower precision runs on a GPU (--device "
                 "cuda)",
                 name, backend.name());
  return dtype;
}

std::string_view dtype_option_name(DType dtype) {
  switch (dtype) {
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "fp16";
    default:
      SYMPRUNE_ASSERT(dtype == DType::kF32, "dtype_option_name({})", dtype_name(dtype));
      return "fp32";
  }
}

DType DecoderModel::stored_weight_dtype() const {
  const std::string canonical = block_tensor_prefix(config_, 0) + linear_names_.front() + ".weight";
  const auto stored = io::stored_tensor_name(*weights_, canonical);  // OPT files may omit "model."
  SYMPRUNE_CHECK(stored.has_value(), "missing tensor '{}' in {}", canonical, weights_->description());
  return weights_->info(*stored).dtype;
}

std::string DecoderModel::stored_weight_name(const LinearId& id) const {
  const std::string canonical = block_tensor_prefix(config_, id.block) + id.name + ".weight";
  const auto stored = io::stored_tensor_name(*weights_, canonical);
  SYMPRUNE_ASSERT(stored.has_value(), "tensor {} vanished from {}", canonical, weights_->description());
  return *stored;
}

void DecoderModel::set_storage_dtype(DType dtype) {
  SYMPRUNE_ASSERT(std::none_of(blocks_.begin(), blocks_.end(), [](const auto& b) { return b != nullptr; }),
                  "set_storage_dtype after a block was loaded");
  SYMPRUNE_CHECK(backend_->supports_dtype(dtype), "the {} backend computes in fp32 only, not in {}",
                 backend_->name(), torch_dtype_name(dtype));
  storage_dtype_ = dtype;
  // The head is a linear: kept in the storage dtype too (a tied head as a converted copy of the embeddings).
  if (dtype != DType::kF32) lm_head_ = backend_->to_backend(lm_head_tied_ ? embed_tokens_ : lm_head_, dtype);
}

const BlockWeights& DecoderModel::block_weights(int64_t block) {
  SYMPRUNE_ASSERT(block >= 0 && block < num_blocks(), "block {} of {}", block, num_blocks());
  if (!blocks_[static_cast<size_t>(block)]) set_block_weights(block, load_block(block));
  return *blocks_[static_cast<size_t>(block)];
}

void DecoderModel::set_block_weights(int64_t block, BlockWeights weights) {
  SYMPRUNE_ASSERT(block >= 0 && block < num_blocks(), "block {} of {}", block, num_blocks());
  auto& slot = blocks_[static_cast<size_t>(block)];
  std::erase(load_order_, block);
  if (max_resident_blocks_ > 0) {
    while (static_cast<int64_t>(load_order_.size()) >= max_resident_blocks_) {
      blocks_[static_cast<size_t>(load_order_.front())].reset();
      load_order_.erase(load_order_.begin());
    }
  }
  if (backend_->device_resident()) {
    for (Tensor* t : {&weights.norm1_weight, &weights.norm1_bias, &weights.norm2_weight, &weights.norm2_bias,
                      &weights.q_norm_weight, &weights.k_norm_weight})
      if (!t->empty()) *t = backend_->to_backend(std::move(*t));
    for (auto& [name, lw] : weights.linears) {
      lw.weight = backend_->to_backend(std::move(lw.weight), storage_dtype_);
      if (!lw.bias.empty()) lw.bias = backend_->to_backend(std::move(lw.bias));
    }
  }
  slot = std::make_unique<BlockWeights>(std::move(weights));
  load_order_.push_back(block);
}

void DecoderModel::set_linear_weight(const LinearId& id, Tensor weight) {
  SYMPRUNE_CHECK(id.block >= 0 && id.block < num_blocks(), "block index {} outside [0, {})", id.block,
                 num_blocks());
  block_weights(id.block);
  auto& linears = blocks_[static_cast<size_t>(id.block)]->linears;
  auto it = linears.find(id.name);
  SYMPRUNE_CHECK(it != linears.end(), "unknown linear '{}'", id.to_string());
  SYMPRUNE_CHECK(weight.shape() == it->second.weight.shape(), "new weight for '{}' has shape {}, expected {}",
                 id.to_string(), weight.shape_string(), it->second.weight.shape_string());
  it->second.weight = backend_->to_backend(std::move(weight), storage_dtype_);
  std::erase(load_order_, id.block);  // pinned: eviction would silently restore the stored weight
}

void DecoderModel::evict_block(int64_t block) {
  SYMPRUNE_ASSERT(block >= 0 && block < num_blocks(), "block {} of {}", block, num_blocks());
  if (std::find(load_order_.begin(), load_order_.end(), block) == load_order_.end())
    return;  // pinned or absent
  release_block(block);
}

void DecoderModel::release_block(int64_t block) {
  SYMPRUNE_ASSERT(block >= 0 && block < num_blocks(), "block {} of {}", block, num_blocks());
  blocks_[static_cast<size_t>(block)].reset();
  std::erase(load_order_, block);
}

Tensor DecoderModel::embed(std::span<const int32_t> tokens, int64_t n_seqs, int64_t seq_len) {
  SYMPRUNE_CHECK(n_seqs >= 1 && seq_len >= 1, "embed: need at least one sequence of one token (got {}x{})",
                 n_seqs, seq_len);
  SYMPRUNE_CHECK(static_cast<int64_t>(tokens.size()) == n_seqs * seq_len, "embed: {} tokens for {} x {}",
                 tokens.size(), n_seqs, seq_len);
  SYMPRUNE_CHECK(seq_len <= max_seq_len(), "{}: sequence length {} exceeds {}", config_file(), seq_len,
                 max_seq_len_limit());
  for (size_t i = 0; i < tokens.size(); ++i)
    SYMPRUNE_CHECK(tokens[i] >= 0 && tokens[i] < vocab_size(),
                   "token id {} at position {} outside the vocabulary [0, {}) of {}", tokens[i], i,
                   vocab_size(), dir_.empty() ? weights_->description() : dir_.string());
  if (storage_dtype_ == DType::kF32) return embed_fp32(tokens, n_seqs, seq_len);
  // fp32 rows of one micro-batch at a time, rounded into H: the memory plan counts H in 16 bits and one
  // micro-batch's fp32 activations, not all of H in fp32 beside its 16-bit copy.
  Backend& be = *backend_;
  Tensor h = be.allocate({n_seqs * seq_len, hidden_size()}, storage_dtype_);
  const int64_t per_pass = std::max<int64_t>(1, max_tokens_per_pass_ / seq_len);
  for (int64_t first = 0; first < n_seqs; first += per_pass) {
    const int64_t seqs = std::min(per_pass, n_seqs - first);
    const Tensor part =
        embed_fp32(tokens.subspan(static_cast<size_t>(first * seq_len), static_cast<size_t>(seqs * seq_len)),
                   seqs, seq_len);
    be.copy_rows(part, 0, h, first * seq_len, seqs * seq_len);
  }
  return h;
}

Tensor DecoderModel::embed_fp32(std::span<const int32_t> tokens, int64_t n_seqs, int64_t seq_len) {
  Backend& be = *backend_;
  Tensor h;
  be.embedding(embed_tokens_, tokens, h);
  if (config_.family == io::ModelFamily::kOpt) {
    if (!project_in_.empty()) {
      Tensor projected;
      be.linear(h, project_in_, nullptr, projected);
      h = std::move(projected);
    }
    be.add_position_rows(h, embed_positions_, SequenceBatch{n_seqs, seq_len}, kOptPositionOffset);
  }
  return h;
}

void DecoderModel::run_block(int64_t block, Tensor& hidden, int64_t n_seqs, int64_t seq_len,
                             LinearObserver* observer, const WeightOverrides* overrides) {
  SYMPRUNE_CHECK(block >= 0 && block < num_blocks(), "block index {} outside [0, {})", block, num_blocks());
  const int64_t d = hidden_size();
  SYMPRUNE_CHECK(hidden.numel() == n_seqs * seq_len * d, "run_block: hidden {} is not {} x {} x {}",
                 hidden.shape_string(), n_seqs, seq_len, d);
  SYMPRUNE_CHECK(seq_len <= max_seq_len(), "{}: sequence length {} exceeds {}", config_file(), seq_len,
                 max_seq_len_limit());
  if (overrides) {
    for (const auto& [id, tensor] : *overrides) {
      if (id.block != block) continue;
      const auto& lw = block_weights(block).linears;
      auto it = lw.find(id.name);
      SYMPRUNE_CHECK(it != lw.end(), "weight override for unknown linear '{}'", id.to_string());
      SYMPRUNE_CHECK(tensor.shape() == it->second.weight.shape(),
                     "weight override for '{}' has shape {}, expected {}", id.to_string(),
                     tensor.shape_string(), it->second.weight.shape_string());
    }
  }
  const BlockWeights& w = block_weights(block);
  const auto original_shape = hidden.shape();
  hidden.reshape({n_seqs * seq_len, d});
  const int64_t per_pass = std::max<int64_t>(1, max_tokens_per_pass_ / seq_len);
  auto run = [&](BlockRows rows, int64_t seqs) {
    if (config_.family == io::ModelFamily::kLlama)
      run_llama_block(block, w, rows, seqs, seq_len, observer, overrides);
    else
      run_opt_block(block, w, rows, seqs, seq_len, observer, overrides);
  };
  // States stored in another dtype than fp32 are widened into the fp32 micro-batch buffer by the block's
  // first op, and the block writes its result back into their rows.
  if (per_pass >= n_seqs && hidden.dtype() == DType::kF32) {
    run({hidden, hidden}, n_seqs);
    if (pass_progress_ && n_seqs > 0) pass_progress_(n_seqs);
  } else {
    Tensor& x = workspace_->x;
    for (int64_t s0 = 0; s0 < n_seqs; s0 += per_pass) {
      interrupt::check();
      const int64_t seqs = std::min(per_pass, n_seqs - s0);
      const int64_t rows = seqs * seq_len;
      if (x.shape() != std::vector<int64_t>{rows, d} || x.on_device() != hidden.on_device() ||
          x.dtype() != DType::kF32)
        x = backend_->allocate({rows, d});
      run({x, hidden, s0 * seq_len, &hidden, s0 * seq_len}, seqs);
      if (pass_progress_) pass_progress_(seqs);
    }
  }
  hidden.reshape(original_shape);
}

namespace {

// Applies one linear (with override) and reports it to the observer.
struct LinearRunner {
  Backend& be;
  int64_t block;
  const BlockWeights& w;
  LinearObserver* observer;
  const WeightOverrides* overrides;

  void operator()(const std::string& name, const Tensor& in, Tensor& out) const {
    const LinearWeights& lw = w.linears.at(name);
    const Tensor* weight = &lw.weight;
    LinearId id{block, name};
    Tensor uploaded;
    if (overrides) {
      auto it = overrides->find(id);
      if (it != overrides->end()) weight = &it->second;
      // Overrides are host tensors (the engine's refinement); a device backend takes a copy per use.
      if (be.device_resident() && !weight->on_device()) {
        uploaded = be.to_backend(*weight, lw.weight.dtype());
        weight = &uploaded;
      }
    }
    const Tensor* bias = lw.bias.empty() ? nullptr : &lw.bias;
    be.linear(in, *weight, bias, out);
    if (!observer) return;
    // Observers that read host tensors get host copies from a device backend.
    if (be.device_resident() && !observer->reads_backend_tensors()) {
      const Tensor host_bias = bias ? be.to_host(*bias) : Tensor();
      observer->on_linear(id, be.to_host(in), be.to_host(out), bias ? &host_bias : nullptr);
    } else {
      observer->on_linear(id, in, out, bias);
    }
  }
};

const Tensor* non_empty(const Tensor& t) {
  return t.empty() ? nullptr : &t;
}

// Whether every linear of the block multiplies a weight of `dtype` (an override on the device its own, a host
// one uploaded in the block's dtype, as LinearRunner does).
bool linears_of_dtype(int64_t block, const BlockWeights& w, const WeightOverrides* overrides, DType dtype) {
  for (const auto& [name, lw] : w.linears) {
    DType weight_dtype = lw.weight.dtype();
    if (overrides) {
      auto it = overrides->find(LinearId{block, name});
      if (it != overrides->end() && it->second.on_device()) weight_dtype = it->second.dtype();
    }
    if (weight_dtype != dtype) return false;
  }
  return true;
}

}  // namespace

void DecoderModel::run_llama_block(int64_t block, const BlockWeights& w, BlockRows rows, int64_t n_seqs,
                                   int64_t seq_len, LinearObserver* observer,
                                   const WeightOverrides* overrides) {
  Backend& be = *backend_;
  Tensor& x = rows.x;
  Workspace& ws = *workspace_;
  const auto& c = config_;
  const SequenceBatch batch{n_seqs, seq_len};
  const LinearRunner linear{be, block, w, observer, overrides};
  const float eps = static_cast<float>(c.rms_norm_eps);
  // How the intermediate results are read (Backend::rms_norm's read_as): in a run in lower precision, q and
  // k after RoPE only as attention's operands, rounded to the storage dtype; and when no observer reads the
  // linears' inputs in fp32, the norms', the attention's and SiLU's outputs only as inputs of linears of
  // that dtype. A device backend then keeps only their rounded values (a pass less over each).
  const DType operands = storage_dtype_;
  const DType linear_inputs = observer == nullptr && linears_of_dtype(block, w, overrides, storage_dtype_)
                                  ? storage_dtype_
                                  : DType::kF32;

  if (rows.src)
    be.copy_rows_rms_norm(*rows.src, rows.src_row, x, w.norm1_weight, eps, ws.h, linear_inputs);
  else
    be.rms_norm(x, w.norm1_weight, eps, ws.h, linear_inputs);
  linear("self_attn.q_proj", ws.h, ws.q);
  linear("self_attn.k_proj", ws.h, ws.k);
  linear("self_attn.v_proj", ws.h, ws.v);
  if (c.qk_norm) {
    normalize_heads(ws.q, w.q_norm_weight, eps, ws.q_normed);
    normalize_heads(ws.k, w.k_norm_weight, eps, ws.k_normed);
  }
  Tensor& q = c.qk_norm ? ws.q_normed : ws.q;
  Tensor& k = c.qk_norm ? ws.k_normed : ws.k;
  be.rope(q, batch, c.num_heads, inv_freq_, operands);
  be.rope(k, batch, c.num_kv_heads, inv_freq_, operands);
  be.attention(q, k, ws.v, batch, c.num_heads, c.num_kv_heads,
               static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim))), ws.attn, operands,
               linear_inputs);
  linear("self_attn.o_proj", ws.attn, ws.o);
  be.add_rms_norm(x, ws.o, w.norm2_weight, eps, ws.h, linear_inputs);
  linear("mlp.gate_proj", ws.h, ws.gate);
  linear("mlp.up_proj", ws.h, ws.up);
  be.silu_mul(ws.gate, ws.up, ws.act, linear_inputs);
  linear("mlp.down_proj", ws.act, ws.down);
  be.add_into_rows(x, ws.down, rows.dst, rows.dst_row);
}

void DecoderModel::normalize_heads(Tensor& x, const Tensor& weight, float eps, Tensor& y) {
  const auto shape = x.shape();
  const std::vector<int64_t> heads{x.numel() / config_.head_dim, config_.head_dim};
  x.reshape(heads);  // viewed per head for the op, then as it was
  // y keeps its buffer from one micro-batch to the next (a backend reallocates an output of another shape,
  // and a device one would lose the rounded copy its RoPE keeps).
  if (y.numel() == x.numel()) y.reshape(heads);
  backend_->rms_norm(x, weight, eps, y);
  x.reshape(shape);
  y.reshape(shape);
}

void DecoderModel::run_opt_block(int64_t block, const BlockWeights& w, BlockRows rows, int64_t n_seqs,
                                 int64_t seq_len, LinearObserver* observer,
                                 const WeightOverrides* overrides) {
  Backend& be = *backend_;
  Tensor& x = rows.x;
  if (rows.src) be.copy_rows(*rows.src, rows.src_row, x, 0, n_seqs * seq_len);
  Workspace& ws = *workspace_;
  const auto& c = config_;
  const SequenceBatch batch{n_seqs, seq_len};
  const LinearRunner linear{be, block, w, observer, overrides};
  const bool pre = c.do_layer_norm_before;

  const Tensor* attn_in = &x;
  if (pre) {
    be.layer_norm(x, non_empty(w.norm1_weight), non_empty(w.norm1_bias), kOptLayerNormEps, ws.h);
    attn_in = &ws.h;
  }
  linear("self_attn.q_proj", *attn_in, ws.q);
  linear("self_attn.k_proj", *attn_in, ws.k);
  linear("self_attn.v_proj", *attn_in, ws.v);
  // OPT scales q by head_dim^-0.5 after q_proj; folding it into the scores is the same product.
  be.attention(ws.q, ws.k, ws.v, batch, c.num_heads, c.num_kv_heads,
               static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim))), ws.attn, storage_dtype_);
  linear("self_attn.out_proj", ws.attn, ws.o);
  be.add(x, ws.o);
  if (!pre) {
    be.layer_norm(x, non_empty(w.norm1_weight), non_empty(w.norm1_bias), kOptLayerNormEps, ws.h);
    std::swap(x, ws.h);
  }

  const Tensor* mlp_in = &x;
  if (pre) {
    be.layer_norm(x, non_empty(w.norm2_weight), non_empty(w.norm2_bias), kOptLayerNormEps, ws.h);
    mlp_in = &ws.h;
  }
  linear("fc1", *mlp_in, ws.gate);
  be.relu(ws.gate);
  linear("fc2", ws.gate, ws.down);
  if (pre) {
    be.add_into_rows(x, ws.down, rows.dst, rows.dst_row);
    return;
  }
  be.add(x, ws.down);
  be.layer_norm(x, non_empty(w.norm2_weight), non_empty(w.norm2_bias), kOptLayerNormEps, ws.h);
  std::swap(x, ws.h);
  if (&rows.dst != &x) be.copy_rows(x, 0, rows.dst, rows.dst_row, n_seqs * seq_len);
}

Tensor DecoderModel::final_hidden(const Tensor& stored_hidden) {
  Backend& be = *backend_;
  // The final norm reads fp32: states stored in another dtype are widened (a copy).
  Tensor widened;
  const Tensor& hidden = be.fp32_view(stored_hidden, widened);
  Tensor out;
  if (config_.family == io::ModelFamily::kLlama) {
    be.rms_norm(hidden, final_norm_weight_, static_cast<float>(config_.rms_norm_eps), out);
    return out;
  }
  const bool has_final_norm = config_.do_layer_norm_before && !config_.remove_final_layer_norm;
  if (has_final_norm)
    be.layer_norm(hidden, non_empty(final_norm_weight_), non_empty(final_norm_bias_), kOptLayerNormEps, out);
  else
    out = hidden;
  if (!project_out_.empty()) {
    Tensor projected;
    be.linear(out, project_out_, nullptr, projected);
    return projected;
  }
  return out;
}

void DecoderModel::lm_head(const Tensor& final_hidden_rows, Tensor& logits) {
  const bool own_head = !lm_head_tied_ || storage_dtype_ != DType::kF32;
  backend_->linear(final_hidden_rows, own_head ? lm_head_ : embed_tokens_, nullptr, logits);
}

Tensor DecoderModel::final_logits(const Tensor& hidden) {
  Tensor logits;
  lm_head(final_hidden(hidden), logits);
  return logits;
}

Tensor DecoderModel::forward(std::span<const int32_t> tokens, int64_t n_seqs, int64_t seq_len) {
  Tensor h = embed(tokens, n_seqs, seq_len);
  for (int64_t b = 0; b < num_blocks(); ++b) run_block(b, h, n_seqs, seq_len);
  return final_logits(h);
}

}  // namespace symprune::model
