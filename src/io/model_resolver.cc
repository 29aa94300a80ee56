#include "io/model_resolver.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "io/torch_checkpoint.h"

namespace symprune::io {
namespace fs = std::filesystem;

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : std::string();
}

bool is_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

bool has_config(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "config.json", ec);
}

// Why a config.json that is there is not read: "" when there is none at all.
std::string unreadable_config(const fs::path& dir) {
  std::error_code ec;
  const fs::path config = dir / "config.json";
  const fs::file_status own = fs::symlink_status(config, ec);
  if (ec || !fs::exists(own)) return "";
  if (fs::is_symlink(own) && !fs::exists(config, ec))
    return fmt::format(": config.json is a link to {}, which does not exist (an incomplete download?)",
                       fs::read_symlink(config, ec).string());
  const fs::file_status target = fs::status(config, ec);
  if (fs::is_directory(target)) return ": config.json there is a directory, not a file";
  return ": config.json there is not a regular file (a pipe, socket or device)";
}

// A relative name usable below a search root: no absolute paths, no "..", no empty components.
bool is_safe_relative(const std::string& name) {
  if (name.empty()) return false;
  const fs::path p(name);
  if (p.is_absolute() || p.has_root_name() || p.has_root_directory()) return false;
  for (const auto& part : p) {
    if (part == ".." || part == ".") return false;
  }
  return true;
}

// "org/name" with the characters the Hub allows.
bool is_repo_id(const std::string& name) {
  const auto slash = name.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == name.size()) return false;
  if (name.find('/', slash + 1) != std::string::npos) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.' || c == '/';
    if (!ok) return false;
  }
  return name.find("..") == std::string::npos;
}

std::string trim(std::string s) {
  const auto not_space = [](unsigned char c) { return !std::isspace(c); };
  s.erase(s.begin(), std::find_if(s.begin(), s.end(), not_space));
  s.erase(std::find_if(s.rbegin(), s.rend(), not_space).base(), s.end());
  return s;
}

struct Search {
  std::vector<std::string> looked;  // "PATH (reason)"

  // Returns the directory when it is a model directory, else records why not.
  bool accept(const fs::path& dir) {
    if (!is_dir(dir)) {
      looked.push_back(dir.string() + " (does not exist)");
      return false;
    }
    if (!has_config(dir)) {
      looked.push_back(dir.string() + " (no config.json)");
      return false;
    }
    return true;
  }
};

// Looks up `repo` (org/name) in the hub cache layout under `cache`.
std::optional<ResolvedModel> find_in_hf_cache(const fs::path& cache, const std::string& repo,
                                              Search& search) {
  // "models--org--name": the Hub replaces '/' by "--".
  const std::string folder =
      "models--" + repo.substr(0, repo.find('/')) + "--" + repo.substr(repo.find('/') + 1);
  const fs::path repo_dir = cache / folder;
  if (!is_dir(repo_dir)) {
    search.looked.push_back(repo_dir.string() + " (Hugging Face cache for " + repo + ": does not exist)");
    return std::nullopt;
  }
  const fs::path snapshots = repo_dir / "snapshots";
  std::string revision;
  {
    std::ifstream ref(repo_dir / "refs" / "main");
    if (ref) {
      std::string text((std::istreambuf_iterator<char>(ref)), std::istreambuf_iterator<char>());
      revision = trim(text);
    }
  }
  if (!revision.empty() && is_safe_relative(revision) && revision.find('/') == std::string::npos) {
    const fs::path snapshot = snapshots / revision;
    if (search.accept(snapshot)) return ResolvedModel{snapshot, "hf-cache " + repo + "@" + revision, {}};
  } else {
    search.looked.push_back((repo_dir / "refs" / "main").string() +
                            " (missing, or not a plain revision name)");
  }
  // Fall back to the snapshots present: the only one, else the most recently modified with config.json.
  std::vector<fs::path> candidates;
  std::error_code ec;
  if (is_dir(snapshots)) {
    for (const auto& entry : fs::directory_iterator(snapshots, ec)) {
      if (is_dir(entry.path()) && has_config(entry.path())) candidates.push_back(entry.path());
    }
  }
  if (candidates.empty()) {
    search.looked.push_back(snapshots.string() + " (no snapshot with config.json)");
    return std::nullopt;
  }
  std::sort(candidates.begin(), candidates.end(), [](const fs::path& a, const fs::path& b) {
    std::error_code e1, e2;
    const auto ta = fs::last_write_time(a, e1);
    const auto tb = fs::last_write_time(b, e2);
    return ta != tb ? ta > tb : a < b;
  });
  return ResolvedModel{
      candidates.front(), "hf-cache " + repo + "@" + candidates.front().filename().string(), {}};
}

}  // namespace

const std::map<std::string, std::string>& known_model_repos() {
  static const std::map<std::string, std::string> kRepos = {
      {"llama-7b", "huggyllama/llama-7b"},
      {"llama-13b", "huggyllama/llama-13b"},
      {"llama-30b", "huggyllama/llama-30b"},
      {"llama-65b", "huggyllama/llama-65b"},
      {"llama2-7b", "meta-llama/Llama-2-7b-hf"},
      {"llama2-13b", "meta-llama/Llama-2-13b-hf"},
      {"llama2-70b", "meta-llama/Llama-2-70b-hf"},
      {"llama2-7b-chat", "meta-llama/Llama-2-7b-chat-hf"},
      {"llama2-13b-chat", "meta-llama/Llama-2-13b-chat-hf"},
      {"llama2-70b-chat", "meta-llama/Llama-2-70b-chat-hf"},
      {"llama3-8b", "meta-llama/Meta-Llama-3-8B"},
      {"llama3-70b", "meta-llama/Meta-Llama-3-70B"},
      {"llama3-8b-instruct", "meta-llama/Meta-Llama-3-8B-Instruct"},
      {"llama3.1-8b", "meta-llama/Llama-3.1-8B"},
      {"llama3.1-70b", "meta-llama/Llama-3.1-70B"},
      {"llama3.2-1b", "meta-llama/Llama-3.2-1B"},
      {"llama3.2-3b", "meta-llama/Llama-3.2-3B"},
      {"mistral-7b", "mistralai/Mistral-7B-v0.1"},
      {"mistral-7b-v0.3", "mistralai/Mistral-7B-v0.3"},
      {"qwen2-7b", "Qwen/Qwen2-7B"},
      {"qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B"},
      {"qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B"},
      {"qwen2.5-3b", "Qwen/Qwen2.5-3B"},
      {"qwen2.5-7b", "Qwen/Qwen2.5-7B"},
      {"qwen2.5-14b", "Qwen/Qwen2.5-14B"},
      {"qwen2.5-32b", "Qwen/Qwen2.5-32B"},
      {"qwen2.5-72b", "Qwen/Qwen2.5-72B"},
      {"qwen3-0.6b", "Qwen/Qwen3-0.6B"},
      {"qwen3-1.7b", "Qwen/Qwen3-1.7B"},
      {"qwen3-4b", "Qwen/Qwen3-4B"},
      {"qwen3-8b", "Qwen/Qwen3-8B"},
      {"qwen3-14b", "Qwen/Qwen3-14B"},
      {"qwen3-32b", "Qwen/Qwen3-32B"},
      {"qwen3-0.6b-base", "Qwen/Qwen3-0.6B-Base"},
      {"qwen3-1.7b-base", "Qwen/Qwen3-1.7B-Base"},
      {"qwen3-4b-base", "Qwen/Qwen3-4B-Base"},
      {"qwen3-8b-base", "Qwen/Qwen3-8B-Base"},
      {"qwen3-14b-base", "Qwen/Qwen3-14B-Base"},
      {"opt-125m", "facebook/opt-125m"},
      {"opt-350m", "facebook/opt-350m"},
      {"opt-1.3b", "facebook/opt-1.3b"},
      {"opt-2.7b", "facebook/opt-2.7b"},
      {"opt-6.7b", "facebook/opt-6.7b"},
      {"opt-13b", "facebook/opt-13b"},
      {"opt-30b", "facebook/opt-30b"},
      {"opt-66b", "facebook/opt-66b"},
  };
  return kRepos;
}

fs::path hf_hub_cache_dir() {
  if (const std::string v = env("HF_HUB_CACHE"); !v.empty()) return v;
  if (const std::string v = env("HF_HOME"); !v.empty()) return fs::path(v) / "hub";
  if (const std::string v = env("XDG_CACHE_HOME"); !v.empty()) return fs::path(v) / "huggingface" / "hub";
  if (const std::string v = env("HOME"); !v.empty()) return fs::path(v) / ".cache" / "huggingface" / "hub";
  return fs::path(".cache") / "huggingface" / "hub";
}

ResolvedModel resolve_model(const std::string& name_or_path) {
  SYMPRUNE_CHECK(!name_or_path.empty(), "empty model name or path");
  if (is_synthetic_model(name_or_path)) {
    SyntheticSpec spec = parse_synthetic_spec(name_or_path);
    return {{}, "synthetic", std::move(spec)};
  }
  Search search;

  // 1. A directory path.
  if (is_dir(name_or_path)) {
    const fs::path dir(name_or_path);
    SYMPRUNE_CHECK(has_config(dir), "{}: model directory has no config.json{}", dir.string(),
                   unreadable_config(dir));
    return {dir, "path", {}};
  }
  search.looked.push_back(name_or_path + " (not a directory)");

  const auto& repos = known_model_repos();
  std::string repo;
  if (const auto it = repos.find(name_or_path); it != repos.end()) {
    repo = it->second;
  } else if (is_repo_id(name_or_path)) {
    repo = name_or_path;
  }

  // 2. $SYMPRUNE_MODELS.
  const std::string models_root = env("SYMPRUNE_MODELS");
  if (models_root.empty()) {
    search.looked.push_back("$SYMPRUNE_MODELS (not set)");
  } else {
    std::vector<std::string> names;
    if (is_safe_relative(name_or_path)) names.push_back(name_or_path);
    if (!repo.empty()) {
      names.push_back(repo.substr(repo.find('/') + 1));
      names.push_back(repo);
    }
    std::vector<std::string> seen;
    for (const auto& name : names) {
      if (std::find(seen.begin(), seen.end(), name) != seen.end()) continue;
      seen.push_back(name);
      const fs::path dir = fs::path(models_root) / name;
      if (search.accept(dir)) return {dir, "$SYMPRUNE_MODELS", {}};
    }
  }

  // 3. The Hugging Face cache.
  const fs::path cache = hf_hub_cache_dir();
  if (repo.empty()) {
    search.looked.push_back(cache.string() + " (Hugging Face cache: '" + name_or_path +
                            "' is neither a known short name nor an org/name repo id)");
  } else if (auto found = find_in_hf_cache(cache, repo, search)) {
    return *found;
  }

  std::string message = "model '" + name_or_path + "' not found; looked in:";
  for (const auto& place : search.looked) message += "\n  - " + place;
  if (repo.empty()) {
    message += "\nknown short names:";
    for (const auto& [name, id] : repos) message += " " + name;
  }
  throw Error(message);
}

ModelConfig load_model_config(const ResolvedModel& resolved) {
  if (resolved.is_synthetic()) return SyntheticModel(*resolved.synthetic).config();
  return load_config(resolved.dir / "config.json");
}

std::unique_ptr<TensorSource> open_tensor_source(const ResolvedModel& resolved) {
  if (resolved.is_synthetic()) return std::make_unique<SyntheticModel>(*resolved.synthetic);
  return open_weights_dir(resolved.dir);
}

}  // namespace symprune::io
