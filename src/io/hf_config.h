#pragma once
// Hugging Face config.json for the supported families: LLaMA-2/3 ("llama") and the models of its
// architecture (Mistral: "mistral"; Qwen2/2.5: "qwen2", with biases on q/k/v; Qwen3: "qwen3", with
// RMSNorms on each head of q and k), and OPT ("opt").
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace symprune::io {

enum class ModelFamily { kLlama, kOpt };

// rope_scaling {"rope_type"/"type": "llama3", factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings}, or {"rope_type": "linear" or "dynamic", factor} (the other fields then
// unused). Other types are refused with a clear error.
struct RopeScaling {
  std::string type;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  bool operator==(const RopeScaling&) const = default;
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kLlama;
  std::string model_type;  // "llama", "mistral", "qwen2", "qwen3" (all ModelFamily::kLlama) or "opt"
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // OPT: ffn_dim
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // == num_heads for MHA and for OPT
  int64_t head_dim = 0;      // config's head_dim, else hidden_size / num_heads (Qwen3: 128)
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  bool tie_word_embeddings = false;
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> eos_token_id;
  std::string torch_dtype;  // as written ("float16", "bfloat16", "float32" or empty)

  // LLaMA
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  bool attention_bias = false;  // q, k, v and o_proj carry a bias
  bool qkv_bias = false;        // q, k and v_proj do, o_proj not (Qwen2)
  bool mlp_bias = false;
  // q and k are RMS-normalized per head (weights [head_dim], rms_norm_eps) between their linear and RoPE
  // (Qwen3's q_norm and k_norm).
  bool qk_norm = false;
  // The attention window of a sliding-window layer (Mistral; Qwen2 with use_sliding_window), if any layer
  // has one. symprune's attention is full causal, which equals the windowed attention on sequences of at
  // most this many tokens, so longer sequences are refused (max_seq_len).
  std::optional<int64_t> sliding_window;
  std::string hidden_act = "silu";

  // OPT
  bool do_layer_norm_before = true;
  int64_t word_embed_proj_dim = 0;  // == hidden_size unless project_in/out exist
  bool enable_bias = true;
  bool layer_norm_elementwise_affine = true;
  bool remove_final_layer_norm = false;  // OPT-350m style _remove_final_layer_norm
  std::string activation_function = "relu";

  nlohmann::json raw;  // the file as read, written back unchanged by the pruner
  std::string source;  // where it was read from (config.json path), for error messages

  // The longest sequence this model is computed for: max_position_embeddings, or the sliding window.
  int64_t max_seq_len() const {
    return sliding_window ? std::min(*sliding_window, max_position_embeddings) : max_position_embeddings;
  }
  // What bounds max_seq_len(), for messages: "max_position_embeddings 4096" or "sliding_window 4096".
  std::string max_seq_len_limit() const;
  // Whether config.json says if the attention's linears have biases ("attention_bias", OPT's
  // "enable_bias"), and the MLP's ("mlp_bias", "enable_bias"). Where it does not, the architecture fixes
  // them: transformers reads no bias field for Mistral and Qwen2, nor mlp_bias for Qwen3.
  bool attention_bias_configurable() const { return model_type != "mistral" && model_type != "qwen2"; }
  bool mlp_bias_configurable() const { return attention_bias_configurable() && model_type != "qwen3"; }

  bool has_project_in_out() const {
    return family == ModelFamily::kOpt && word_embed_proj_dim != hidden_size;
  }
};

// Parses and validates (positive sizes, heads divide hidden, kv heads divide heads, supported
// activation). Unknown model_type: error naming it and the supported ones.
ModelConfig parse_config(const nlohmann::json& json, const std::string& source_name);
ModelConfig load_config(const std::filesystem::path& config_json);

}  // namespace symprune::io
