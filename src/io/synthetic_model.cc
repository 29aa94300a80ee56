#include "io/synthetic_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "core/hashing.h"
#include "io/model_layout.h"

namespace symprune::io {
namespace {

constexpr uint64_t kMaxShardBytes = 5'000'000'000;  // Hugging Face's default max_shard_size "5GB"

struct Preset {
  const char* name;
  const char* model_type;  // "llama", "mistral", "qwen2", "qwen3" (LLaMA architecture) or "opt"
  int64_t hidden, intermediate, layers, heads, kv_heads, vocab, max_positions;
  double rope_theta;
  int64_t head_dim = 0;  // 0: hidden / heads
};

// Published shapes (config.json of meta-llama/Llama-2-*-hf, Meta-Llama-3-8B, mistralai/Mistral-7B-v0.1,
// Qwen/Qwen2.5-7B, Qwen/Qwen3-8B, facebook/opt-1.3b).
constexpr Preset kPresets[] = {
    {"llama2-7b", "llama", 4096, 11008, 32, 32, 32, 32000, 4096, 10000.0},
    {"llama2-13b", "llama", 5120, 13824, 40, 40, 40, 32000, 4096, 10000.0},
    {"llama2-70b", "llama", 8192, 28672, 80, 64, 8, 32000, 4096, 10000.0},
    {"llama3-8b", "llama", 4096, 14336, 32, 32, 8, 128256, 8192, 500000.0},
    {"mistral-7b", "mistral", 4096, 14336, 32, 32, 8, 32000, 32768, 10000.0},
    {"qwen2.5-7b", "qwen2", 3584, 18944, 28, 28, 4, 152064, 131072, 1000000.0},
    {"qwen3-8b", "qwen3", 4096, 12288, 36, 32, 8, 151936, 40960, 1000000.0, 128},
    {"opt-1.3b", "opt", 2048, 8192, 24, 32, 32, 50272, 2048, 0.0},
    {"llama-1024", "llama", 1024, 2816, 4, 16, 16, 32000, 2048, 10000.0},
    {"tiny-llama", "llama", 64, 172, 4, 8, 4, 512, 512, 10000.0},
    // tiny-llama with heads of 16, the smallest that the GPU's flash attention kernel takes.
    {"tiny-llama-h16", "llama", 64, 172, 2, 4, 2, 512, 512, 10000.0},
    {"tiny-opt", "opt", 64, 256, 4, 4, 4, 512, 512, 0.0},
    // Qwen2's biases on q/k/v, in the tests' size.
    {"tiny-qwen2", "qwen2", 64, 172, 2, 8, 4, 512, 512, 1000000.0},
    // Qwen3's q/k norms, with heads wider than hidden / heads (q_proj 128 x 64), as Qwen3-0.6B's are.
    {"tiny-qwen3", "qwen3", 64, 172, 2, 4, 2, 512, 512, 1000000.0, 32},
};

const Preset& find_preset(std::string_view shape) {
  for (const Preset& p : kPresets)
    if (shape == p.name) return p;
  std::string known;
  for (const Preset& p : kPresets) known += (known.empty() ? "" : ", ") + std::string(p.name);
  fail("synthetic model shape '{}' is unknown (known shapes: {})", shape, known);
}

uint64_t name_key(uint64_t seed, std::string_view name) {
  return splitmix64(seed ^ splitmix64(fnv1a64(name)));
}

// Values of one tensor: centre + uniform(-half_width, half_width).
struct Distribution {
  float centre;
  float half_width;
};

Distribution distribution_of(std::string_view name) {
  const bool bias = name.ends_with(".bias");
  const bool norm = !bias && (name.ends_with("norm.weight") || name.ends_with("layer_norm.weight") ||
                              name.ends_with("layernorm.weight"));
  if (norm) return {1.0f, 0.05f};
  if (bias) return {0.0f, 0.01f};
  return {0.0f, 0.02f * std::sqrt(3.0f)};  // standard deviation 0.02
}

bool parse_integer(std::string_view text, uint64_t& out) {
  if (text.empty()) return false;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

bool is_synthetic_model(std::string_view name) {
  return name.starts_with(kSyntheticPrefix);
}

std::string SyntheticSpec::canonical() const {
  std::string text = fmt::format("{}{}:{}", kSyntheticPrefix, shape, seed);
  if (layers) text += fmt::format(":layers={}", *layers);
  return text;
}

std::vector<std::string> synthetic_shapes() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

SyntheticSpec parse_synthetic_spec(std::string_view name) {
  SYMPRUNE_CHECK(is_synthetic_model(name), "'{}' is not a synthetic model name (synthetic:<shape>)", name);
  std::vector<std::string_view> parts;
  std::string_view rest = name.substr(kSyntheticPrefix.size());
  while (true) {
    const size_t colon = rest.find(':');
    parts.push_back(rest.substr(0, colon));
    if (colon == std::string_view::npos) break;
    rest = rest.substr(colon + 1);
  }
  SyntheticSpec spec;
  spec.shape = std::string(parts[0]);
  find_preset(spec.shape);
  bool have_seed = false;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string_view part = parts[i];
    uint64_t value = 0;
    if (part.starts_with("layers=")) {
      SYMPRUNE_CHECK(parse_integer(part.substr(7), value) && value >= 1 && value <= 1000,
                     "--model {}: layers must be an integer in 1..1000, got '{}'", name, part.substr(7));
      spec.layers = static_cast<int64_t>(value);
    } else {
      SYMPRUNE_CHECK(!have_seed && parse_integer(part, value),
                     "--model {}: expected synthetic:<shape>[:<seed>][:layers=<n>], got '{}'", name, part);
      spec.seed = value;
      have_seed = true;
    }
  }
  return spec;
}

nlohmann::json synthetic_config_json(const SyntheticSpec& spec) {
  const Preset& p = find_preset(spec.shape);
  const int64_t layers = spec.layers.value_or(p.layers);
  nlohmann::json j;
  const std::string_view model_type = p.model_type;
  if (model_type != "opt") {
    const char* architecture = model_type == "mistral" ? "MistralForCausalLM"
                               : model_type == "qwen2" ? "Qwen2ForCausalLM"
                               : model_type == "qwen3" ? "Qwen3ForCausalLM"
                                                       : "LlamaForCausalLM";
    j = {{"architectures", {architecture}},
         {"model_type", model_type},
         {"hidden_size", p.hidden},
         {"intermediate_size", p.intermediate},
         {"num_hidden_layers", layers},
         {"num_attention_heads", p.heads},
         {"num_key_value_heads", p.kv_heads},
         {"vocab_size", p.vocab},
         {"max_position_embeddings", p.max_positions},
         {"rms_norm_eps", 1e-5},
         {"rope_theta", p.rope_theta},
         {"hidden_act", "silu"},
         {"tie_word_embeddings", false},
         {"bos_token_id", 1},
         {"eos_token_id", 2},
         {"torch_dtype", "bfloat16"}};
    if (model_type == "mistral") j["sliding_window"] = 4096;
    if (p.head_dim > 0) j["head_dim"] = p.head_dim;
    if (model_type == "qwen2" ||
        model_type == "qwen3") {  // no BOS, as Qwen's tokenizer; an EOS id inside the vocabulary
      j.erase("bos_token_id");
      j["eos_token_id"] = p.vocab - 1;
      j["use_sliding_window"] = false;
      j["rms_norm_eps"] = 1e-6;
      // As Qwen3's own configs: transformers 4.51-4.52 window every layer by a non-null sliding_window.
      if (model_type == "qwen3") j["sliding_window"] = nullptr;
    }
  } else {
    j = {{"architectures", {"OPTForCausalLM"}},
         {"model_type", "opt"},
         {"hidden_size", p.hidden},
         {"ffn_dim", p.intermediate},
         {"num_hidden_layers", layers},
         {"num_attention_heads", p.heads},
         {"vocab_size", p.vocab},
         {"max_position_embeddings", p.max_positions},
         {"word_embed_proj_dim", p.hidden},
         {"do_layer_norm_before", true},
         {"activation_function", "relu"},
         {"enable_bias", true},
         {"tie_word_embeddings", true},
         {"bos_token_id", 2},
         {"eos_token_id", 2},
         {"torch_dtype", "bfloat16"}};
  }
  j["symprune_synthetic"] = spec.canonical();
  return j;
}

// Token draws scale z in [0, 2^64) to [0, vocab) by the high half of a 128-bit product; 128-bit integers
// are a GCC/Clang extension (__extension__ silences -Wpedantic).
__extension__ using Uint128 = unsigned __int128;

std::vector<int32_t> synthetic_tokens(uint64_t seed, int64_t nsamples, int64_t seqlen, int64_t vocab) {
  SYMPRUNE_CHECK(nsamples >= 1 && seqlen >= 1 && vocab >= 1,
                 "synthetic calibration: {} x {} tokens of a vocabulary "
                 "of {}",
                 nsamples, seqlen, vocab);
  std::vector<int32_t> tokens(static_cast<size_t>(nsamples * seqlen));
  const uint64_t key = name_key(seed, "calibration");
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint64_t z = splitmix64(key + static_cast<uint64_t>(i + 1) * 0x9e3779b97f4a7c15ull);
    tokens[i] = static_cast<int32_t>((static_cast<Uint128>(z) * static_cast<uint64_t>(vocab)) >> 64);
  }
  return tokens;
}

SyntheticModel::SyntheticModel(const SyntheticSpec& spec)
    : spec_(spec), config_(parse_config(synthetic_config_json(spec), spec.canonical())) {
  for (const auto& expected : expected_tensors(config_)) {
    if (!expected.required) continue;  // a tied head has no tensor of its own
    TensorInfo info;
    info.name = expected.name;
    info.dtype = DType::kBF16;
    info.shape = expected.shape;
    info.data_end = static_cast<uint64_t>(info.numel()) * 2;
    by_name_.emplace(info.name, tensors_.size());
    tensors_.push_back(std::move(info));
  }
}

bool SyntheticModel::contains(std::string_view name) const {
  return by_name_.find(name) != by_name_.end();
}

std::vector<std::string> SyntheticModel::names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : by_name_) out.push_back(name);
  return out;
}

const TensorInfo& SyntheticModel::info(std::string_view name) const {
  const auto it = by_name_.find(name);
  SYMPRUNE_CHECK(it != by_name_.end(), "missing tensor '{}' in {}", name, spec_.canonical());
  return tensors_[it->second];
}

std::string SyntheticModel::location(std::string_view) const {
  return spec_.canonical();
}

void SyntheticModel::read_bytes(std::string_view name, std::vector<std::byte>& out) const {
  const TensorInfo& ti = info(name);
  const int64_t count = ti.numel();
  out.resize(static_cast<size_t>(count) * 2);
  const uint64_t key = name_key(spec_.seed, name);
  const Distribution d = distribution_of(name);
  auto* bits = reinterpret_cast<uint16_t*>(out.data());
#pragma omp parallel for schedule(static) if (count >= (1 << 16))
  for (int64_t i = 0; i < count; ++i) {
    const uint64_t z = splitmix64(key + static_cast<uint64_t>(i + 1) * 0x9e3779b97f4a7c15ull);
    const float unit = static_cast<float>(z >> 40) * 0x1.0p-24f * 2.0f - 1.0f;  // [-1, 1)
    bits[i] = float_to_bf16(d.centre + d.half_width * unit);
  }
}

std::vector<TensorSource::Shard> SyntheticModel::shards() const {
  uint64_t total = 0;
  for (const auto& t : tensors_) total += t.data_end;
  std::vector<Shard> out;
  uint64_t in_shard = 0;
  for (const auto& t : tensors_) {
    if (out.empty() || (in_shard > 0 && in_shard + t.data_end > kMaxShardBytes)) {
      out.push_back({"", {}, {{"format", "pt"}}});
      in_shard = 0;
    }
    out.back().tensors.push_back(t.name);
    in_shard += t.data_end;
  }
  if (out.size() == 1 && total <= kMaxShardBytes) {
    out[0].file = "model.safetensors";
    return out;
  }
  for (size_t i = 0; i < out.size(); ++i)
    out[i].file = fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, out.size());
  return out;
}

}  // namespace symprune::io
