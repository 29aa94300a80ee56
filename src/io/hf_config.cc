#include "io/hf_config.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "core/error.h"
#include "io/json_util.h"

namespace symprune::io {
namespace {

constexpr const char* kSupportedTypes = "llama, mistral, qwen2, qwen3, opt";

// Typed field access with transformers' defaults; every error names the source file and the key.
class Fields {
 public:
  Fields(const nlohmann::json& json, const std::string& source) : json_(json), source_(source) {}

  bool has(const char* key) const { return json_.contains(key) && !json_[key].is_null(); }

  int64_t integer(const char* key, int64_t fallback) const {
    if (!has(key)) return fallback;
    return to_integer(json_[key], key);
  }
  std::optional<int64_t> optional_integer(const char* key) const {
    if (!has(key)) return std::nullopt;
    return to_integer(json_[key], key);
  }
  // eos_token_id may be a list in LLaMA-3.1 configs; the first entry is the primary one.
  std::optional<int64_t> token_id(const char* key) const {
    if (!has(key)) return std::nullopt;
    const auto& value = json_[key];
    if (value.is_array()) {
      if (value.empty()) return std::nullopt;
      return to_integer(value[0], key);
    }
    return to_integer(value, key);
  }
  double number(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    return to_number(json_[key], key);
  }
  bool boolean(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    SYMPRUNE_CHECK(json_[key].is_boolean(), "{}: \"{}\" must be true or false, got {}", source_, key,
                   json_[key].dump());
    return json_[key].get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    SYMPRUNE_CHECK(json_[key].is_string(), "{}: \"{}\" must be a string, got {}", source_, key,
                   json_[key].dump());
    return json_[key].get<std::string>();
  }

  int64_t to_integer(const nlohmann::json& value, const std::string& key) const {
    if (value.is_number_unsigned()) {
      const uint64_t u = value.get<uint64_t>();
      SYMPRUNE_CHECK(u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                     "{}: \"{}\" = {} is too large", source_, key, u);
      return static_cast<int64_t>(u);
    }
    SYMPRUNE_CHECK(value.is_number_integer(), "{}: \"{}\" must be an integer, got {}", source_, key,
                   value.dump());
    return value.get<int64_t>();
  }
  double to_number(const nlohmann::json& value, const std::string& key) const {
    SYMPRUNE_CHECK(value.is_number(), "{}: \"{}\" must be a number, got {}", source_, key, value.dump());
    const double v = value.get<double>();
    SYMPRUNE_CHECK(std::isfinite(v), "{}: \"{}\" must be finite", source_, key);
    return v;
  }

 private:
  const nlohmann::json& json_;
  const std::string& source_;
};

void check_positive(int64_t value, const char* key, const std::string& source) {
  SYMPRUNE_CHECK(value > 0, "{}: \"{}\" must be positive, got {}", source, key, value);
}

// The scaling part of a RoPE object (`name`: "rope_scaling" or "rope_parameters"); nullopt for none.
std::optional<RopeScaling> parse_rope_object(const nlohmann::json& rs, const char* name,
                                             const std::string& source) {
  const Fields f(rs, source);
  // Newer files write "rope_type", older ones "type"; transformers accepts both.
  const std::string type = f.string("rope_type", f.string("type", ""));
  if (type.empty()) {
    // transformers refuses a scaling without its type; read as none, the model would run unscaled.
    for (const auto& [key, value] : rs.items())
      SYMPRUNE_CHECK(key == "rope_theta" || key == "partial_rotary_factor",
                     "{}: {} has \"{}\" but no \"rope_type\" (or \"type\"): say which RoPE scaling it is "
                     "(supported: llama3, linear, dynamic, or default for none)",
                     source, name, key);
    return std::nullopt;
  }
  if (type == "default") return std::nullopt;
  SYMPRUNE_CHECK(type == "llama3" || type == "linear" || type == "dynamic",
                 "{}: {} type '{}' is not supported (supported: llama3, linear, dynamic, or none)", source,
                 name, type);
  RopeScaling out;
  out.type = type;
  SYMPRUNE_CHECK(f.has("factor"), "{}: {} of type {} needs \"factor\"", source, name, type);
  out.factor = f.number("factor", 1.0);
  SYMPRUNE_CHECK(out.factor > 0, "{}: {} factor must be positive, got {}", source, name, out.factor);
  if (type != "llama3") return out;  // linear and dynamic take the factor alone
  for (const char* key : {"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    SYMPRUNE_CHECK(f.has(key), "{}: {} of type llama3 needs \"{}\"", source, name, key);
  }
  out.low_freq_factor = f.number("low_freq_factor", 1.0);
  out.high_freq_factor = f.number("high_freq_factor", 4.0);
  out.original_max_position_embeddings = f.integer("original_max_position_embeddings", 8192);
  SYMPRUNE_CHECK(out.low_freq_factor > 0, "{}: {} low_freq_factor must be positive, got {}", source, name,
                 out.low_freq_factor);
  // The llama3 formula divides by (high_freq_factor - low_freq_factor).
  SYMPRUNE_CHECK(out.high_freq_factor > out.low_freq_factor,
                 "{}: {} high_freq_factor ({}) must be greater than low_freq_factor ({})", source, name,
                 out.high_freq_factor, out.low_freq_factor);
  SYMPRUNE_CHECK(out.original_max_position_embeddings > 0,
                 "{}: \"{}.original_max_position_embeddings\" must be positive, got {}", source, name,
                 out.original_max_position_embeddings);
  return out;
}

// RoPE settings. transformers before 5 writes "rope_theta" and "rope_scaling" {"rope_type" or "type", ...};
// transformers 5 writes "rope_parameters" {"rope_type", "rope_theta", ...} instead. Both are read (the
// default theta 10000 applies only when neither names one); a file holding both must agree.
void parse_rope(const Fields& f, const nlohmann::json& json, ModelConfig& c) {
  // transformers rotates only part of each head for partial_rotary_factor < 1; symprune rotates all of it.
  const auto check_full_rotation = [&](const Fields& fields, const char* where) {
    if (fields.has("partial_rotary_factor"))
      SYMPRUNE_CHECK(fields.number("partial_rotary_factor", 1.0) == 1.0,
                     "{}: {}partial_rotary_factor {} is not supported (only 1: RoPE on the whole head)",
                     c.source, where, fields.number("partial_rotary_factor", 1.0));
  };
  check_full_rotation(f, "");
  const std::optional<double> legacy_theta =
      f.has("rope_theta") ? std::optional<double>(f.number("rope_theta", 0.0)) : std::nullopt;
  std::optional<RopeScaling> legacy_scaling;
  const bool has_legacy_scaling = json.contains("rope_scaling") && !json["rope_scaling"].is_null();
  if (has_legacy_scaling) {
    SYMPRUNE_CHECK(json["rope_scaling"].is_object(), "{}: \"rope_scaling\" must be an object or null, got {}",
                   c.source, json["rope_scaling"].dump());
    legacy_scaling = parse_rope_object(json["rope_scaling"], "rope_scaling", c.source);
  }
  c.rope_theta = legacy_theta.value_or(10000.0);
  c.rope_scaling = legacy_scaling;
  if (!json.contains("rope_parameters") || json["rope_parameters"].is_null()) return;

  const auto& rp = json["rope_parameters"];
  SYMPRUNE_CHECK(rp.is_object(), "{}: \"rope_parameters\" must be an object or null, got {}", c.source,
                 rp.dump());
  for (const auto& [key, value] : rp.items())
    SYMPRUNE_CHECK(!value.is_object(),
                   "{}: rope_parameters per attention type (\"{}\": {{...}}) are not supported for llama",
                   c.source, key);
  const Fields p(rp, c.source);
  check_full_rotation(p, "rope_parameters.");
  if (p.has("rope_theta")) {
    const double theta = p.number("rope_theta", 0.0);
    SYMPRUNE_CHECK(!legacy_theta || *legacy_theta == theta,
                   "{}: \"rope_theta\" ({}) and rope_parameters.rope_theta ({}) disagree", c.source,
                   *legacy_theta, theta);
    c.rope_theta = theta;
  }
  const std::optional<RopeScaling> scaling = parse_rope_object(rp, "rope_parameters", c.source);
  SYMPRUNE_CHECK(!has_legacy_scaling || legacy_scaling == scaling,
                 "{}: \"rope_scaling\" and \"rope_parameters\" describe different RoPE scalings ({} and {})",
                 c.source, json["rope_scaling"].dump(), rp.dump());
  c.rope_scaling = scaling;
}

// The defaults of transformers' LlamaConfig, MistralConfig, Qwen2Config and Qwen3Config where they differ.
struct LlamaDefaults {
  int64_t vocab_size, intermediate_size, num_kv_heads, max_position_embeddings;
  std::optional<int64_t> bos_token_id, eos_token_id;
  std::optional<int64_t> head_dim;  // none: hidden_size / num_attention_heads
};

LlamaDefaults llama_defaults(const std::string& model_type, int64_t num_heads) {
  if (model_type == "mistral") return {32000, 14336, 8, 4096 * 32, 1, 2, std::nullopt};
  if (model_type == "qwen2") return {151936, 22016, 32, 32768, std::nullopt, std::nullopt, std::nullopt};
  if (model_type == "qwen3") return {151936, 22016, 32, 32768, std::nullopt, std::nullopt, 128};
  return {32000, 11008, num_heads, 2048, 1, 2, std::nullopt};
}

bool is_qwen(const std::string& model_type) {
  return model_type == "qwen2" || model_type == "qwen3";
}

// Whether any layer attends within a window, and how wide it is. Mistral: every layer, unless
// "sliding_window" is null (v0.2 on). Qwen2: only with use_sliding_window, in the layers from
// max_window_layers on, or as "layer_types" lists them (transformers >= 4.53 writes both); Qwen3 as Qwen2. An
// absent "sliding_window" is the configs' default, 4096; only null means none.
std::optional<int64_t> parse_sliding_window(const Fields& f, const nlohmann::json& json,
                                            const ModelConfig& c) {
  const bool null_window = json.contains("sliding_window") && json["sliding_window"].is_null();
  bool windowed = false;
  if (c.model_type == "mistral") {
    windowed = !null_window;
  } else if (is_qwen(c.model_type)) {
    if (json.contains("layer_types") && !json["layer_types"].is_null()) {
      const auto& types = json["layer_types"];
      SYMPRUNE_CHECK(types.is_array() && static_cast<int64_t>(types.size()) == c.num_layers,
                     "{}: \"layer_types\" must list one type per layer ({}), got {}", c.source, c.num_layers,
                     types.dump().substr(0, 200));
      for (const auto& type : types) {
        SYMPRUNE_CHECK(type == "full_attention" || type == "sliding_attention",
                       "{}: layer type {} is not supported (supported: \"full_attention\", "
                       "\"sliding_attention\")",
                       c.source, type.dump());
        windowed = windowed || type == "sliding_attention";
      }
      // transformers refuses a sliding layer without a window.
      SYMPRUNE_CHECK(!windowed || (f.boolean("use_sliding_window", false) && !null_window),
                     "{}: \"layer_types\" lists sliding_attention, but use_sliding_window is false or "
                     "sliding_window null",
                     c.source);
    } else {
      windowed = f.boolean("use_sliding_window", false) && !null_window &&
                 f.integer("max_window_layers", 28) < c.num_layers;
    }
  }
  if (!windowed) return std::nullopt;
  const int64_t window = f.integer("sliding_window", 4096);
  SYMPRUNE_CHECK(window > 0, "{}: \"sliding_window\" must be positive, got {}", c.source, window);
  return window;
}

void parse_llama(const Fields& f, const nlohmann::json& json, ModelConfig& c) {
  // Defaults as in transformers' LlamaConfig (MistralConfig, Qwen2Config, Qwen3Config for those types).
  c.family = ModelFamily::kLlama;
  c.num_heads = f.integer("num_attention_heads", 32);
  const LlamaDefaults defaults = llama_defaults(c.model_type, c.num_heads);
  c.vocab_size = f.integer("vocab_size", defaults.vocab_size);
  c.hidden_size = f.integer("hidden_size", 4096);
  c.intermediate_size = f.integer("intermediate_size", defaults.intermediate_size);
  c.num_layers = f.integer("num_hidden_layers", 32);
  // Absent: the type's default; null: num_attention_heads (as all three configs read it).
  c.num_kv_heads = json.contains("num_key_value_heads") && json["num_key_value_heads"].is_null()
                       ? c.num_heads
                       : f.integer("num_key_value_heads", defaults.num_kv_heads);
  c.max_position_embeddings = f.integer("max_position_embeddings", defaults.max_position_embeddings);
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  parse_rope(f, json, c);
  c.attention_bias = c.attention_bias_configurable() && f.boolean("attention_bias", false);
  c.qkv_bias = c.model_type == "qwen2";
  c.mlp_bias = c.mlp_bias_configurable() && f.boolean("mlp_bias", false);
  c.qk_norm = c.model_type == "qwen3";
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.hidden_act = f.string("hidden_act", "silu");
  if (c.hidden_act == "swish") c.hidden_act = "silu";  // same function in transformers' ACT2FN
  SYMPRUNE_CHECK(c.hidden_act == "silu", "{}: hidden_act '{}' is not supported for {} (supported: silu)",
                 c.source, c.hidden_act, c.model_type);
  c.bos_token_id = f.has("bos_token_id") ? f.token_id("bos_token_id") : defaults.bos_token_id;
  c.eos_token_id = f.has("eos_token_id") ? f.token_id("eos_token_id") : defaults.eos_token_id;
  c.sliding_window = parse_sliding_window(f, json, c);

  check_positive(c.num_heads, "num_attention_heads", c.source);
  check_positive(c.num_kv_heads, "num_key_value_heads", c.source);
  check_positive(c.hidden_size, "hidden_size", c.source);
  // transformers' Qwen3 cannot build a model whose head_dim is null (LLaMA's derives it): refused as a
  // non-integer.
  if (defaults.head_dim && json.contains("head_dim")) f.to_integer(json["head_dim"], "head_dim");
  if (f.has("head_dim") || defaults.head_dim) {
    c.head_dim = f.integer("head_dim", defaults.head_dim.value_or(0));
  } else {
    SYMPRUNE_CHECK(c.hidden_size % c.num_heads == 0,
                   "{}: hidden_size ({}) must be divisible by num_attention_heads ({})", c.source,
                   c.hidden_size, c.num_heads);
    c.head_dim = c.hidden_size / c.num_heads;
  }
  check_positive(c.head_dim, "head_dim", c.source);
  SYMPRUNE_CHECK(c.num_heads % c.num_kv_heads == 0,
                 "{}: num_attention_heads ({}) must be divisible by num_key_value_heads ({})", c.source,
                 c.num_heads, c.num_kv_heads);
  // RoPE rotates pairs of dimensions (rotate-half), so head_dim must be even.
  SYMPRUNE_CHECK(c.head_dim % 2 == 0, "{}: head_dim ({}) must be even for rotary embeddings", c.source,
                 c.head_dim);
  SYMPRUNE_CHECK(c.rms_norm_eps > 0, "{}: \"rms_norm_eps\" must be positive, got {}", c.source,
                 c.rms_norm_eps);
  SYMPRUNE_CHECK(c.rope_theta > 0, "{}: \"rope_theta\" must be positive, got {}", c.source, c.rope_theta);
}

void parse_opt(const Fields& f, ModelConfig& c) {
  // Defaults as in transformers' OPTConfig (tie_word_embeddings from PretrainedConfig: true).
  c.family = ModelFamily::kOpt;
  c.vocab_size = f.integer("vocab_size", 50272);
  c.hidden_size = f.integer("hidden_size", 768);
  c.intermediate_size = f.integer("ffn_dim", 3072);
  c.num_layers = f.integer("num_hidden_layers", 12);
  c.num_heads = f.integer("num_attention_heads", 12);
  c.num_kv_heads = c.num_heads;
  c.max_position_embeddings = f.integer("max_position_embeddings", 2048);
  c.do_layer_norm_before = f.boolean("do_layer_norm_before", true);
  c.remove_final_layer_norm = f.boolean("_remove_final_layer_norm", false);
  c.word_embed_proj_dim = f.integer("word_embed_proj_dim", c.hidden_size);
  c.enable_bias = f.boolean("enable_bias", true);
  c.layer_norm_elementwise_affine = f.boolean("layer_norm_elementwise_affine", true);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", true);
  c.activation_function = f.string("activation_function", "relu");
  SYMPRUNE_CHECK(c.activation_function == "relu",
                 "{}: activation_function '{}' is not supported for opt (supported: relu)", c.source,
                 c.activation_function);
  c.hidden_act = c.activation_function;
  c.bos_token_id = f.has("bos_token_id") ? f.token_id("bos_token_id") : std::optional<int64_t>(2);
  c.eos_token_id = f.has("eos_token_id") ? f.token_id("eos_token_id") : std::optional<int64_t>(2);
  c.attention_bias = c.enable_bias;
  c.mlp_bias = c.enable_bias;

  check_positive(c.num_heads, "num_attention_heads", c.source);
  check_positive(c.hidden_size, "hidden_size", c.source);
  check_positive(c.word_embed_proj_dim, "word_embed_proj_dim", c.source);
  SYMPRUNE_CHECK(c.hidden_size % c.num_heads == 0,
                 "{}: hidden_size ({}) must be divisible by num_attention_heads ({})", c.source,
                 c.hidden_size, c.num_heads);
  c.head_dim = c.hidden_size / c.num_heads;
}

}  // namespace

std::string ModelConfig::max_seq_len_limit() const {
  if (sliding_window && *sliding_window < max_position_embeddings)
    return fmt::format("sliding_window {}", *sliding_window);
  return fmt::format("max_position_embeddings {}", max_position_embeddings);
}

ModelConfig parse_config(const nlohmann::json& json, const std::string& source_name) {
  SYMPRUNE_CHECK(json.is_object(), "{}: expected a JSON object", source_name);
  ModelConfig c;
  c.source = source_name;
  c.raw = json;
  const Fields f(json, c.source);
  SYMPRUNE_CHECK(f.has("model_type"), "{}: no \"model_type\" (supported: {})", source_name, kSupportedTypes);
  c.model_type = f.string("model_type", "");
  // Informational only: the storage dtype of each tensor comes from the safetensors headers.
  c.torch_dtype = f.string("torch_dtype", "");
  if (c.model_type == "llama" || c.model_type == "mistral" || is_qwen(c.model_type)) {
    parse_llama(f, json, c);
  } else if (c.model_type == "opt") {
    parse_opt(f, c);
  } else {
    fail("{}: model_type '{}' is not supported (supported: {})", source_name, c.model_type, kSupportedTypes);
  }
  check_positive(c.hidden_size, "hidden_size", c.source);
  check_positive(c.intermediate_size, c.family == ModelFamily::kOpt ? "ffn_dim" : "intermediate_size",
                 c.source);
  check_positive(c.num_layers, "num_hidden_layers", c.source);
  check_positive(c.vocab_size, "vocab_size", c.source);
  check_positive(c.max_position_embeddings, "max_position_embeddings", c.source);
  return c;
}

ModelConfig load_config(const std::filesystem::path& config_json) {
  return parse_config(read_json_file(config_json, 16ull << 20), config_json.string());
}

}  // namespace symprune::io
