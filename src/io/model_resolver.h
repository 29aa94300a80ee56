#pragma once
// Finding a model directory from what the user typed (DESIGN.md §3.5 step 1): a directory path, a
// short name such as "llama2-13b", or a Hugging Face repo id such as "meta-llama/Llama-2-13b-hf".
//
// `synthetic:<shape>[:<seed>][:layers=<n>]` names a generated model (io/synthetic_model.h) and is not
// searched for. Otherwise the search order (the first hit wins; the directory must contain config.json):
//   1. `name_or_path` itself when it is an existing directory;
//   2. $SYMPRUNE_MODELS/<name>, then $SYMPRUNE_MODELS/<repo name> (e.g. Llama-2-13b-hf) and
//      $SYMPRUNE_MODELS/<org>/<repo name>;
//   3. the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
//      else ~/.cache/huggingface/hub): models--<org>--<name>/snapshots/<revision in refs/main>,
//      falling back to the only snapshot, or the most recently modified one holding config.json.
// When nothing is found the error lists every place looked at and why each was rejected.
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "io/hf_config.h"
#include "io/synthetic_model.h"
#include "io/tensor_source.h"

namespace symprune::io {

struct ResolvedModel {
  std::filesystem::path dir;  // holds config.json; empty for a synthetic model
  std::string source;  // how it was found, e.g. "path", "$SYMPRUNE_MODELS", "hf-cache meta-llama/...@rev"
  std::optional<SyntheticSpec> synthetic;  // `synthetic:<shape>...` (io/synthetic_model.h)
  bool is_synthetic() const { return synthetic.has_value(); }
  // The directory, or the synthetic model's canonical name, for messages and reports.
  std::string display() const { return synthetic ? synthetic->canonical() : dir.string(); }
};

ResolvedModel resolve_model(const std::string& name_or_path);

// The model's config (config.json, or the synthetic shape's) and its tensors.
ModelConfig load_model_config(const ResolvedModel& resolved);
std::unique_ptr<TensorSource> open_tensor_source(const ResolvedModel& resolved);

// Short names -> Hugging Face repo ids (llama2-7b -> meta-llama/Llama-2-7b-hf, opt-1.3b ->
// facebook/opt-1.3b).
const std::map<std::string, std::string>& known_model_repos();

// The Hugging Face hub cache directory from the environment (see the search order above).
std::filesystem::path hf_hub_cache_dir();

}  // namespace symprune::io
