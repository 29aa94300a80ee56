#pragma once
// Synthetic models of real shapes, for benchmarks and tests without a download:
// `--model synthetic:<shape>[:<seed>][:layers=<n>]`.
//
// Shapes (config.json as Hugging Face publishes them; bf16 weights like the released checkpoints):
//   llama2-7b, llama2-13b, llama2-70b (GQA, 8 kv heads), llama3-8b (GQA, vocab 128256, theta 5e5),
//   opt-1.3b, and small ones: tiny-llama (64 wide, 4 blocks, GQA), tiny-opt (64 wide, 4 blocks),
//   llama-1024 (1024 wide, 4 blocks, vocab 32000).
// `layers=n` keeps the shape but has n decoder blocks (time a few blocks of a big model and scale).
//
// Each tensor's values are generated where they are used, from (seed, tensor name, element index) with a
// counter-based generator (SplitMix64), so any subset of tensors, on any rank, in any order, gives the
// same bytes. Linear and embedding weights are uniform with standard deviation 0.02 (the usual
// initializer scale, which keeps activations of a deep random model bounded); norm weights are
// 1 + uniform(±0.05), OPT biases uniform(±0.01). The copy written by the pruner is sharded like the
// Hugging Face checkpoints (model-0000k-of-0000n.safetensors, at most 5 GB each, with an index).
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/hf_config.h"
#include "io/safetensors.h"
#include "io/tensor_source.h"

namespace symprune::io {

inline constexpr std::string_view kSyntheticPrefix = "synthetic:";

bool is_synthetic_model(std::string_view name);

struct SyntheticSpec {
  std::string shape;  // "llama2-7b"
  uint64_t seed = 0;
  std::optional<int64_t> layers;
  std::string canonical() const;  // "synthetic:llama2-7b:0" (+ ":layers=n")
};

// Parses `synthetic:<shape>[:<seed>][:layers=<n>]`; errors list the known shapes.
SyntheticSpec parse_synthetic_spec(std::string_view name);
std::vector<std::string> synthetic_shapes();

// The config.json a synthetic model has (Hugging Face keys), for the shape and layer count.
nlohmann::json synthetic_config_json(const SyntheticSpec& spec);

// `--calib synthetic`: nsamples × seqlen token ids, uniform in [0, vocab), from (seed, position) with the
// same counter-based generator (for synthetic models, which have no tokenizer).
std::vector<int32_t> synthetic_tokens(uint64_t seed, int64_t nsamples, int64_t seqlen, int64_t vocab);

class SyntheticModel : public TensorSource {
 public:
  explicit SyntheticModel(const SyntheticSpec& spec);
  const SyntheticSpec& spec() const { return spec_; }
  const ModelConfig& config() const { return config_; }

  bool contains(std::string_view name) const override;
  std::vector<std::string> names() const override;
  const TensorInfo& info(std::string_view name) const override;
  std::string location(std::string_view name) const override;
  std::string description() const override { return spec_.canonical(); }
  void read_bytes(std::string_view name, std::vector<std::byte>& out) const override;
  std::vector<Shard> shards() const override;
  bool indexed() const override { return shards().size() > 1; }

 private:
  SyntheticSpec spec_;
  ModelConfig config_;
  std::vector<TensorInfo> tensors_;  // model order
  std::map<std::string, size_t, std::less<>> by_name_;
};

}  // namespace symprune::io
