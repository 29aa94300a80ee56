// The layer-wise pruning pipeline and the pruned-model writer on a tiny random LLaMA written to
// safetensors here (with a 272-token llama2.c tokenizer.bin: specials, 256 bytes, a..m; and a uint16 token
// file for calibration).
#include "engine/prune_pipeline.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/masks.h"
#include "dist/communicator.h"
#include "engine/block_statistics.h"
#include "engine/checkpoint.h"
#include "engine/pruned_model_writer.h"
#include "engine/run_plan.h"
#include "io/calibration.h"
#include "io/checkpoint_file.h"
#include "io/model_layout.h"
#include "io/model_resolver.h"
#include "io/output_dir.h"
#include "io/safetensors.h"
#include "io/synthetic_model.h"
#include "io/tokenizer.h"
#include "model/decoder_model.h"
#include "support/test_support.h"

namespace symprune::engine {
namespace {
namespace fs = std::filesystem;

constexpr int64_t kVocab = 272, kHidden = 8, kFfn = 12, kLayers = 2, kHeads = 2, kKvHeads = 1;
const std::vector<std::string> kLinears = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                           "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                           "mlp.down_proj"};

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every file of a directory with its bytes (to prove the input is untouched).
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    files[e.path().filename().string()] = read_bytes(e.path());
  return files;
}

// llama2.c tokenizer.bin: max_token_length, then per token (score f32, length i32, bytes).
std::string llama2c_tokenizer_bytes() {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  for (int b = 0; b < 256; ++b) tokens.push_back(fmt::format("<0x{:02X}>", b));
  for (char ch = 'a'; tokens.size() < static_cast<size_t>(kVocab); ++ch) tokens.push_back(std::string(1, ch));
  std::string out;
  auto put = [&](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  const int32_t max_len = 6;
  put(&max_len, 4);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const float score = -static_cast<float>(i);
    const int32_t len = static_cast<int32_t>(tokens[i].size());
    put(&score, 4);
    put(&len, 4);
    put(tokens[i].data(), tokens[i].size());
  }
  return out;
}

struct TinyModelOptions {
  DType dtype = DType::kF32;
  uint64_t max_shard_bytes = 0;  // 0 = one model.safetensors
};

fs::path make_tiny_llama(const TinyModelOptions& options = {}) {
  const auto dir = testing::make_temp_dir("symprune_prune");
  write_bytes(dir / "config.json", R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 12,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 272,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": false, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "float32"})");
  write_bytes(dir / "tokenizer.bin", llama2c_tokenizer_bytes());
  write_bytes(dir / "generation_config.json", R"({"bos_token_id": 1})");
  std::mt19937 gen(11);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  const int64_t hd = kHidden / kHeads;
  shapes.push_back({"model.embed_tokens.weight", {kVocab, kHidden}});
  for (int64_t i = 0; i < kLayers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    shapes.push_back({p + "input_layernorm.weight", {kHidden}});
    shapes.push_back({p + "self_attn.q_proj.weight", {kHeads * hd, kHidden}});
    shapes.push_back({p + "self_attn.k_proj.weight", {kKvHeads * hd, kHidden}});
    shapes.push_back({p + "self_attn.v_proj.weight", {kKvHeads * hd, kHidden}});
    shapes.push_back({p + "self_attn.o_proj.weight", {kHidden, kHeads * hd}});
    shapes.push_back({p + "post_attention_layernorm.weight", {kHidden}});
    shapes.push_back({p + "mlp.gate_proj.weight", {kFfn, kHidden}});
    shapes.push_back({p + "mlp.up_proj.weight", {kFfn, kHidden}});
    shapes.push_back({p + "mlp.down_proj.weight", {kHidden, kFfn}});
  }
  shapes.push_back({"model.norm.weight", {kHidden}});
  shapes.push_back({"lm_head.weight", {kVocab, kHidden}});
  std::vector<std::vector<std::byte>> storage;
  std::vector<io::TensorToWrite> to_write;
  for (const auto& [name, shape] : shapes) {
    const bool norm = shape.size() == 1;
    const int64_t numel = shape_numel(shape);
    std::vector<std::byte> bytes(static_cast<size_t>(numel * dtype_size(options.dtype)));
    for (int64_t i = 0; i < numel; ++i) {
      float v = norm ? 1.0f + 0.1f * dist(gen) : dist(gen);
      if (v == 0.0f) v = 0.25f;  // no stored zeros: a zero in the output is always a pruned entry
      if (options.dtype == DType::kF32) {
        std::memcpy(bytes.data() + i * 4, &v, 4);
      } else {
        const uint16_t h = options.dtype == DType::kF16 ? float_to_fp16(v) : float_to_bf16(v);
        std::memcpy(bytes.data() + i * 2, &h, 2);
      }
    }
    storage.push_back(std::move(bytes));
    to_write.push_back({name, options.dtype, shape, storage.back()});
  }
  if (options.max_shard_bytes > 0)
    io::write_safetensors_sharded(dir, to_write, {{"format", "pt"}, {"origin", "test"}},
                                  options.max_shard_bytes);
  else
    io::write_safetensors(dir / "model.safetensors", to_write, {{"format", "pt"}, {"origin", "test"}});
  // Calibration: a uint16 token stream (token files carry their own BOS).
  std::mt19937 tgen(5);
  std::uniform_int_distribution<int> tok(0, kVocab - 1);
  std::string calib;
  for (int i = 0; i < 600; ++i) {
    const uint16_t t = static_cast<uint16_t>(i == 0 ? 1 : tok(tgen));
    calib.append(reinterpret_cast<const char*>(&t), 2);
  }
  write_bytes(dir.parent_path() / (dir.filename().string() + "_calib.bin"), calib);
  return dir;
}

fs::path calib_of(const fs::path& dir) {
  return dir.parent_path() / (dir.filename().string() + "_calib.bin");
}

PruneConfig base_config(const fs::path& model, const fs::path& out, const std::string& method) {
  PruneConfig c;
  c.model = model.string();
  c.method = method;
  c.sparsity = 0.5;
  c.calib = calib_of(model).string();
  c.nsamples = 8;
  c.seqlen = 16;
  c.out = out;
  return c;
}

void expect_error(const PruneConfig& c, const std::string& message);

bool is_linear(const std::string& name) {
  for (const auto& l : kLinears)
    if (name.ends_with(l + ".weight")) return true;
  return false;
}

// Checks the output against the input: same names, dtypes, shapes and shards; non-linear tensors
// bit-identical; in linear tensors each element is either all-zero bits or bit-identical. Returns the
// pruned-entry count per row of every linear.
std::map<std::string, std::vector<int64_t>> compare_weights(const fs::path& in_dir, const fs::path& out_dir) {
  const auto in = io::SafetensorsModel::open_dir(in_dir);
  const auto out = io::SafetensorsModel::open_dir(out_dir);
  EXPECT_EQ(in.names(), out.names());
  EXPECT_EQ(in.weight_map(), out.weight_map());
  std::map<std::string, std::vector<int64_t>> zeros_per_row;
  for (const auto& name : in.names()) {
    const auto& a = in.info(name);
    const auto& b = out.info(name);
    EXPECT_EQ(a.dtype, b.dtype) << name;
    EXPECT_EQ(a.shape, b.shape) << name;
    const auto x = in.bytes(name), y = out.bytes(name);
    EXPECT_EQ(x.size(), y.size()) << name;
    if (!is_linear(name)) {
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size()), 0) << name;
      continue;
    }
    const size_t w = static_cast<size_t>(dtype_size(a.dtype));
    const int64_t rows = a.shape[0], cols = a.shape[1];
    std::vector<int64_t>& counts = zeros_per_row[name];
    counts.assign(static_cast<size_t>(rows), 0);
    for (int64_t i = 0; i < rows * cols; ++i) {
      const std::byte* p = y.data() + static_cast<size_t>(i) * w;
      bool zero = true;
      for (size_t k = 0; k < w; ++k) zero = zero && p[k] == std::byte{0};
      if (zero) {
        ++counts[static_cast<size_t>(i / cols)];
      } else {
        EXPECT_EQ(std::memcmp(p, x.data() + static_cast<size_t>(i) * w, w), 0) << name << " element " << i;
      }
    }
  }
  return zeros_per_row;
}

class PrunePipeline : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = make_tiny_llama();
    work_ = testing::make_temp_dir("symprune_prune_out");
  }
  void TearDown() override {
    fs::remove_all(model_);
    fs::remove(calib_of(model_));
    fs::remove_all(work_);
  }
  fs::path model_, work_;
};

TEST_F(PrunePipeline, WandaRowSparsityIsExactAndOtherWeightsAreBitIdentical) {
  const auto before = snapshot(model_);
  const auto out = work_ / "pruned";
  std::vector<int64_t> progress;
  const PruneResult r = prune_model(base_config(model_, out, "wanda"), [&](const BlockProgress& p) {
    progress.push_back(p.block * 10 + p.blocks);
  });
  EXPECT_EQ(progress, (std::vector<int64_t>{2, 12}));
  EXPECT_EQ(snapshot(model_), before);  // the input is untouched
  const auto zeros = compare_weights(model_, out);
  ASSERT_EQ(zeros.size(), kLinears.size() * kLayers);
  for (const auto& [name, counts] : zeros) {
    const int64_t cols = io::SafetensorsModel::open_dir(model_).info(name).shape[1];
    for (int64_t c : counts) EXPECT_EQ(c, cols / 2) << name;
  }
  // Non-weight files are copied byte-identical; only model.safetensors is rewritten.
  EXPECT_EQ(read_bytes(out / "config.json"), before.at("config.json"));
  EXPECT_EQ(read_bytes(out / "tokenizer.bin"), before.at("tokenizer.bin"));
  EXPECT_EQ(read_bytes(out / "generation_config.json"), before.at("generation_config.json"));
  EXPECT_EQ(io::SafetensorsModel::open_dir(out).metadata().at("origin"), "test");
  EXPECT_EQ(io::SafetensorsModel::open_dir(out).metadata().at("format"), "pt");
  // Nothing else was left beside --out (temp dirs are gone).
  EXPECT_EQ(std::distance(fs::directory_iterator(work_), fs::directory_iterator{}), 1);

  ASSERT_EQ(r.layers.size(), kLinears.size() * kLayers);
  EXPECT_EQ(r.layers[0].name, "0.self_attn.q_proj");
  EXPECT_EQ(r.layers.back().name, "1.mlp.down_proj");
  int64_t total = 0, pruned = 0;
  for (const auto& l : r.layers) {
    EXPECT_DOUBLE_EQ(l.sparsity, 0.5) << l.name;
    EXPECT_EQ(l.pruned, l.shape[0] * l.shape[1] / 2);
    ASSERT_TRUE(l.recon_error.has_value()) << l.name;
    EXPECT_GT(*l.recon_error, 0.0) << l.name;
    EXPECT_LE(*l.recon_error, 1.0) << l.name;
    total += l.shape[0] * l.shape[1];
    pruned += l.pruned;
  }
  EXPECT_EQ(r.params_total, total);
  EXPECT_EQ(r.pruned_total, pruned);
  EXPECT_DOUBLE_EQ(r.sparsity_total(), 0.5);
  EXPECT_FALSE(r.calibration_fingerprint.empty());
  const auto report = r.report();
  EXPECT_EQ(report["config"]["method"], "wanda");
  EXPECT_EQ(report["config"]["alpha"], 1.0);
  EXPECT_EQ(report["config"]["calib_format"], "tokens-u16");
  EXPECT_EQ(report["sparsity"]["target"], 0.5);
  EXPECT_EQ(report["layers"].size(), 14u);
  EXPECT_TRUE(report["fingerprints"]["calibration"].is_string());
  EXPECT_FALSE(report.contains("perplexity"));
}

// Records every linear input of a block run.
struct RecordingObserver : model::LinearObserver {
  std::map<std::string, Tensor> inputs;
  void on_linear(const model::LinearId& id, const Tensor& input, const Tensor&, const Tensor*) override {
    inputs[id.name] = input;
  }
};

// The reconstruction error recomputed directly: X from a dense run of each block on the inputs the pipeline
// gives it (the pruned previous blocks), ΔW = W − W̃ from the written model, ‖ΔW Xᵀ‖ / ‖W Xᵀ‖ in fp64.
TEST_F(PrunePipeline, ReconstructionErrorMatchesADirectComputation) {
  const auto c = base_config(model_, work_ / "recon", "wanda");
  const PruneResult r = prune_model(c);
  auto tokenizer = io::load_tokenizer(model_);
  const io::CalibrationSet calib = io::load_calibration(
      {.file = c.calib, .nsamples = c.nsamples, .seqlen = c.seqlen, .seed = c.seed}, *tokenizer, kVocab);
  auto m = model::DecoderModel::open(model_);
  const auto pruned = io::SafetensorsModel::open_dir(work_ / "recon");
  Tensor h = m.embed(calib.tokens, c.nsamples, c.seqlen);
  size_t layer_index = 0;
  for (int64_t b = 0; b < kLayers; ++b) {
    RecordingObserver obs;
    Tensor dense = h;
    m.run_block(b, dense, c.nsamples, c.seqlen, &obs);
    for (const auto& name : kLinears) {
      const Tensor& w = m.block_weights(b).linears.at(name).weight;
      const Tensor wp = pruned.load_f32("model.layers." + std::to_string(b) + "." + name + ".weight");
      const Tensor& x = obs.inputs.at(name);
      const int64_t rows = x.numel() / w.dim(1), mo = w.dim(0), n = w.dim(1);
      double num = 0, den = 0;
      for (int64_t t = 0; t < rows; ++t)
        for (int64_t o = 0; o < mo; ++o) {
          double y = 0, d = 0;
          for (int64_t i = 0; i < n; ++i) {
            y += static_cast<double>(w[o * n + i]) * x[t * n + i];
            d += static_cast<double>(w[o * n + i] - wp[o * n + i]) * x[t * n + i];
          }
          den += y * y;
          num += d * d;
        }
      const LayerResult& l = r.layers.at(layer_index++);
      ASSERT_EQ(l.name, std::to_string(b) + "." + name);
      ASSERT_TRUE(l.recon_error.has_value());
      EXPECT_NEAR(*l.recon_error, std::sqrt(num / den), 1e-4 * std::sqrt(num / den)) << l.name;
    }
    for (const auto& name : kLinears)
      m.set_linear_weight({b, name},
                          pruned.load_f32("model.layers." + std::to_string(b) + "." + name + ".weight"));
    m.run_block(b, h, c.nsamples, c.seqlen);
  }
}

TEST_F(PrunePipeline, SparsityZeroLeavesEveryWeightAndHasZeroReconstructionError) {
  auto c = base_config(model_, work_ / "same", "ria");
  c.sparsity = 0.0;
  const PruneResult r = prune_model(c);
  for (const auto& l : r.layers) {
    EXPECT_EQ(l.pruned, 0);
    ASSERT_TRUE(l.recon_error.has_value());
    EXPECT_EQ(*l.recon_error, 0.0);
  }
  for (const auto& [name, counts] : compare_weights(model_, work_ / "same"))
    for (int64_t n : counts) EXPECT_EQ(n, 0) << name;
}

TEST_F(PrunePipeline, MagnitudeNeedsNoCalibrationAndPrunesTheSmallestPerRow) {
  auto c = base_config(model_, work_ / "mag", "magnitude");
  c.calib.clear();
  const PruneResult r = prune_model(c);
  EXPECT_TRUE(r.calibration_fingerprint.empty());
  for (const auto& l : r.layers) EXPECT_FALSE(l.recon_error.has_value()) << l.name;
  compare_weights(model_, work_ / "mag");
  const auto in = io::SafetensorsModel::open_dir(model_);
  const auto out = io::SafetensorsModel::open_dir(work_ / "mag");
  for (const auto& name : in.names()) {
    if (!is_linear(name)) continue;
    const Tensor w = in.load_f32(name), p = out.load_f32(name);
    const int64_t rows = w.dim(0), cols = w.dim(1);
    for (int64_t row = 0; row < rows; ++row) {
      float max_pruned = 0, min_kept = INFINITY;
      int64_t pruned = 0;
      for (int64_t col = 0; col < cols; ++col) {
        const float a = std::fabs(w[row * cols + col]);
        if (p[row * cols + col] == 0.0f) {
          max_pruned = std::max(max_pruned, a);
          ++pruned;
        } else {
          min_kept = std::min(min_kept, a);
        }
      }
      EXPECT_EQ(pruned, cols / 2);
      EXPECT_LE(max_pruned, min_kept) << name << " row " << row;
    }
  }
}

TEST_F(PrunePipeline, LayerGroupAndNmCountsAreExact) {
  auto c = base_config(model_, work_ / "layer", "wanda");
  c.sparsity = 0.3;
  c.group = "layer";
  for (const auto& l : prune_model(c).layers)
    EXPECT_EQ(l.pruned, prune_count(l.shape[0] * l.shape[1], 0.3)) << l.name;

  auto nm = base_config(model_, work_ / "nm", "ria");
  nm.sparsity.reset();
  nm.nm = "2:4";
  const PruneResult r = prune_model(nm);
  EXPECT_DOUBLE_EQ(r.sparsity_target, 0.5);
  const auto out = io::SafetensorsModel::open_dir(work_ / "nm");
  for (const auto& name : out.names()) {
    if (!is_linear(name)) continue;
    const Tensor p = out.load_f32(name);
    const int64_t cols = p.dim(1);
    for (int64_t row = 0; row < p.dim(0); ++row)
      for (int64_t g = 0; g < cols; g += 4) {
        int zeros = 0;
        for (int64_t k = 0; k < 4; ++k) zeros += p[row * cols + g + k] == 0.0f;
        EXPECT_EQ(zeros, 2) << name << " row " << row << " group " << g;
      }
  }
}

TEST_F(PrunePipeline, CompatWandaMagnitudeUsesTheLayerThresholdRule) {
  // DSnoT's magnitude is Wanda's code: the same rule under --compat dsnot.
  for (const char* compat : {"wanda", "dsnot"}) {
    auto c = base_config(model_, work_ / (std::string("compat_magnitude_") + compat), "magnitude");
    c.calib.clear();
    c.compat = compat;
    const PruneResult r = prune_model(c);
    EXPECT_EQ(r.report()["config"]["group"], "layer") << compat;
    EXPECT_EQ(r.mask_description, describe(MaskSpec::layer(0.5, true))) << compat;
    // "≤ θ" with θ = sorted[k]: at least k + 1 pruned.
    for (const auto& l : r.layers)
      EXPECT_GE(l.pruned, prune_count(l.shape[0] * l.shape[1], 0.5) + 1) << compat << " " << l.name;
  }

  // Wanda itself stays per output row; without --seqlen, T = max_position_embeddings (64 here).
  auto w = base_config(model_, work_ / "compat_wanda", "wanda");
  w.compat = "wanda";
  w.seqlen = 0;
  const PruneResult rw = prune_model(w);
  EXPECT_EQ(rw.report()["config"]["seqlen"], 64);
  EXPECT_EQ(rw.report()["config"]["group"], "row");
  for (const auto& l : rw.layers) EXPECT_EQ(l.pruned, l.shape[0] * (l.shape[1] / 2)) << l.name;
  // Default mode: 2048, beyond this model's 64 positions.
  w.compat = "none";
  w.out = work_ / "default_seqlen";
  // The default is named as the default, with the model's maximum as the way out.
  expect_error(w, "--seqlen defaults to 2048, which exceeds max_position_embeddings 64 of " +
                      (model_ / "config.json").string() + ": pass --seqlen 64 (the model's maximum) or less");
  w.seqlen = 2048;
  expect_error(w, "--seqlen 2048 exceeds max_position_embeddings 64 of " + (model_ / "config.json").string());
}

TEST_F(PrunePipeline, CompatDsnotRefinesAPerRowMagnitudeMask) {
  // DSnoT's --initial_method magnitude sorts each row (reference-implementations.md §5.2 step 1): exactly
  // floor(n/2) per row before and after the refinement (a swap keeps the row's count), in every linear, the
  // skipped MLP ones included; --group layer still asks for the layer rule.
  for (const char* refine : {"dsnot", "r2dsnot"}) {
    auto c = base_config(model_, work_ / (std::string("compat_dsnot_magnitude_") + refine), "magnitude");
    c.compat = "dsnot";
    c.refine = refine;
    c.seqlen = 32;
    const PruneResult r = prune_model(c);
    EXPECT_EQ(r.report()["config"]["group"], "row") << refine;
    const auto out = io::SafetensorsModel::open_dir(c.out);
    for (const auto& name : out.names()) {
      if (!is_linear(name)) continue;
      const Tensor p = out.load_f32(name);
      for (int64_t row = 0; row < p.dim(0); ++row) {
        int64_t zeros = 0;
        for (int64_t col = 0; col < p.dim(1); ++col) zeros += p[row * p.dim(1) + col] == 0.0f;
        EXPECT_EQ(zeros, p.dim(1) / 2) << refine << " " << name << " row " << row;
      }
    }
  }
  auto layer = base_config(model_, work_ / "compat_dsnot_magnitude_layer", "magnitude");
  layer.compat = "dsnot";
  layer.refine = "dsnot";
  layer.group = "layer";
  layer.seqlen = 32;
  EXPECT_EQ(prune_model(layer).report()["config"]["group"], "layer");
}

TEST_F(PrunePipeline, CompatDsnotKeepsItsFixedLength) {
  // DSnoT's length is 2048 whatever the model's maximum (Wanda's mask rules: the test above).
  auto w = base_config(model_, work_ / "compat_dsnot_wanda", "wanda");
  w.compat = "dsnot";
  w.seqlen = 0;
  expect_error(w, "--seqlen defaults to 2048, which exceeds max_position_embeddings 64 of " +
                      (model_ / "config.json").string() + ": pass --seqlen 64 (the model's maximum) or less");
  w.seqlen = 32;
  const PruneResult rw = prune_model(w);
  EXPECT_EQ(rw.report()["config"]["group"], "row");
  for (const auto& l : rw.layers) EXPECT_EQ(l.pruned, l.shape[0] * (l.shape[1] / 2)) << l.name;
}

TEST(PrunePipelineDtypes, F16InputStaysF16AndShardingIsKept) {
  const fs::path model = make_tiny_llama({DType::kF16, 700});
  const fs::path work = testing::make_temp_dir("symprune_prune_f16");
  const auto before = snapshot(model);
  ASSERT_TRUE(before.count("model.safetensors.index.json"));
  const PruneResult r = prune_model(base_config(model, work / "out", "symwanda"));
  EXPECT_DOUBLE_EQ(r.sparsity_total(), 0.5);
  EXPECT_EQ(snapshot(model), before);
  const auto zeros = compare_weights(model, work / "out");  // same weight_map, dtypes, bits
  for (const auto& [name, counts] : zeros)
    for (int64_t n : counts) EXPECT_EQ(n * 2, io::SafetensorsModel::open_dir(model).info(name).shape[1]);
  const auto out = io::SafetensorsModel::open_dir(work / "out");
  EXPECT_TRUE(out.sharded());
  for (const auto& name : out.names()) EXPECT_EQ(out.info(name).dtype, DType::kF16) << name;
  EXPECT_EQ(read_bytes(work / "out" / "model.safetensors.index.json"),
            before.at("model.safetensors.index.json"));
  fs::remove_all(model);
  fs::remove(calib_of(model));
  fs::remove_all(work);
}

// Bad input: the message, and nothing written at --out.
void expect_error(const PruneConfig& c, const std::string& message) {
  try {
    prune_model(c);
    ADD_FAILURE() << "no error, expected: " << message;
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), message);
  }
  EXPECT_FALSE(fs::exists(c.out)) << c.out;
  for (const auto& e : fs::directory_iterator(c.out.parent_path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

TEST_F(PrunePipeline, BadInputErrorsWriteNothing) {
  const auto out = work_ / "bad";
  auto c = base_config(model_, out, "wanda");
  c.sparsity = 1.0;
  expect_error(c, "--sparsity 1 is outside [0, 1)");
  c.sparsity = -0.1;
  expect_error(c, "--sparsity -0.1 is outside [0, 1)");

  c = base_config(model_, out, "wanda");
  c.sparsity.reset();
  c.nm = "4:4";
  expect_error(c, "invalid N:M pattern '4:4': N (4) must be smaller than M (4)");
  c.nm = "2:5";
  expect_error(
      c, "matrix 0.self_attn.q_proj: N:M pattern 2:5 needs the row width to be a multiple of 5, but it is 8");
  c.sparsity = 0.5;
  expect_error(c, "give exactly one of --sparsity R (unstructured) or --nm N:M (semi-structured)");

  c = base_config(model_, out, "wandb");
  expect_error(
      c,
      "unknown pruning method 'wandb' (valid methods: magnitude, wanda, owanda, symwanda, symwanda-sq, "
      "symmetric, symmetric-sq, ri, ria, ria-row, ria-col, lp, stochria)");

  c = base_config(model_, out, "ria");
  c.calib.clear();
  expect_error(c, "method ria is activation-aware and needs calibration data: give --calib FILE");

  c = base_config(model_, model_ / "pruned", "magnitude");
  expect_error(c, "--out " + (model_ / "pruned").string() + " is inside the input model directory " +
                      model_.string() + "; choose a directory outside it");
  c = base_config(model_, model_, "magnitude");
  try {
    prune_model(c);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--out " + model_.string() +
                                         " is the same as the input model directory " + model_.string() +
                                         "; choose a directory outside it");
  }

  c = base_config(model_, out, "wanda");
  c.group = "column";
  expect_error(c, "--group must be row or layer, got 'column'");
  c = base_config(model_, out, "wanda");
  c.compat = "sparsegpt";
  expect_error(c, "--compat must be none, wanda, ria or dsnot, got 'sparsegpt'");
  c = base_config(model_, out, "wanda");
  c.calib = (work_ / "missing.txt").string();
  try {
    prune_model(c);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.txt"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(out));
}

TEST_F(PrunePipeline, ExistingOutputNeedsForceAndIsReplacedWhole) {
  const auto out = work_ / "existing";
  auto c = base_config(model_, out, "magnitude");
  c.calib.clear();
  prune_model(c);
  // Every output carries the provenance file that marks it as symprune's.
  const auto provenance = nlohmann::json::parse(read_bytes(out / io::kProvenanceFile));
  EXPECT_EQ(provenance["tool"], "symprune");
  EXPECT_EQ(provenance["command"], "prune");
  EXPECT_EQ(provenance["config"]["method"], "magnitude");
  EXPECT_FALSE(provenance["commit"].get<std::string>().empty());
  write_bytes(out / "stale.txt", "old");
  try {
    prune_model(c);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "--out " + out.string() + " exists and is not empty (use --force to replace it)");
  }
  EXPECT_EQ(read_bytes(out / "stale.txt"), "old");
  c.force = true;
  prune_model(c);
  EXPECT_FALSE(fs::exists(out / "stale.txt"));
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  EXPECT_EQ(std::distance(fs::directory_iterator(work_), fs::directory_iterator{}), 1);  // no lock, no temp
}

TEST_F(PrunePipeline, ForceReplacesOnlySymprunesOwnOutputs) {
  // A directory symprune did not write is never deleted, --force or not.
  const auto mine = work_ / "mine";
  fs::create_directories(mine / "sub");
  write_bytes(mine / "sub" / "thesis.tex", "years of work");
  auto c = base_config(model_, mine, "magnitude");
  c.calib.clear();
  c.force = true;
  try {
    prune_model(c);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "--out " + mine.string() +
                  " exists and was not written by symprune (it has no "
                  "symprune_provenance.json that symprune wrote): --force replaces only "
                  "symprune outputs; "
                  "remove it yourself or choose another --out");
  }
  EXPECT_EQ(read_bytes(mine / "sub" / "thesis.tex"), "years of work");
  // A file merely named like the marker does not make a directory symprune's.
  write_bytes(mine / io::kProvenanceFile, "{\"tool\": \"other\"}");
  EXPECT_THROW(prune_model(c), Error);
  EXPECT_EQ(read_bytes(mine / "sub" / "thesis.tex"), "years of work");
}

TEST_F(PrunePipeline, TokenFilesNeedNoTokenizerAndTextCalibrationUsesIt) {
  // Text calibration: the llama2.c tokenizer of the model directory encodes it.
  write_bytes(work_ / "calib.txt", std::string(300, 'b') + " abc def ghi jkl m");
  auto text = base_config(model_, work_ / "text", "wanda");
  text.calib = (work_ / "calib.txt").string();
  EXPECT_EQ(prune_model(text).report()["config"]["calib_format"], "text");
  // Token file with no tokenizer anywhere in the model directory.
  fs::remove(model_ / "tokenizer.bin");
  const PruneResult r = prune_model(base_config(model_, work_ / "tokens", "ria"));
  EXPECT_DOUBLE_EQ(r.sparsity_total(), 0.5);
  EXPECT_FALSE(fs::exists(work_ / "tokens" / "tokenizer.bin"));
}

TEST_F(PrunePipeline, EvalReportsDenseAndPrunedPerplexity) {
  // The eval text uses the tokenizer's single-letter tokens.
  write_bytes(work_ / "eval.txt", std::string(200, 'a') + "bcdefghijklm bcd abc");
  auto c = base_config(model_, work_ / "ev", "wanda");
  c.eval = (work_ / "eval.txt").string();
  c.eval_seqlen = 16;
  const PruneResult r = prune_model(c);
  ASSERT_TRUE(r.perplexity.has_value());
  EXPECT_GT(r.perplexity->chunks, 0);
  EXPECT_EQ(r.perplexity->seqlen, 16);
  EXPECT_TRUE(std::isfinite(r.perplexity->dense) && r.perplexity->dense > 1.0);
  EXPECT_TRUE(std::isfinite(r.perplexity->pruned) && r.perplexity->pruned > 1.0);
  EXPECT_NE(r.perplexity->dense, r.perplexity->pruned);
  EXPECT_TRUE(r.report()["perplexity"]["dense"].is_number());
}

// The report's reconstruction error reads the same evenly spaced positions of every window.
TEST(ReconSamplePositions, EvenlySpacedAllWhenEnoughOrZero) {
  std::vector<int64_t> all(16);
  for (int64_t i = 0; i < 16; ++i) all[static_cast<size_t>(i)] = i;
  EXPECT_EQ(recon_sample_positions(0, 8, 16), all);
  EXPECT_EQ(recon_sample_positions(128, 8, 16), all);
  EXPECT_EQ(recon_sample_positions(4096, 8, 16), all);
  EXPECT_EQ(recon_sample_positions(32, 8, 16), (std::vector<int64_t>{2, 6, 10, 14}));
  EXPECT_EQ(recon_sample_positions(9, 8, 16), (std::vector<int64_t>{4, 12}));  // ceil(9 / 8) = 2
  EXPECT_EQ(recon_sample_positions(1, 8, 16), (std::vector<int64_t>{8}));
}

// A rank of two whose partner holds no chunks: its collectives are the identity, so the statistics
// go through the gather-and-add path of several ranks with this rank's chunks alone.
class LoneRankOfTwo final : public dist::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string name() const override { return "lone"; }
  void all_reduce_sum(std::span<double>) override {}
  void all_reduce_sum(std::span<float>) override {}
  void all_reduce_sum(std::span<int64_t>) override {}
  void broadcast(std::span<std::byte>, int) override {}
  void all_gather(std::span<const std::byte>, std::span<std::byte>) override { fail("no all_gather here"); }
  void all_gather_v(std::span<const std::byte> local, std::span<const int64_t> counts,
                    std::span<std::byte> gathered) override {
    SYMPRUNE_ASSERT(counts.size() == 2 && counts[1] == 0 && gathered.size() == local.size(), "lone gather");
    std::copy(local.begin(), local.end(), gathered.begin());
  }
  void send(std::span<const std::byte>, int) override { fail("no send here"); }
  void recv(std::span<std::byte>, int) override { fail("no recv here"); }
  void barrier() override {}
  [[noreturn]] void abort(int) override { fail("no abort here"); }
};

// One rank adds its chunks' statistics directly; the result is the ordered gather-and-add of several
// ranks bit for bit (the sums of chunks in order onto zeros), for input and output statistics.
TEST(BlockStatisticsReduce, OneRankSumsEqualTheGatheredSumsBitForBit) {
  model::DecoderModel model = model::DecoderModel::open(io::resolve_model("synthetic:tiny-llama"));
  const int64_t seq_len = 4, windows = 3;
  for (const bool collect_output : {false, true}) {
    const auto local = dist::make_local_communicator();
    LoneRankOfTwo lone;
    BlockStatistics one(*local, model, 0, seq_len, collect_output, false);
    BlockStatistics gathered(lone, model, 0, seq_len, collect_output, false);
    std::mt19937 gen(17);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    const auto random = [&](int64_t rows, int64_t cols) {
      Tensor t({rows, cols});
      for (int64_t i = 0; i < t.numel(); ++i) t[i] = normal(gen);
      return t;
    };
    for (int chunk = 0; chunk < 5; ++chunk) {
      std::map<int64_t, Tensor> group_inputs;  // the linears of a group read one input
      for (const auto& shape : model.linear_shapes()) {
        if (!group_inputs.contains(shape.in) || shape.name.find("down_proj") != std::string::npos ||
            shape.name.find("o_proj") != std::string::npos)
          group_inputs[shape.in] = random(windows * seq_len, shape.in);
        const Tensor output = random(windows * seq_len, shape.out);
        const model::LinearId id{0, shape.name};
        one.on_linear(id, group_inputs[shape.in], output, nullptr);
        gathered.on_linear(id, group_inputs[shape.in], output, nullptr);
      }
    }
    one.reduce();
    gathered.reduce();
    for (const auto& shape : model.linear_shapes()) {
      const ActivationStats &a = one.stats(shape.name), &e = gathered.stats(shape.name);
      EXPECT_EQ(a.in_sumsq, e.in_sumsq) << shape.name;
      EXPECT_EQ(a.in_sum, e.in_sum) << shape.name;
      EXPECT_EQ(a.in_seqsq, e.in_seqsq) << shape.name;
      EXPECT_EQ(a.out_sumsq, e.out_sumsq) << shape.name;
      EXPECT_EQ(a.out_sumsq.size(), collect_output ? static_cast<size_t>(shape.out) : 0u);
      EXPECT_EQ(a.n_seqs, 5 * windows) << shape.name;
      EXPECT_EQ(a.n_seqs, e.n_seqs);
      EXPECT_EQ(a.seq_len, e.seq_len);
    }
  }
}

// The device memory plan of the issue's 70B target: LLaMA-2-70B with 128 x 2048 calibration tokens in
// micro-batches of 8 windows. In bf16 the linear weights and the hidden states cost two bytes per value,
// half of fp32's, and the whole run fits an 80 GB GPU.
TEST(MemoryPlan, Llama2_70BInBf16FitsOne80GBGpu) {
  const io::ModelConfig config =
      io::SyntheticModel(io::parse_synthetic_spec("synthetic:llama2-70b")).config();
  const double d = 8192, kv = 1024, ffn = 28672, vocab = 32000, tokens = 128 * 2048, pass = 8 * 2048;
  ASSERT_EQ(config.hidden_size, d);
  ASSERT_EQ(config.num_kv_heads * config.head_dim, kv);
  ASSERT_EQ(config.intermediate_size, ffn);
  const double linears = 2 * d * d + 2 * d * kv + 3 * d * ffn;  // q, o; k, v; gate, up, down
  const MemoryPlan bf16 = plan_device_memory(config, DType::kBF16, 128 * 2048, 8 * 2048, 0);
  const MemoryPlan fp32 = plan_device_memory(config, DType::kF32, 128 * 2048, 8 * 2048, 0);
  // The block, and its largest linear twice (a pruned copy replaces each dense one as soon as it is made).
  EXPECT_DOUBLE_EQ(bf16.block_weights, 2 * (linears + d * ffn));
  EXPECT_DOUBLE_EQ(fp32.block_weights, 4 * (linears + d * ffn));
  // One rank uploads the next block (in its stored dtype) while the current one computes: a third copy.
  const MemoryPlan one_rank = plan_device_memory(config, DType::kBF16, 128 * 2048, 8 * 2048, 0, DType::kBF16);
  EXPECT_DOUBLE_EQ(one_rank.block_weights, 2 * (linears + d * ffn) + 2 * linears);
  EXPECT_DOUBLE_EQ(
      plan_device_memory(config, DType::kBF16, 128 * 2048, 8 * 2048, 0, DType::kF32).block_weights,
      2 * (linears + d * ffn) + 4 * linears);
  EXPECT_DOUBLE_EQ(bf16.calibration, 2 * 2 * tokens * d);  // H and the dense pass's copy
  EXPECT_DOUBLE_EQ(fp32.calibration, 2 * 4 * tokens * d);
  EXPECT_DOUBLE_EQ(bf16.globals, 4 * (vocab + config.max_position_embeddings + 2) * d + 2 * vocab * d);
  // In bf16 a micro-batch also holds the fp32 states, the 16-bit copies of what is read rounded (the
  // norm's output, q (d wide), k, v, the attention's output and the MLP's activation), and the attention's
  // 256 MiB tile of scores and probabilities.
  EXPECT_DOUBLE_EQ(bf16.activations - fp32.activations,
                   4 * pass * d + 2 * pass * (d + ffn + 2 * d + 2 * kv) + 256.0 * 1024 * 1024);
  // fp32 scores and copy, byte mask, packed bits, DSnoT
  EXPECT_DOUBLE_EQ(bf16.selection, 9.125 * d * ffn + 64.0 * 1024 * 1024);
  EXPECT_LT(one_rank.total(), 0.5 * 80e9);
  // --refine recon or --refine-guard: the widest input's Gram matrix (down_proj's, fp32) on the device.
  EXPECT_EQ(bf16.gram, 0);
  const MemoryPlan with_gram =
      plan_device_memory(config, DType::kBF16, 128 * 2048, 8 * 2048, 0, DType::kBF16, true);
  EXPECT_DOUBLE_EQ(with_gram.gram, 4 * ffn * ffn);
  EXPECT_DOUBLE_EQ(with_gram.total() - one_rank.total(), 4 * ffn * ffn);
  EXPECT_EQ(bf16.evaluation, 0);
  // The 32 MiB conversion buffer of 16-bit tensors crossing the bus and two 32 MiB cuBLAS workspaces,
  // whatever the model.
  EXPECT_DOUBLE_EQ(bf16.buffers, 96.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(
      plan_device_memory(io::SyntheticModel(io::parse_synthetic_spec("synthetic:tiny-llama")).config(),
                         DType::kF32, 0, 1, 0)
          .buffers,
      96.0 * 1024 * 1024);
  EXPECT_LT(bf16.total(), 0.5 * 80e9);
  EXPECT_GT(fp32.total(), bf16.total() + 2 * tokens * d);
}

// LLaMA-2-7B in bf16 is three 5 GB shards: on two ranks rank 0 writes the first and the third, rank 1 the
// second. Every rank records each mask's shape; only the writer of its tensor keeps the bits.
TEST(ModelMasks, EachRankKeepsTheBitsOfTheTensorsInTheShardsItWrites) {
  const io::SyntheticModel source(io::parse_synthetic_spec("synthetic:llama2-7b"));
  const auto shards = source.shards();
  ASSERT_EQ(shards.size(), 3u);
  ModelMasks rank0(source, 0, 2), rank1(source, 1, 2), alone(source, 0, 1);
  const std::string first = shards[0].tensors.back(), second = shards[1].tensors.front(),
                    third = shards[2].tensors.front();
  EXPECT_EQ(rank0.keeper(first), 0);
  EXPECT_EQ(rank1.keeper(second), 1);
  EXPECT_EQ(rank1.keeper(third), 0);
  EXPECT_TRUE(rank0.is_tensor(first) && !rank0.is_tensor("model.layers.99.mlp.up_proj.weight"));
  const PackedMask mask{2, 5, {0x1f, 0x02}};  // 10 bits
  for (ModelMasks* masks : {&rank0, &rank1, &alone}) {
    masks->add(second, mask);
    masks->add(third, mask);
  }
  for (const ModelMasks* masks : {&rank0, &rank1, &alone}) {
    ASSERT_EQ(masks->shapes().size(), 2u);
    EXPECT_EQ(masks->shapes().at(second).rows, 2);
    EXPECT_EQ(masks->shapes().at(third).bytes(), 2);
  }
  EXPECT_EQ(rank0.kept().size(), 1u);
  EXPECT_EQ(rank0.kept().at(third).bits, mask.bits);
  EXPECT_EQ(rank1.kept().size(), 1u);
  EXPECT_EQ(rank1.kept().at(second).bits, mask.bits);
  EXPECT_EQ(alone.kept().size(), 2u);
  // What the host plan counts: the two ranks' shares of every linear's bits make the whole.
  std::vector<std::pair<std::string, ModelMasks::Shape>> linears;
  int64_t every = 0;
  for (const auto& e : io::expected_tensors(source.config()))
    if (e.shape.size() == 2 && e.name.starts_with("model.layers.")) {
      linears.push_back({e.name, {e.shape[0], e.shape[1]}});
      every += (e.shape[0] * e.shape[1] + 7) / 8;
    }
  ASSERT_EQ(linears.size(), 32u * 7);
  EXPECT_EQ(rank0.kept_bytes(linears) + rank1.kept_bytes(linears), every);
  EXPECT_EQ(alone.kept_bytes(linears), every);
  EXPECT_GT(rank1.kept_bytes(linears), every / 4);  // 5 GB of 13.5 GB
  EXPECT_GT(rank0.kept_bytes(linears), every / 2);
}

// A checkpoint's masks, written from where they are kept (masks of 2 MiB and 5.375 MiB: units holding the
// end of one and the start of the next, and whole units written in place) and read back: the same bits,
// shapes and names; a mask's unit corrupted on disk fails the checksum and the checkpoint is not used.
TEST(ModelMasks, CheckpointedMasksReadBackBitForBit) {
  const io::SyntheticModel source(io::parse_synthetic_spec("synthetic:llama2-7b"));
  std::vector<std::string> names;  // the first five matrices of the second shard
  const auto shards = source.shards();
  for (const auto& name : shards[1].tensors)
    if (source.info(name).shape.size() == 2 && names.size() < 5) names.push_back(name);
  const auto local = dist::make_local_communicator();
  ModelMasks masks(source, 0, 1);
  std::mt19937 random(7);
  for (const auto& name : names) {
    const auto& shape = source.info(name).shape;
    PackedMask m{shape[0], shape[1], {}};
    m.bits.resize(static_cast<size_t>(ModelMasks::Shape{m.rows, m.cols}.bytes()));
    for (auto& byte : m.bits) byte = static_cast<uint8_t>(random());
    masks.add(name, std::move(m));
  }
  const fs::path dir = testing::make_temp_dir("symprune_masks_ckpt");
  const fs::path file = dir / "run.h5";
  const nlohmann::json identity = {{"config", {{"method", "wanda"}}}};
  {
    Checkpointer writer(*local, file, 1, 4, "run-1");
    writer.start(2, {{"identity", identity}}, masks, {});
    writer.finish();
  }
  ModelMasks read(source, 0, 1);
  ASSERT_TRUE(load_resume_point(*local, "auto", file, identity, read, [](const io::CheckpointReader&) {}));
  ASSERT_EQ(read.shapes().size(), masks.shapes().size());
  for (const auto& [name, mask] : masks.kept()) {
    EXPECT_EQ(read.shapes().at(name).rows, mask.rows) << name;
    EXPECT_EQ(read.shapes().at(name).cols, mask.cols) << name;
    EXPECT_EQ(read.kept().at(name).bits, mask.bits) << name;
  }
  // A bit of the largest mask flipped in the file (found by its first 64 bytes): its unit's checksum fails.
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const auto& largest =
      std::max_element(masks.kept().begin(), masks.kept().end(), [](const auto& a, const auto& b) {
        return a.second.bits.size() < b.second.bits.size();
      })->second.bits;
  ASSERT_GT(largest.size(), 5u << 20);
  const size_t at = bytes.find(std::string(reinterpret_cast<const char*>(largest.data()), 64));
  ASSERT_NE(at, std::string::npos);
  bytes[at + 1000000] = static_cast<char>(bytes[at + 1000000] ^ 0x10);
  testing::write_file(file, bytes);
  ModelMasks again(source, 0, 1);
  try {
    load_resume_point(*local, "auto", file, identity, again, [](const io::CheckpointReader&) {});
    ADD_FAILURE() << "a corrupt mask was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("masks"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(again.shapes().empty());
  fs::remove_all(dir);
}

// The host plan of the run that was killed by the kernel on a 24 GiB machine before there was one:
// LLaMA-2-70B on the CPU with 128 x 2048 calibration tokens in micro-batches of 8 windows, 2 threads.
TEST(MemoryPlan, HostPlanOfLlama2_70BOnTheCpuCountsEveryTerm) {
  const io::ModelConfig config =
      io::SyntheticModel(io::parse_synthetic_spec("synthetic:llama2-70b")).config();
  const double d = 8192, kv = 1024, ffn = 28672, vocab = 32000, tokens = 128 * 2048, pass = 8 * 2048;
  const double linears = 2 * d * d + 2 * d * kv + 3 * d * ffn;
  const double block = linears + 2 * d;  // and the two norms
  const double largest = d * ffn;
  HostMemoryShape shape;
  shape.threads = 2;
  shape.calib_tokens = 128 * 2048;
  shape.tokens_per_pass = 8 * 2048;
  shape.attention_length = 2048;
  const MemoryPlan p = plan_host_memory(config, DType::kBF16, shape);
  EXPECT_DOUBLE_EQ(p.globals, 4 * 2 * vocab * d);  // embeddings and head, fp32
  // A block in fp32, one linear of it twice, the next block widened, the bf16 read buffer.
  EXPECT_DOUBLE_EQ(p.block_weights, 4 * block + 4 * largest + 4 * block + 2 * largest);
  EXPECT_DOUBLE_EQ(p.calibration, 2 * 4 * tokens * d + 4 * tokens);  // H, its copy, the token ids
  // x, h, q, k, v, attention, o, gate, up, act, down; each thread's 128 x T attention scores.
  EXPECT_DOUBLE_EQ(p.activations, 4 * pass * (4 * d + 2 * d + 2 * kv + 3 * ffn) + 2 * 4 * 128 * 2048);
  EXPECT_DOUBLE_EQ(p.selection, 5 * largest + 2 * 8 * ffn);  // scores, byte mask, sort keys
  EXPECT_DOUBLE_EQ(p.masks, 80 * linears / 8);
  EXPECT_DOUBLE_EQ(p.buffers, 2 * 64.0 * 1024 * 1024);
  EXPECT_EQ(p.evaluation + p.gram + p.samples, 0);
  EXPECT_GT(p.total(), 43 * 1024.0 * 1024 * 1024);  // 43.2 GiB: refused on a 24 GiB machine
  EXPECT_LT(p.total(), 44 * 1024.0 * 1024 * 1024);

  // A checkpoint's writer holds a third copy of H, and reads the mask bits where they are kept.
  HostMemoryShape checkpointed = shape;
  checkpointed.checkpoint = true;
  const MemoryPlan c = plan_host_memory(config, DType::kBF16, checkpointed);
  EXPECT_DOUBLE_EQ(c.calibration - p.calibration, 4 * tokens * d);
  EXPECT_DOUBLE_EQ(c.masks, p.masks);
  // A rank of several keeps the bits of the tensors it writes only (ModelMasks).
  checkpointed.kept_mask_bytes = 12345;
  EXPECT_DOUBLE_EQ(plan_host_memory(config, DType::kBF16, checkpointed).masks, 12345);
  // Several ranks hold the next block's share in the stored dtype, and unpack the gathered mask.
  HostMemoryShape four = shape;
  four.ranks = 4;
  const MemoryPlan r4 = plan_host_memory(config, DType::kBF16, four);
  // (Whole tensors, the largest first: the rank given down_proj reads more than a quarter of the block.)
  EXPECT_DOUBLE_EQ(r4.block_weights, 4 * block + 4 * largest + 2 * largest + 2 * largest);
  EXPECT_DOUBLE_EQ(r4.selection, 5 * largest / 4 + largest * (1 + 4.0 / 4) + 2 * 8 * ffn);
  // --refine recon: every input group's Gram matrix in fp64 (q/k/v and gate/up share theirs), and one
  // chunk's Xᵀ and product.
  HostMemoryShape gram = shape;
  gram.gram_widths = {8192, 8192, 8192, 28672};
  gram.refine = true;
  const MemoryPlan g = plan_host_memory(config, DType::kBF16, gram);
  EXPECT_DOUBLE_EQ(g.gram, 8 * (3 * d * d + ffn * ffn) + 4 * pass * ffn + 8 * ffn * ffn);
  EXPECT_DOUBLE_EQ(g.selection - p.selection, 2 * largest);  // refinement's copies of the mask
  // Every chunk's statistics (Σx², Σx, per-window sums of each linear's inputs, Σy² of its outputs, fp64)
  // until they are reduced; on 4 ranks a rank keeps its chunks' Gram partials (fp32) until the total.
  HostMemoryShape chunked = gram;
  chunked.ranks = 4;
  chunked.calib_chunks = 16;
  chunked.local_chunks = 4;
  const MemoryPlan c16 = plan_host_memory(config, DType::kBF16, chunked);
  const double per_chunk = 8 * (3 * (3 * d + d + 2 * d + ffn) + (d + 2 * kv + d + 2 * ffn + d) + 7);
  EXPECT_DOUBLE_EQ(c16.calibration - g.calibration, 16 * per_chunk);
  EXPECT_DOUBLE_EQ(c16.gram - g.gram, 4 * 4 * (3 * d * d + ffn * ffn));
  // On a device the host keeps the reconstruction samples and the mask bits (and a checkpoint writer's
  // fp32 copies of the states).
  HostMemoryShape device = shape;
  device.device_resident = true;
  device.sample_rows = 1024;
  device.sample_bytes = 12345;
  const MemoryPlan on_device = plan_host_memory(config, DType::kBF16, device);
  EXPECT_DOUBLE_EQ(on_device.total(), 12345 + p.masks);
  device.checkpoint = true;
  EXPECT_DOUBLE_EQ(plan_host_memory(config, DType::kBF16, device).calibration, 2 * 4 * tokens * d);
  // One block: no next block to read ahead.
  const MemoryPlan one_block =
      plan_host_memory(io::SyntheticModel(io::parse_synthetic_spec("synthetic:llama2-70b:layers=1")).config(),
                       DType::kBF16, shape);
  EXPECT_DOUBLE_EQ(p.block_weights - one_block.block_weights, 4 * block);
}

}  // namespace
}  // namespace symprune::engine
