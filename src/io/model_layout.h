#pragma once
// The tensors a Hugging Face checkpoint must hold for a given config.json (names and shapes), and the
// check that a TensorSource (safetensors files, a synthetic model) provides them. Names are the canonical
// Hugging Face *ForCausalLM names ("model.layers.0.self_attn.q_proj.weight",
// "model.decoder.layers.0.fc1.weight"); OPT files saved from the base model omit the "model." prefix
// ("decoder.layers.0.fc1.weight") and are accepted through stored_tensor_name / load_model_tensor.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"
#include "io/hf_config.h"
#include "io/safetensors.h"

namespace symprune::io {

struct ExpectedTensor {
  std::string name;  // canonical name
  std::vector<int64_t> shape;
  bool required = true;  // false: lm_head.weight of a tied model (used when present, else the embedding)
};

// Every tensor the config implies, in model order (embeddings, blocks, final norm, head).
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);

// The expected tensors of decoder block `layer` only (same names and shapes as in expected_tensors).
std::vector<ExpectedTensor> expected_block_tensors(const ModelConfig& config, int64_t layer);

// Canonical name of a stored name: "decoder.x" -> "model.decoder.x" for OPT; otherwise unchanged.
std::string canonical_name(std::string_view stored_name, ModelFamily family);

// The name under which `canonical` is stored in `model` (itself, or without "model." for OPT);
// nullopt when absent.
std::optional<std::string> stored_tensor_name(const TensorSource& model, std::string_view canonical);

// Loads a tensor by canonical name as fp32, checking its shape; errors name the tensor and the file
// ("missing tensor ...", "tensor X in FILE has shape [..] but config.json implies [..]").
Tensor load_model_tensor(const TensorSource& model, const ModelConfig& config, std::string_view canonical,
                         const std::vector<int64_t>& shape);

// Throws symprune::Error for the first required tensor that is missing, has the wrong shape or is not in
// a weight dtype (F32/F16/BF16), and for tensors of layers past num_hidden_layers (they would stay
// unpruned). Other tensors the config does not mention are ignored (rotary_emb.inv_freq, position_ids);
// those in a non-weight dtype (I64, F64, ...) get a warning.
// A stored head that differs from the embedding which tie_word_embeddings makes the head is ambiguous
// (loaders keep either tensor's values): refused with kRefuse (what runs the model), named with kWarn
// (inspect).
enum class AmbiguousTiedHead { kRefuse, kWarn };
void validate_model_tensors(const ModelConfig& config, const TensorSource& model,
                            AmbiguousTiedHead tied_head = AmbiguousTiedHead::kRefuse);

}  // namespace symprune::io
