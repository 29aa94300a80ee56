#include "io/model_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <set>

#include "core/error.h"
#include "core/hashing.h"
#include "core/log.h"

namespace symprune::io {
namespace {

constexpr std::string_view kModelPrefix = "model.";

void add(std::vector<ExpectedTensor>& out, std::string name, std::vector<int64_t> shape,
         bool required = true) {
  out.push_back({std::move(name), std::move(shape), required});
}

void llama_block(const ModelConfig& c, int64_t i, std::vector<ExpectedTensor>& out) {
  const std::string p = fmt::format("model.layers.{}.", i);
  const int64_t d = c.hidden_size;
  const int64_t q = c.num_heads * c.head_dim;
  const int64_t kv = c.num_kv_heads * c.head_dim;
  const int64_t f = c.intermediate_size;
  add(out, p + "input_layernorm.weight", {d});
  const std::pair<const char*, std::vector<int64_t>> attention[] = {
      {"q_proj", {q, d}}, {"k_proj", {kv, d}}, {"v_proj", {kv, d}}, {"o_proj", {d, q}}};
  for (const auto& [name, shape] : attention) {
    add(out, p + "self_attn." + name + ".weight", shape);
    const bool has_bias = c.attention_bias || (c.qkv_bias && std::string_view(name) != "o_proj");
    if (has_bias) add(out, p + "self_attn." + name + ".bias", {shape[0]});
  }
  if (c.qk_norm) {
    add(out, p + "self_attn.q_norm.weight", {c.head_dim});
    add(out, p + "self_attn.k_norm.weight", {c.head_dim});
  }
  add(out, p + "post_attention_layernorm.weight", {d});
  const std::pair<const char*, std::vector<int64_t>> mlp[] = {
      {"gate_proj", {f, d}}, {"up_proj", {f, d}}, {"down_proj", {d, f}}};
  for (const auto& [name, shape] : mlp) {
    add(out, p + "mlp." + name + ".weight", shape);
    if (c.mlp_bias) add(out, p + "mlp." + name + ".bias", {shape[0]});
  }
}

void opt_layer_norm(const ModelConfig& c, const std::string& prefix, std::vector<ExpectedTensor>& out) {
  if (!c.layer_norm_elementwise_affine) return;  // LayerNorm without parameters
  add(out, prefix + ".weight", {c.hidden_size});
  add(out, prefix + ".bias", {c.hidden_size});
}

void opt_block(const ModelConfig& c, int64_t i, std::vector<ExpectedTensor>& out) {
  const std::string p = fmt::format("model.decoder.layers.{}.", i);
  const int64_t d = c.hidden_size;
  const int64_t f = c.intermediate_size;
  for (const char* name : {"q_proj", "k_proj", "v_proj", "out_proj"}) {
    add(out, p + "self_attn." + name + ".weight", {d, d});
    if (c.enable_bias) add(out, p + "self_attn." + name + ".bias", {d});
  }
  opt_layer_norm(c, p + "self_attn_layer_norm", out);
  add(out, p + "fc1.weight", {f, d});
  if (c.enable_bias) add(out, p + "fc1.bias", {f});
  add(out, p + "fc2.weight", {d, f});
  if (c.enable_bias) add(out, p + "fc2.bias", {d});
  opt_layer_norm(c, p + "final_layer_norm", out);
}

std::string config_name(const ModelConfig& config) {
  return config.source.empty() ? std::string("config.json") : config.source;
}

std::string describe_missing(const TensorSource& model, const ModelConfig& config,
                             std::string_view canonical) {
  std::string quantized;  // GPTQ, AWQ, bitsandbytes, FP8 ...: their tensors are qweight, scales, ...
  if (config.raw.is_object() && config.raw.contains("quantization_config") &&
      config.raw["quantization_config"].is_object()) {
    const nlohmann::json& q = config.raw["quantization_config"];
    const std::string method = q.contains("quant_method") && q["quant_method"].is_string()
                                   ? q["quant_method"].get<std::string>()
                                   : std::string("unnamed method");
    quantized = fmt::format(
        "; config.json has a quantization_config ({}): a quantized checkpoint stores other tensors, and "
        "symprune prunes F32, F16 or BF16 weights, so prune the unquantized model (and quantize the pruned "
        "one)",
        method);
  }
  return fmt::format("missing tensor '{}' in {} (required by {}){}", canonical, model.description(),
                     config_name(config), quantized);
}

// The decoder layer a stored tensor belongs to ("model.layers.7.mlp.up_proj.weight" -> 7), if any.
std::optional<int64_t> layer_of(std::string_view name) {
  for (const std::string_view prefix : {"model.layers.", "model.decoder.layers.", "decoder.layers."}) {
    if (!name.starts_with(prefix)) continue;
    const std::string_view rest = name.substr(prefix.size());
    int64_t layer = 0;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), layer);
    if (ec == std::errc() && end != rest.data() && end < rest.data() + rest.size() && *end == '.')
      return layer;
  }
  return std::nullopt;
}

// Tensors of layers past num_hidden_layers would never be pruned, yet be copied into the output:
// a config that undercounts the weights is refused instead of silently pruning part of the model.
void check_no_extra_layers(const ModelConfig& config, const TensorSource& model,
                           const std::vector<std::string>& names) {
  const std::string* first = nullptr;
  int64_t first_layer = 0;
  int64_t held = config.num_layers;
  for (const auto& name : names) {
    const auto layer = layer_of(name);
    if (!layer || *layer < config.num_layers) continue;
    held = std::max(held, *layer + 1);
    if (first == nullptr || *layer < first_layer) {
      first = &name;
      first_layer = *layer;
    }
  }
  if (first == nullptr) return;
  fail(
      "{}: num_hidden_layers is {} but the weights hold {} layers (tensor '{}' in {} is in layer {}); the "
      "layers past {} would be left unpruned",
      config_name(config), config.num_layers, held, *first, model.location(*first), first_layer,
      config.num_layers);
}

}  // namespace

std::vector<ExpectedTensor> expected_block_tensors(const ModelConfig& config, int64_t layer) {
  std::vector<ExpectedTensor> out;
  if (config.family == ModelFamily::kLlama) {
    llama_block(config, layer, out);
  } else {
    opt_block(config, layer, out);
  }
  return out;
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  std::vector<ExpectedTensor> out;
  const int64_t d = c.hidden_size;
  if (c.family == ModelFamily::kLlama) {
    add(out, "model.embed_tokens.weight", {c.vocab_size, d});
    for (int64_t i = 0; i < c.num_layers; ++i) llama_block(c, i, out);
    add(out, "model.norm.weight", {d});
    add(out, "lm_head.weight", {c.vocab_size, d}, !c.tie_word_embeddings);
    return out;
  }
  const int64_t proj = c.word_embed_proj_dim;
  add(out, "model.decoder.embed_tokens.weight", {c.vocab_size, proj});
  // OPT's learned positions reserve 2 extra rows (padding offset).
  add(out, "model.decoder.embed_positions.weight", {c.max_position_embeddings + 2, d});
  if (c.has_project_in_out()) {
    add(out, "model.decoder.project_in.weight", {d, proj});
    add(out, "model.decoder.project_out.weight", {proj, d});
  }
  for (int64_t i = 0; i < c.num_layers; ++i) opt_block(c, i, out);
  if (c.do_layer_norm_before && !c.remove_final_layer_norm)
    opt_layer_norm(c, "model.decoder.final_layer_norm", out);
  add(out, "lm_head.weight", {c.vocab_size, proj}, !c.tie_word_embeddings);
  return out;
}

std::string canonical_name(std::string_view stored_name, ModelFamily family) {
  if (family == ModelFamily::kOpt && stored_name.starts_with("decoder.")) {
    return std::string(kModelPrefix) + std::string(stored_name);
  }
  return std::string(stored_name);
}

std::optional<std::string> stored_tensor_name(const TensorSource& model, std::string_view canonical) {
  if (model.contains(canonical)) return std::string(canonical);
  if (canonical.starts_with("model.decoder.")) {
    const std::string_view bare = canonical.substr(kModelPrefix.size());
    if (model.contains(bare)) return std::string(bare);
  }
  return std::nullopt;
}

Tensor load_model_tensor(const TensorSource& model, const ModelConfig& config, std::string_view canonical,
                         const std::vector<int64_t>& shape) {
  const auto stored = stored_tensor_name(model, canonical);
  SYMPRUNE_CHECK(stored.has_value(), "{}", describe_missing(model, config, canonical));
  const TensorInfo& info = model.info(*stored);
  SYMPRUNE_CHECK(info.shape == shape, "tensor '{}' in {} has shape {} but {} implies {}", *stored,
                 model.location(*stored), shape_to_string(info.shape), config_name(config),
                 shape_to_string(shape));
  return model.load_f32(*stored);
}

namespace {

// A float tensor that config.json leaves out of the model. A linear's bias, or any parameter of a layer,
// means that the model computed would not be the checkpoint's (config.json without "attention_bias", a norm
// the architecture lacks): refused. Other leftovers are named.
void check_float_leftover(const ModelConfig& config, const TensorSource& model, const std::string& name,
                          const std::set<std::string>& used) {
  if (name.ends_with(".bias")) {
    const std::string weight = name.substr(0, name.size() - 5) + ".weight";
    if (used.count(weight) > 0) {
      // Mistral's and Qwen2's biases, and Qwen3's MLP's, are fixed by the architecture: no config field
      // adds one.
      const bool mlp = config.family == ModelFamily::kLlama && name.find(".mlp.") != std::string::npos;
      SYMPRUNE_CHECK(
          mlp ? config.mlp_bias_configurable() : config.attention_bias_configurable(),
          "{}: tensor '{}' is the bias of '{}', but transformers' {} architecture has no bias there "
          "(is config.json the one of this checkpoint?)",
          model.location(name), name, weight, config.model_type);
      const char* key = config.family == ModelFamily::kOpt ? "enable_bias"
                        : mlp                              ? "mlp_bias"
                                                           : "attention_bias";
      fail(
          "{}: tensor '{}' is the bias of '{}', but {} describes that linear without a bias (\"{}\" is false "
          "or absent): the model would be computed without it; set \"{}\": true if the checkpoint's "
          "linears have biases",
          model.location(name), name, weight, config_name(config), key, key);
    }
  }
  SYMPRUNE_CHECK(!layer_of(name).has_value(),
                 "{}: tensor '{}' is not part of the {} model that {} describes: the model would be computed "
                 "without it (is config.json the one of this checkpoint?)",
                 model.location(name), name, config.model_type, config_name(config));
  log::warn_on_root(
      "{}: tensor '{}' is not used by the model: ignored, and copied unchanged to a pruned model",
      model.location(name), name);
}

// FNV-1a over a tensor's stored bytes: two tensors compared one at a time (a head is the largest tensor).
uint64_t stored_bytes_digest(const TensorSource& model, const std::string& name) {
  std::vector<std::byte> bytes;
  model.read_bytes(name, bytes);
  Fnv1a64 hash;
  hash.update(bytes.data(), bytes.size());
  return hash.digest();
}

// A stored head that tie_word_embeddings makes unused: a copy of the embedding (the usual case) stays quiet.
// A different one makes the model ambiguous: the model computed here (the embedding as the head) is not the
// one other loaders compute (transformers 4.44 ties the two and keeps lm_head.weight's values for both), so
// a run refuses it, every rank alike, and inspect names it.
void check_unused_tied_head(const ModelConfig& config, const TensorSource& model, const std::string& head,
                            AmbiguousTiedHead policy) {
  if (policy == AmbiguousTiedHead::kWarn && !log::is_root()) return;
  const auto embedding =
      stored_tensor_name(model, config.family == ModelFamily::kOpt ? "model.decoder.embed_tokens.weight"
                                                                   : "model.embed_tokens.weight");
  if (!embedding) return;
  const TensorInfo& stored = model.info(head);
  const TensorInfo& embedded = model.info(*embedding);
  // Both shapes were checked against the config before this (the embedding comes first in
  // expected_tensors), so they are equal here.
  if (stored.dtype != embedded.dtype) {
    // Possibly the same values in another precision (bytes do not tell): named, not refused.
    if (log::is_root())
      log::warn(
          "{}: tensor '{}' is stored as {}, the embedding '{}' as {}, but {} sets tie_word_embeddings: the "
          "head is the embedding here (set tie_word_embeddings to false if '{}' is the model's head)",
          model.location(head), head, dtype_name(stored.dtype), *embedding, dtype_name(embedded.dtype),
          config_name(config), head);
    return;
  }
  if (stored_bytes_digest(model, head) == stored_bytes_digest(model, *embedding)) return;
  const std::string what = fmt::format(
      "{}: tensor '{}' differs from the embedding '{}', but {} sets tie_word_embeddings, which makes the "
      "embedding the head",
      model.location(head), head, *embedding, config_name(config));
  SYMPRUNE_CHECK(
      policy == AmbiguousTiedHead::kWarn,
      "{}: the model is ambiguous, since loaders keep either tensor's values for both (transformers "
      "keeps those of '{}'); set tie_word_embeddings to false if '{}' is the model's head, or remove "
      "it if the embedding is",
      what, head, head);
  log::warn(
      "{}; a run refuses such a model (set tie_word_embeddings to false if '{}' is the model's head, or "
      "remove it if the embedding is)",
      what, head);
}

}  // namespace

void validate_model_tensors(const ModelConfig& config, const TensorSource& model,
                            AmbiguousTiedHead tied_head) {
  // The last block first: a config.json claiming more layers than the files hold (num_hidden_layers 10^18)
  // fails here, before a list of every layer's tensors is built.
  if (config.num_layers > 0)
    for (const auto& expected : expected_block_tensors(config, config.num_layers - 1))
      SYMPRUNE_CHECK(!expected.required || stored_tensor_name(model, expected.name).has_value(), "{}",
                     describe_missing(model, config, expected.name));
  std::set<std::string> used;
  for (const auto& expected : expected_tensors(config)) {
    const auto stored = stored_tensor_name(model, expected.name);
    if (!stored) {
      SYMPRUNE_CHECK(!expected.required, "{}", describe_missing(model, config, expected.name));
      continue;
    }
    const TensorInfo& info = model.info(*stored);
    SYMPRUNE_CHECK(info.shape == expected.shape, "tensor '{}' in {} has shape {} but {} implies {}", *stored,
                   model.location(*stored), shape_to_string(info.shape), config_name(config),
                   shape_to_string(expected.shape));
    SYMPRUNE_CHECK(is_weight_dtype(info.dtype),
                   "{}: tensor '{}': unsupported dtype {} (supported: F32, F16, BF16)",
                   model.location(*stored), info.name, dtype_name(info.dtype));
    used.insert(*stored);
    if (config.tie_word_embeddings && expected.name == "lm_head.weight")
      check_unused_tied_head(config, model, *stored, tied_head);
  }
  const std::vector<std::string> names = model.names();
  check_no_extra_layers(config, model, names);
  for (const auto& name : names) {
    if (used.count(name) > 0) continue;
    const TensorInfo& info = model.info(name);
    // Rotary inv_freq buffers are routine leftovers; an integer or F64 tensor is worth a word, as
    // transformers gives one when it loads such a checkpoint.
    if (!is_weight_dtype(info.dtype)) {
      log::warn_on_root(
          "{}: tensor '{}' ({}) is not used by the model: ignored, and copied unchanged to a pruned model",
          model.location(name), name, dtype_name(info.dtype));
      continue;
    }
    if (name.ends_with("inv_freq")) continue;
    check_float_leftover(config, model, name, used);
  }
}

}  // namespace symprune::io
