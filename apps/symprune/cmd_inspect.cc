// `symprune inspect --model M`: where the model was found, its config summary, every tensor (name,
// dtype, shape, file) with totals, and the check that the weights match what config.json implies.
// `symprune inspect FILE.h5`: what a checkpoint (engine/checkpoint.h) holds, and whether its checksums
// verify (exit code 1 when not).
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "command.h"
#include "core/error.h"
#include "io/checkpoint_file.h"
#include "io/hf_config.h"
#include "io/model_layout.h"
#include "io/model_resolver.h"
#include "io/safetensors.h"
#include "io/text_file.h"
#include "io/torch_checkpoint.h"
#include "prune_cli.h"

namespace symprune::app {
namespace {

struct InspectOptions {
  std::string model;
  std::string checkpoint;
  bool no_table = false;
};

// FILE.done, the marker a finished run leaves in place of its checkpoint, is JSON, not HDF5: say what it
// records instead of calling it a corrupt checkpoint.
bool print_completion_marker(const std::string& file) {
  std::error_code ec;
  if (!file.ends_with(".done") || !std::filesystem::is_regular_file(file, ec) ||
      std::filesystem::file_size(file, ec) > (size_t{1} << 20))
    return false;
  std::string text;
  try {
    text = io::read_text_file(file, "completion marker");
  } catch (const Error&) {
    return false;  // binary: a checkpoint named *.done, read as one below
  }
  nlohmann::json marker;
  try {
    marker = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // text, so not a checkpoint either: the message prune gives
    fail("{}: the marker of a finished run is not valid JSON ({}): remove it to run again", file, e.what());
  }
  if (!marker.is_object() || !marker.contains("run_id") || !marker.contains("finished")) return false;
  const auto field = [&](const char* key) {
    const auto it = marker.find(key);
    return it != marker.end() && it->is_string() ? it->get<std::string>() : std::string("-");
  };
  fmt::print("completion marker: {}\n", file);
  fmt::print("run: {} finished {}\n", field("run_id"), field("finished"));
  fmt::print("output: {}\nreport: {}\n", field("out"), field("report"));
  fmt::print(
      "the run's checkpoints were removed when it finished; the same command with --resume does nothing "
      "while its output is in place\n");
  return true;
}

void run_inspect_checkpoint(const std::string& file) {
  // `inspect MODEL_DIR` (or a short name) is the natural slip: say how a model is inspected.
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(file, ec);
  if (!std::filesystem::exists(status) || std::filesystem::is_directory(status))
    fail("inspect {}: {}; to inspect a model, give --model {}", file,
         std::filesystem::exists(status) ? "a directory, not a checkpoint file" : "no such checkpoint file",
         file);
  if (print_completion_marker(file)) return;
  const io::CheckpointReader reader(file);
  const io::CheckpointHeader& h = reader.header();
  fmt::print("checkpoint: {}\n", file);
  fmt::print("format: {} version {}\n", io::kCheckpointFormat, h.version);
  fmt::print("run: {}\n", h.run_id);
  fmt::print("blocks done: {} of {} (resumes at block {})\n", h.next_block, h.blocks, h.next_block + 1);
  bool verified = true;
  std::vector<std::string> problems;
  fmt::print("{:<20}  {:<7}  {:<22}  {:>14}  {}\n", "dataset", "type", "shape", "bytes", "checksums");
  nlohmann::json state;
  for (const auto& name : reader.dataset_names()) {
    const auto shape = reader.shape(name);
    const bool floats = shape.size() > 1;
    int64_t bytes = floats ? 4 : 1;
    for (int64_t d : shape) bytes *= d;
    const auto problem = reader.verify(name);
    if (problem) {
      verified = false;
      problems.push_back(*problem);
    }
    fmt::print("{:<20}  {:<7}  {:<22}  {:>14}  {}\n", name, floats ? "float32" : "uint8",
               fmt::format("[{}]", fmt::join(shape, ", ")), bytes, problem ? "BAD" : "ok");
    if (name == "state" && !problem) {
      std::vector<std::byte> text(static_cast<size_t>(shape.at(0)));
      reader.read_units("state", 0, text);
      state = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(text.data()), text.size()),
                                    nullptr, /*allow_exceptions=*/false);
    }
  }
  if (!state.is_null()) {
    if (const auto disagreement = io::header_disagreement(h, state)) {
      verified = false;
      problems.push_back(*disagreement);
    }
  }
  if (state.is_object()) {
    const auto& identity = state.value("identity", nlohmann::json::object());
    fmt::print("fingerprints: {}\n", identity.value("fingerprints", nlohmann::json::object()).dump());
    fmt::print("configuration: {}\n", identity.value("config", nlohmann::json::object()).dump());
    fmt::print("layers pruned: {}, masks: {}\n", state.value("layers", nlohmann::json::array()).size(),
               state.value("masks", nlohmann::json::array()).size());
  }
  for (const auto& p : problems) fmt::print("problem: {}\n", p);
  fmt::print("checksums: {}\n", verified ? "all verify" : "FAILED");
  // A dataset's problem names the checkpoint already ("checkpoint F: dataset D is corrupt ..."); the
  // header's does not.
  const std::string& first = problems.empty() ? std::string() : problems.front();
  SYMPRUNE_CHECK(
      verified, "{}",
      first.starts_with("checkpoint ") ? first : fmt::format("checkpoint {} is corrupt: {}", file, first));
}

void run_inspect(const InspectOptions& options) {
  const io::ResolvedModel resolved = io::resolve_model(options.model);
  fmt::print("model: {} ({})\n", resolved.display(), resolved.source);
  const io::ModelConfig c = io::load_model_config(resolved);
  const bool llama = c.family == io::ModelFamily::kLlama;
  fmt::print("family: {} ({})\n", llama ? "LLaMA" : "OPT", c.model_type);
  fmt::print("layers: {}, hidden: {}, intermediate: {}, heads: {}, kv heads: {}, head dim: {}\n",
             c.num_layers, c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim);
  fmt::print("vocab: {}, max positions: {}, torch_dtype: {}, tied embeddings: {}\n", c.vocab_size,
             c.max_position_embeddings, c.torch_dtype.empty() ? "(unset)" : c.torch_dtype,
             c.tie_word_embeddings ? "yes" : "no");
  if (llama) {
    std::string scaling = "none";
    if (c.rope_scaling && c.rope_scaling->type != "llama3") {
      scaling = fmt::format("{} (factor {})", c.rope_scaling->type, c.rope_scaling->factor);
    } else if (c.rope_scaling) {
      scaling =
          fmt::format("{} (factor {}, low {}, high {}, original max {})", c.rope_scaling->type,
                      c.rope_scaling->factor, c.rope_scaling->low_freq_factor,
                      c.rope_scaling->high_freq_factor, c.rope_scaling->original_max_position_embeddings);
    }
    fmt::print("rope theta: {}, rope scaling: {}, rms_norm_eps: {}, act: {}\n", c.rope_theta, scaling,
               c.rms_norm_eps, c.hidden_act);
    fmt::print("biases: {}, attention: {}{}\n",
               c.attention_bias ? (c.mlp_bias ? "attention and mlp" : "attention")
               : c.qkv_bias     ? (c.mlp_bias ? "q/k/v and mlp" : "q/k/v")
               : c.mlp_bias     ? "mlp"
                                : "none",
               c.sliding_window
                   ? fmt::format("sliding window of {} (longer sequences are refused)", *c.sliding_window)
                   : std::string("full causal"),
               c.qk_norm ? fmt::format(", q/k RMSNorm per head of {}", c.head_dim) : std::string());
  } else {
    fmt::print("layer norm before: {}, final layer norm: {}, word_embed_proj_dim: {}, biases: {}, act: {}\n",
               c.do_layer_norm_before ? "yes" : "no",
               c.do_layer_norm_before && !c.remove_final_layer_norm ? "yes" : "no", c.word_embed_proj_dim,
               c.enable_bias ? "yes" : "no", c.activation_function);
  }

  const std::unique_ptr<io::TensorSource> source = io::open_tensor_source(resolved);
  const io::TensorSource& weights = *source;
  std::map<std::string, std::string> weight_map;  // tensor -> file
  const auto shards = weights.shards();
  for (const auto& shard : shards)
    for (const auto& t : shard.tensors) weight_map[t] = shard.file;
  // A PyTorch checkpoint: its own files are listed, not the safetensors names of a pruned copy.
  const bool torch_checkpoint = !weights.input_weight_files().empty();
  fmt::print(
      "weights: {} file(s){}{}{}\n", shards.size(),
      weights.indexed()
          ? fmt::format(" via {}", torch_checkpoint ? io::kTorchIndexFile : io::kSafetensorsIndexFile)
          : "",
      resolved.is_synthetic() ? " (synthetic: generated from the seed, the files a pruned copy has)" : "",
      torch_checkpoint ? " (a PyTorch checkpoint, read without running its code; a pruned copy is "
                         "written as safetensors)"
                       : "");

  const auto names = weights.names();
  size_t name_width = 4;
  for (const auto& n : names) name_width = std::max(name_width, n.size());
  if (!options.no_table) {
    fmt::print("{:<{}}  {:<5}  {:<20}  {}\n", "name", name_width, "dtype", "shape", "file");
  }
  int64_t parameters = 0;
  uint64_t bytes = 0;
  std::map<std::string, int64_t> per_dtype;
  for (const auto& n : names) {
    const io::TensorInfo& info = weights.info(n);
    const int64_t numel = info.numel();
    parameters += numel;
    bytes += info.data_end - info.data_begin;
    per_dtype[std::string(dtype_name(info.dtype))] += numel;
    if (!options.no_table) {
      fmt::print("{:<{}}  {:<5}  {:<20}  {}\n", n, name_width, dtype_name(info.dtype),
                 shape_to_string(info.shape),
                 torch_checkpoint
                     ? std::filesystem::path(weights.location(n)).lexically_relative(resolved.dir).string()
                     : weight_map.at(n));
    }
  }
  std::string dtypes;
  for (const auto& [d, count] : per_dtype)
    dtypes += fmt::format("{}{} {}", dtypes.empty() ? "" : ", ", d, count);
  fmt::print("total: {} tensors, {} parameters, {} bytes ({})\n", names.size(), parameters, bytes,
             dtypes.empty() ? "none" : dtypes);

  io::validate_model_tensors(c, weights, io::AmbiguousTiedHead::kWarn);
  const auto expected = io::expected_tensors(c);
  std::set<std::string> used;
  size_t present = 0;
  for (const auto& e : expected) {
    if (auto stored = io::stored_tensor_name(weights, e.name)) {
      used.insert(*stored);
      ++present;
    }
  }
  fmt::print("check: ok, {} tensors match config.json", present);
  if (c.tie_word_embeddings && !weights.contains("lm_head.weight"))
    fmt::print(" (lm_head tied to the embedding)");
  if (used.size() < names.size())
    fmt::print("; {} tensor(s) not used by the model", names.size() - used.size());
  fmt::print("\n");
}

void add_inspect(CLI::App& app) {
  auto options = std::make_shared<InspectOptions>();
  CLI::App* sub = app.add_subcommand(
      "inspect",
      "Show a model's config and tensors and check the weights against config.json, or what a checkpoint "
      "holds");
  auto* model = sub->add_option("--model", options->model, model_option_description());
  auto* checkpoint = sub->add_option("checkpoint", options->checkpoint,
                                     "a checkpoint file (--checkpoint of prune) to describe");
  model->excludes(checkpoint);
  sub->add_flag("--no-table", options->no_table, "omit the per-tensor table");
  sub->callback([options] {
    SYMPRUNE_CHECK(!options->model.empty() || !options->checkpoint.empty(),
                   "inspect: give --model M (a model) or a checkpoint FILE.h5");
    if (!options->checkpoint.empty()) {
      run_inspect_checkpoint(options->checkpoint);
    } else {
      run_inspect(*options);
    }
  });
}

}  // namespace
}  // namespace symprune::app

SYMPRUNE_REGISTER_COMMAND(inspect, symprune::app::add_inspect);
