// Model resolution: directory paths, $SYMPRUNE_MODELS and the Hugging Face cache layout, emulated in
// temporary directories; the not-found error must list every place looked at.
#include "io/model_resolver.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "core/error.h"
#include "support/test_support.h"

namespace symprune::io {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;

class ModelResolverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = symprune::testing::make_temp_dir("symprune_resolve_");
    for (const char* name : kVars) {
      const char* v = std::getenv(name);
      saved_[name] = v ? std::optional<std::string>(v) : std::nullopt;
      ::unsetenv(name);
    }
    // A HOME without a cache, so the default location is deterministic.
    ::setenv("HOME", (root_ / "home").c_str(), 1);
  }
  void TearDown() override {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
    fs::remove_all(root_);
  }

  static fs::path make_model(const fs::path& dir) {
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << R"({"model_type": "llama"})";
    return dir;
  }

  // models--org--name with snapshots `revisions` and refs/main = `main` (none when empty).
  fs::path make_hf_repo(const fs::path& cache, const std::string& folder,
                        const std::vector<std::string>& revisions, const std::string& main) {
    const fs::path repo = cache / folder;
    for (const auto& rev : revisions) make_model(repo / "snapshots" / rev);
    if (!main.empty()) {
      fs::create_directories(repo / "refs");
      std::ofstream(repo / "refs" / "main") << main << "\n";
    }
    return repo;
  }

  std::string resolve_error(const std::string& name) {
    try {
      resolve_model(name);
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected an error for " << name;
    return {};
  }

  static constexpr const char* kVars[] = {"SYMPRUNE_MODELS", "HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME",
                                          "HOME"};
  fs::path root_;
  std::map<std::string, std::optional<std::string>> saved_;
};

TEST_F(ModelResolverTest, KnownShortNames) {
  const auto& repos = known_model_repos();
  EXPECT_EQ(repos.at("llama2-7b"), "meta-llama/Llama-2-7b-hf");
  EXPECT_EQ(repos.at("llama2-13b"), "meta-llama/Llama-2-13b-hf");
  EXPECT_EQ(repos.at("llama2-70b"), "meta-llama/Llama-2-70b-hf");
  EXPECT_EQ(repos.at("llama3-8b"), "meta-llama/Meta-Llama-3-8B");
  EXPECT_EQ(repos.at("llama3-70b"), "meta-llama/Meta-Llama-3-70B");
  EXPECT_EQ(repos.at("llama3.1-8b"), "meta-llama/Llama-3.1-8B");
  EXPECT_EQ(repos.at("mistral-7b"), "mistralai/Mistral-7B-v0.1");
  EXPECT_EQ(repos.at("qwen2.5-7b"), "Qwen/Qwen2.5-7B");
  EXPECT_EQ(repos.at("qwen3-0.6b"), "Qwen/Qwen3-0.6B");
  EXPECT_EQ(repos.at("qwen3-8b"), "Qwen/Qwen3-8B");
  EXPECT_EQ(repos.at("qwen3-8b-base"), "Qwen/Qwen3-8B-Base");
  EXPECT_EQ(repos.at("qwen3-32b"), "Qwen/Qwen3-32B");
  for (const char* size : {"125m", "350m", "1.3b", "2.7b", "6.7b", "13b", "30b", "66b"}) {
    EXPECT_EQ(repos.at(std::string("opt-") + size), std::string("facebook/opt-") + size);
  }
}

TEST_F(ModelResolverTest, DirectoryPathWins) {
  const fs::path dir = make_model(root_ / "my-model");
  ::setenv("SYMPRUNE_MODELS", root_.c_str(), 1);
  const ResolvedModel m = resolve_model(dir.string());
  EXPECT_EQ(m.dir, dir);
  EXPECT_EQ(m.source, "path");
}

TEST_F(ModelResolverTest, DirectoryWithoutConfigIsAnError) {
  fs::create_directories(root_ / "empty");
  EXPECT_THAT(resolve_error((root_ / "empty").string()),
              HasSubstr((root_ / "empty").string() + ": model directory has no config.json"));
}

TEST_F(ModelResolverTest, SymprumeModelsDirectory) {
  const fs::path models = root_ / "models";
  make_model(models / "llama2-7b");
  ::setenv("SYMPRUNE_MODELS", models.c_str(), 1);
  const ResolvedModel m = resolve_model("llama2-7b");
  EXPECT_EQ(m.dir, models / "llama2-7b");
  EXPECT_EQ(m.source, "$SYMPRUNE_MODELS");
  // The repo's own name is found too (e.g. a git clone of the Hub repo).
  make_model(models / "opt-125m-clone");
  make_model(models / "Meta-Llama-3-8B");
  EXPECT_EQ(resolve_model("llama3-8b").dir, models / "Meta-Llama-3-8B");
  // And org/name below the root.
  make_model(models / "facebook" / "opt-1.3b");
  EXPECT_EQ(resolve_model("opt-1.3b").dir, models / "facebook" / "opt-1.3b");
  EXPECT_EQ(resolve_model("opt-125m-clone").dir, models / "opt-125m-clone");
}

TEST_F(ModelResolverTest, HfCacheFollowsRefsMain) {
  const fs::path cache = root_ / "hub";
  make_hf_repo(cache, "models--meta-llama--Llama-2-13b-hf", {"aaa111", "bbb222"}, "bbb222");
  ::setenv("HF_HUB_CACHE", cache.c_str(), 1);
  const ResolvedModel m = resolve_model("llama2-13b");
  EXPECT_EQ(m.dir, cache / "models--meta-llama--Llama-2-13b-hf" / "snapshots" / "bbb222");
  EXPECT_EQ(m.source, "hf-cache meta-llama/Llama-2-13b-hf@bbb222");
  // A repo id works as well as a short name.
  EXPECT_EQ(resolve_model("meta-llama/Llama-2-13b-hf").dir, m.dir);
}

TEST_F(ModelResolverTest, HfHomeAndDefaultCacheLocations) {
  ::setenv("HF_HOME", (root_ / "hfhome").c_str(), 1);
  EXPECT_EQ(hf_hub_cache_dir(), root_ / "hfhome" / "hub");
  make_hf_repo(root_ / "hfhome" / "hub", "models--facebook--opt-125m", {"r1"}, "r1");
  EXPECT_EQ(resolve_model("opt-125m").dir,
            root_ / "hfhome" / "hub" / "models--facebook--opt-125m" / "snapshots" / "r1");
  ::setenv("HF_HUB_CACHE", (root_ / "explicit").c_str(), 1);
  EXPECT_EQ(hf_hub_cache_dir(), root_ / "explicit");
  ::unsetenv("HF_HUB_CACHE");
  ::unsetenv("HF_HOME");
  EXPECT_EQ(hf_hub_cache_dir(), root_ / "home" / ".cache" / "huggingface" / "hub");
  make_hf_repo(root_ / "home" / ".cache" / "huggingface" / "hub", "models--facebook--opt-350m", {"r2"}, "r2");
  EXPECT_EQ(resolve_model("opt-350m").source, "hf-cache facebook/opt-350m@r2");
}

TEST_F(ModelResolverTest, HfCacheFallsBackToTheOnlyOrNewestSnapshot) {
  const fs::path cache = root_ / "hub";
  ::setenv("HF_HUB_CACHE", cache.c_str(), 1);
  // No refs/main: the only snapshot.
  make_hf_repo(cache, "models--facebook--opt-2.7b", {"only"}, "");
  EXPECT_EQ(resolve_model("opt-2.7b").dir.filename(), "only");
  // refs/main names a snapshot that is gone: the most recently modified one.
  const fs::path repo = make_hf_repo(cache, "models--facebook--opt-6.7b", {"old", "new"}, "gone");
  const auto now = fs::file_time_type::clock::now();
  fs::last_write_time(repo / "snapshots" / "old", now - std::chrono::hours(2));
  fs::last_write_time(repo / "snapshots" / "new", now - std::chrono::hours(1));
  EXPECT_EQ(resolve_model("opt-6.7b").dir, repo / "snapshots" / "new");
}

TEST_F(ModelResolverTest, SymprumeModelsComesBeforeTheCache) {
  make_model(root_ / "models" / "opt-13b");
  make_hf_repo(root_ / "hub", "models--facebook--opt-13b", {"r"}, "r");
  ::setenv("SYMPRUNE_MODELS", (root_ / "models").c_str(), 1);
  ::setenv("HF_HUB_CACHE", (root_ / "hub").c_str(), 1);
  EXPECT_EQ(resolve_model("opt-13b").source, "$SYMPRUNE_MODELS");
}

TEST_F(ModelResolverTest, NotFoundListsEveryPlace) {
  const fs::path models = root_ / "models";
  fs::create_directories(models / "llama2-70b");  // exists but has no config.json
  ::setenv("SYMPRUNE_MODELS", models.c_str(), 1);
  ::setenv("HF_HUB_CACHE", (root_ / "hub").c_str(), 1);
  const std::string msg = resolve_error("llama2-70b");
  EXPECT_THAT(msg, HasSubstr("model 'llama2-70b' not found; looked in:"));
  EXPECT_THAT(msg, HasSubstr("llama2-70b (not a directory)"));
  EXPECT_THAT(msg, HasSubstr((models / "llama2-70b").string() + " (no config.json)"));
  EXPECT_THAT(msg, HasSubstr((models / "Llama-2-70b-hf").string() + " (does not exist)"));
  EXPECT_THAT(msg, HasSubstr((models / "meta-llama" / "Llama-2-70b-hf").string() + " (does not exist)"));
  EXPECT_THAT(msg, HasSubstr((root_ / "hub" / "models--meta-llama--Llama-2-70b-hf").string() +
                             " (Hugging Face cache for meta-llama/Llama-2-70b-hf: does not exist)"));
  EXPECT_THAT(msg, Not(HasSubstr("known short names")));
}

TEST_F(ModelResolverTest, NotFoundWithoutEnvironmentAndUnknownName) {
  const std::string msg = resolve_error("llama9-1t");
  EXPECT_THAT(msg, HasSubstr("$SYMPRUNE_MODELS (not set)"));
  EXPECT_THAT(msg, HasSubstr((root_ / "home" / ".cache" / "huggingface" / "hub").string()));
  EXPECT_THAT(msg, HasSubstr("'llama9-1t' is neither a known short name nor an org/name repo id"));
  EXPECT_THAT(msg, HasSubstr("known short names:"));
  EXPECT_THAT(msg, HasSubstr("llama2-13b"));
  EXPECT_THAT(msg, HasSubstr("opt-1.3b"));
}

TEST_F(ModelResolverTest, CacheRepoWithoutUsableSnapshot) {
  const fs::path cache = root_ / "hub";
  ::setenv("HF_HUB_CACHE", cache.c_str(), 1);
  fs::create_directories(cache / "models--facebook--opt-30b" / "snapshots" / "r");  // no config.json
  fs::create_directories(cache / "models--facebook--opt-30b" / "refs");
  std::ofstream(cache / "models--facebook--opt-30b" / "refs" / "main") << "r";
  const std::string msg = resolve_error("opt-30b");
  EXPECT_THAT(msg, HasSubstr((cache / "models--facebook--opt-30b" / "snapshots" / "r").string() +
                             " (no config.json)"));
  EXPECT_THAT(msg, HasSubstr((cache / "models--facebook--opt-30b" / "snapshots").string() +
                             " (no snapshot with config.json)"));
}

TEST_F(ModelResolverTest, EmptyNameAndEscapingRefs) {
  EXPECT_THAT(resolve_error(""), HasSubstr("empty model name or path"));
  // A refs/main that tries to leave the snapshots folder is ignored (and reported).
  const fs::path cache = root_ / "hub";
  ::setenv("HF_HUB_CACHE", cache.c_str(), 1);
  make_model(cache / "models--facebook--opt-66b" / "outside");
  fs::create_directories(cache / "models--facebook--opt-66b" / "refs");
  std::ofstream(cache / "models--facebook--opt-66b" / "refs" / "main") << "../outside";
  const std::string msg = resolve_error("opt-66b");
  EXPECT_THAT(msg, HasSubstr("refs/main (missing, or not a plain revision name)"));
}

}  // namespace
}  // namespace symprune::io
