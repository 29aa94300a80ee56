#pragma once
// Finding a model directory from what the user typed (DESIGN.md §3.5 step 1): a directory path, a
// short name such as "llama2-13b", or a Hugging Face repo id such as "meta-llama/Llama-2-13b-hf".
//
// Search order (the first hit wins; the directory must contain config.json):
//   1. `name_or_path` itself when it is an existing directory;
//   2. $SYMPRUNE_MODELS/<name>, then $SYMPRUNE_MODELS/<repo name> (e.g. Llama-2-13b-hf) and
//      $SYMPRUNE_MODELS/<org>/<repo name>;
//   3. the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub,
//      else ~/.cache/huggingface/hub): models--<org>--<name>/snapshots/<revision in refs/main>,
//      falling back to the only snapshot, or the most recently modified one holding config.json.
// When nothing is found the error lists every place looked at and why each was rejected.
#include <filesystem>
#include <map>
#include <string>

namespace symprune::io {

struct ResolvedModel {
  std::filesystem::path dir;  // holds config.json
  std::string source;  // how it was found, e.g. "path", "$SYMPRUNE_MODELS", "hf-cache meta-llama/...@rev"
};

ResolvedModel resolve_model(const std::string& name_or_path);

// Short names -> Hugging Face repo ids (llama2-7b -> meta-llama/Llama-2-7b-hf, opt-1.3b ->
// facebook/opt-1.3b).
const std::map<std::string, std::string>& known_model_repos();

// The Hugging Face hub cache directory from the environment (see the search order above).
std::filesystem::path hf_hub_cache_dir();

}  // namespace symprune::io
