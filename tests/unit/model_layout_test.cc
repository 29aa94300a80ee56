// The tensor layout a config implies (names, shapes, optional lm_head) and validate_model_tensors on
// small checkpoints written with the safetensors writer.
#include "io/model_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/test_support.h"

namespace symprune::io {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using json = nlohmann::json;

ModelConfig tiny_llama(bool tied = false, bool bias = false) {
  return parse_config(json{{"model_type", "llama"},
                           {"hidden_size", 16},
                           {"intermediate_size", 24},
                           {"num_hidden_layers", 2},
                           {"num_attention_heads", 4},
                           {"num_key_value_heads", 2},
                           {"vocab_size", 10},
                           {"tie_word_embeddings", tied},
                           {"attention_bias", bias}},
                      "/m/config.json");
}

ModelConfig tiny_opt(int64_t proj, bool pre_ln, bool remove_final = false) {
  return parse_config(json{{"model_type", "opt"},
                           {"hidden_size", 16},
                           {"ffn_dim", 32},
                           {"num_hidden_layers", 2},
                           {"num_attention_heads", 4},
                           {"vocab_size", 12},
                           {"max_position_embeddings", 6},
                           {"word_embed_proj_dim", proj},
                           {"do_layer_norm_before", pre_ln},
                           {"_remove_final_layer_norm", remove_final}},
                      "/m/config.json");
}

std::map<std::string, ExpectedTensor> by_name(const std::vector<ExpectedTensor>& list) {
  std::map<std::string, ExpectedTensor> out;
  for (const auto& e : list) out[e.name] = e;
  return out;
}

using Shape = std::vector<int64_t>;

TEST(ModelLayout, LlamaNamesAndShapes) {
  const auto list = expected_tensors(tiny_llama());
  EXPECT_EQ(list.size(), 1u + 2 * 9 + 1 + 1);
  EXPECT_EQ(list.front().name, "model.embed_tokens.weight");
  EXPECT_EQ(list.back().name, "lm_head.weight");
  const auto m = by_name(list);
  EXPECT_EQ(m.at("model.embed_tokens.weight").shape, (Shape{10, 16}));
  EXPECT_EQ(m.at("model.layers.1.self_attn.q_proj.weight").shape, (Shape{16, 16}));
  EXPECT_EQ(m.at("model.layers.1.self_attn.k_proj.weight").shape, (Shape{8, 16}));  // 2 kv heads x 4
  EXPECT_EQ(m.at("model.layers.1.self_attn.v_proj.weight").shape, (Shape{8, 16}));
  EXPECT_EQ(m.at("model.layers.1.self_attn.o_proj.weight").shape, (Shape{16, 16}));
  EXPECT_EQ(m.at("model.layers.0.mlp.gate_proj.weight").shape, (Shape{24, 16}));
  EXPECT_EQ(m.at("model.layers.0.mlp.up_proj.weight").shape, (Shape{24, 16}));
  EXPECT_EQ(m.at("model.layers.0.mlp.down_proj.weight").shape, (Shape{16, 24}));
  EXPECT_EQ(m.at("model.layers.0.input_layernorm.weight").shape, (Shape{16}));
  EXPECT_EQ(m.at("model.layers.0.post_attention_layernorm.weight").shape, (Shape{16}));
  EXPECT_EQ(m.at("model.norm.weight").shape, (Shape{16}));
  EXPECT_TRUE(m.at("lm_head.weight").required);
  EXPECT_FALSE(by_name(expected_tensors(tiny_llama(true))).at("lm_head.weight").required);
  const auto biased = by_name(expected_tensors(tiny_llama(false, true)));
  EXPECT_EQ(biased.at("model.layers.0.self_attn.k_proj.bias").shape, (Shape{8}));
  EXPECT_EQ(biased.at("model.layers.0.self_attn.o_proj.bias").shape, (Shape{16}));
  EXPECT_EQ(expected_block_tensors(tiny_llama(), 1).size(), 9u);
  EXPECT_EQ(expected_block_tensors(tiny_llama(), 1)[0].name, "model.layers.1.input_layernorm.weight");
}

TEST(ModelLayout, Qwen2BiasesOnQkvOnlyAndMistralNone) {
  json j{{"model_type", "qwen2"},  {"hidden_size", 16},        {"intermediate_size", 24},
         {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
         {"vocab_size", 10},       {"attention_bias", true},   {"mlp_bias", true}};
  // Qwen2's biases are the architecture's: q/k/v always, o_proj and the MLP never, whatever the file says.
  const auto qwen = by_name(expected_tensors(parse_config(j, "/m/config.json")));
  EXPECT_EQ(qwen.at("model.layers.1.self_attn.q_proj.bias").shape, (Shape{16}));
  EXPECT_EQ(qwen.at("model.layers.1.self_attn.k_proj.bias").shape, (Shape{8}));
  EXPECT_EQ(qwen.at("model.layers.1.self_attn.v_proj.bias").shape, (Shape{8}));
  EXPECT_EQ(qwen.count("model.layers.1.self_attn.o_proj.bias"), 0u);
  EXPECT_EQ(qwen.count("model.layers.1.mlp.up_proj.bias"), 0u);
  EXPECT_EQ(qwen.size(), 1u + 2 * 12 + 1 + 1);
  j["model_type"] = "mistral";
  const auto mistral = by_name(expected_tensors(parse_config(j, "/m/config.json")));
  EXPECT_EQ(mistral.size(), 1u + 2 * 9 + 1 + 1);
  EXPECT_EQ(mistral.count("model.layers.0.self_attn.q_proj.bias"), 0u);
}

TEST(ModelLayout, Qwen3HeadNormsWideHeadsAndAttentionBiases) {
  json j{{"model_type", "qwen3"},  {"hidden_size", 16},        {"intermediate_size", 24},
         {"num_hidden_layers", 2}, {"num_attention_heads", 4}, {"num_key_value_heads", 2},
         {"head_dim", 8},          {"vocab_size", 10},         {"attention_bias", true},
         {"mlp_bias", true}};
  const auto m = by_name(expected_tensors(parse_config(j, "/m/config.json")));
  EXPECT_EQ(m.at("model.layers.1.self_attn.q_proj.weight").shape, (Shape{32, 16}));  // 4 heads of 8
  EXPECT_EQ(m.at("model.layers.1.self_attn.k_proj.weight").shape, (Shape{16, 16}));
  EXPECT_EQ(m.at("model.layers.1.self_attn.o_proj.weight").shape, (Shape{16, 32}));
  EXPECT_EQ(m.at("model.layers.1.self_attn.q_norm.weight").shape, (Shape{8}));
  EXPECT_EQ(m.at("model.layers.1.self_attn.k_norm.weight").shape, (Shape{8}));
  EXPECT_EQ(m.at("model.layers.1.self_attn.o_proj.bias").shape, (Shape{16}));
  EXPECT_EQ(m.count("model.layers.1.mlp.up_proj.bias"), 0u);  // Qwen3's MLP has no biases
  EXPECT_EQ(m.size(), 1u + 2 * (9 + 4 + 2) + 1 + 1);
  // A block's tensors in file order: the head norms between the attention's linears and the MLP's.
  const auto block = expected_block_tensors(parse_config(j, "/m/config.json"), 0);
  EXPECT_EQ(block.size(), 15u);
}

TEST(ModelLayout, OptPreLnNoProjection) {
  const auto m = by_name(expected_tensors(tiny_opt(16, true)));
  EXPECT_EQ(m.size(), 2u + 2 * 16 + 2 + 1);
  EXPECT_EQ(m.at("model.decoder.embed_tokens.weight").shape, (Shape{12, 16}));
  EXPECT_EQ(m.at("model.decoder.embed_positions.weight").shape, (Shape{8, 16}));  // max positions + 2
  EXPECT_EQ(m.count("model.decoder.project_in.weight"), 0u);
  EXPECT_EQ(m.at("model.decoder.final_layer_norm.bias").shape, (Shape{16}));
  EXPECT_EQ(m.at("model.decoder.layers.1.self_attn.out_proj.weight").shape, (Shape{16, 16}));
  EXPECT_EQ(m.at("model.decoder.layers.1.self_attn.q_proj.bias").shape, (Shape{16}));
  EXPECT_EQ(m.at("model.decoder.layers.1.fc1.weight").shape, (Shape{32, 16}));
  EXPECT_EQ(m.at("model.decoder.layers.1.fc1.bias").shape, (Shape{32}));
  EXPECT_EQ(m.at("model.decoder.layers.1.fc2.weight").shape, (Shape{16, 32}));
  EXPECT_EQ(m.at("model.decoder.layers.1.fc2.bias").shape, (Shape{16}));
  EXPECT_EQ(m.at("model.decoder.layers.0.self_attn_layer_norm.weight").shape, (Shape{16}));
  EXPECT_EQ(m.at("model.decoder.layers.0.final_layer_norm.bias").shape, (Shape{16}));
  EXPECT_FALSE(m.at("lm_head.weight").required);  // OPT ties by default
  // _remove_final_layer_norm drops the decoder's final norm (the per-layer ones stay).
  const auto r = by_name(expected_tensors(tiny_opt(16, true, true)));
  EXPECT_EQ(r.count("model.decoder.final_layer_norm.weight"), 0u);
  EXPECT_EQ(r.count("model.decoder.layers.0.final_layer_norm.weight"), 1u);
}

TEST(ModelLayout, OptPostLnWithProjection) {
  const auto m = by_name(expected_tensors(tiny_opt(8, false)));
  EXPECT_EQ(m.at("model.decoder.embed_tokens.weight").shape, (Shape{12, 8}));
  EXPECT_EQ(m.at("model.decoder.project_in.weight").shape, (Shape{16, 8}));
  EXPECT_EQ(m.at("model.decoder.project_out.weight").shape, (Shape{8, 16}));
  EXPECT_EQ(m.count("model.decoder.project_in.bias"), 0u);
  EXPECT_EQ(m.count("model.decoder.final_layer_norm.weight"), 0u);  // post-LN: none
  EXPECT_EQ(m.at("lm_head.weight").shape, (Shape{12, 8}));
}

TEST(ModelLayout, CanonicalNames) {
  EXPECT_EQ(canonical_name("decoder.layers.0.fc1.weight", ModelFamily::kOpt),
            "model.decoder.layers.0.fc1.weight");
  EXPECT_EQ(canonical_name("model.decoder.layers.0.fc1.weight", ModelFamily::kOpt),
            "model.decoder.layers.0.fc1.weight");
  EXPECT_EQ(canonical_name("lm_head.weight", ModelFamily::kOpt), "lm_head.weight");
  EXPECT_EQ(canonical_name("decoder.x", ModelFamily::kLlama), "decoder.x");
}

class ValidateTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = symprune::testing::make_temp_dir("symprune_layout_"); }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes every expected tensor (value = index + 1 everywhere), with optional edits.
  void write(const ModelConfig& c, const std::string& skip = "", const std::string& reshape = "",
             bool strip_model_prefix = false, bool include_optional = false,
             const std::vector<TensorToWrite>& extra = {}) {
    storage_.clear();
    std::vector<TensorToWrite> tensors = extra;
    const auto list = expected_tensors(c);
    storage_.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      const auto& e = list[i];
      if (e.name == skip || (!e.required && !include_optional)) continue;
      Shape shape = e.shape;
      if (e.name == reshape) shape.back() += 1;
      std::vector<float> values(static_cast<size_t>(shape_numel(shape)), static_cast<float>(i + 1));
      storage_.emplace_back(values.size() * 4);
      std::memcpy(storage_.back().data(), values.data(), values.size() * 4);
      std::string name = e.name;
      if (strip_model_prefix && name.starts_with("model.")) name = name.substr(6);
      tensors.push_back({name, DType::kF32, shape, storage_.back()});
    }
    write_safetensors_sharded(dir_, tensors, {{"format", "pt"}}, 1ull << 30);
  }

  std::string error_of(const ModelConfig& c) {
    try {
      validate_model_tensors(c, SafetensorsModel::open_dir(dir_));
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected an error";
    return {};
  }

  fs::path dir_;
  std::vector<std::vector<std::byte>> storage_;
};

TEST_F(ValidateTest, CompleteModelsPass) {
  write(tiny_llama());
  EXPECT_NO_THROW(validate_model_tensors(tiny_llama(), SafetensorsModel::open_dir(dir_)));
  write(tiny_llama(true));  // tied: lm_head absent is fine
  EXPECT_NO_THROW(validate_model_tensors(tiny_llama(true), SafetensorsModel::open_dir(dir_)));
  write(tiny_opt(8, false), "", "", false, true);
  // Its stored head (every value i + 1) is not the embedding that OPT's tie makes the head: a run refuses
  // the ambiguous model, inspect only names it.
  EXPECT_NO_THROW(
      validate_model_tensors(tiny_opt(8, false), SafetensorsModel::open_dir(dir_), AmbiguousTiedHead::kWarn));
  EXPECT_NE(error_of(tiny_opt(8, false)).find("the model is ambiguous"), std::string::npos);
}

TEST_F(ValidateTest, OptWithoutModelPrefixIsAccepted) {
  const ModelConfig c = tiny_opt(16, true);
  write(c, "", "", true);
  const auto model = SafetensorsModel::open_dir(dir_);
  EXPECT_TRUE(model.contains("decoder.layers.0.fc1.weight"));
  EXPECT_NO_THROW(validate_model_tensors(c, model));
  EXPECT_EQ(stored_tensor_name(model, "model.decoder.layers.0.fc1.weight"), "decoder.layers.0.fc1.weight");
  EXPECT_EQ(stored_tensor_name(model, "model.decoder.layers.9.fc1.weight"), std::nullopt);
  const Tensor t = load_model_tensor(model, c, "model.decoder.embed_positions.weight", {8, 16});
  EXPECT_EQ(t.shape(), (Shape{8, 16}));
  EXPECT_EQ(t[0], 2.0f);  // second expected tensor
}

TEST_F(ValidateTest, MissingTensorIsNamed) {
  write(tiny_llama(), "model.layers.1.mlp.up_proj.weight");
  const std::string msg = error_of(tiny_llama());
  EXPECT_THAT(msg, HasSubstr("missing tensor 'model.layers.1.mlp.up_proj.weight'"));
  EXPECT_THAT(msg, HasSubstr((dir_ / "model.safetensors").string()));
  EXPECT_THAT(msg, HasSubstr("required by /m/config.json"));
  write(tiny_llama(), "lm_head.weight");  // untied: lm_head must be there
  EXPECT_THAT(error_of(tiny_llama()), HasSubstr("missing tensor 'lm_head.weight'"));
}

TEST_F(ValidateTest, WrongShapeIsNamed) {
  write(tiny_llama(), "", "model.layers.0.self_attn.k_proj.weight");
  const std::string msg = error_of(tiny_llama());
  EXPECT_THAT(msg, HasSubstr("tensor 'model.layers.0.self_attn.k_proj.weight' in " +
                             (dir_ / "model.safetensors").string() +
                             " has shape [8, 17] but /m/config.json implies [8, 16]"));
  // A config whose hidden size contradicts the weights fails on the first tensor.
  write(tiny_llama());
  json raw = tiny_llama().raw;
  raw["hidden_size"] = 32;
  const std::string msg2 = error_of(parse_config(raw, "/m/config.json"));
  EXPECT_THAT(msg2, HasSubstr("tensor 'model.embed_tokens.weight'"));
  EXPECT_THAT(msg2, HasSubstr("has shape [10, 16] but /m/config.json implies [10, 32]"));
  // load_model_tensor reports the same way.
  const auto model = SafetensorsModel::open_dir(dir_);
  try {
    load_model_tensor(model, tiny_llama(), "model.norm.weight", {17});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor 'model.norm.weight'"));
    EXPECT_THAT(e.what(), HasSubstr("has shape [16] but /m/config.json implies [17]"));
  }
  try {
    load_model_tensor(model, tiny_llama(), "model.nope.weight", {1});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("missing tensor 'model.nope.weight'"));
  }
}

// Layers past num_hidden_layers would be copied into the pruned model unpruned: refused, naming the
// first tensor of the first extra layer and both counts.
TEST_F(ValidateTest, ConfigWithFewerLayersThanTheWeightsIsRefused) {
  json raw = tiny_llama().raw;
  raw["num_hidden_layers"] = 12;
  write(parse_config(raw, "/m/config.json"));
  raw["num_hidden_layers"] = 2;
  EXPECT_THAT(error_of(parse_config(raw, "/m/config.json")),
              HasSubstr("/m/config.json: num_hidden_layers is 2 but the weights hold 12 layers (tensor "
                        "'model.layers.2.input_layernorm.weight' in " +
                        (dir_ / "model.safetensors").string() +
                        " is in layer 2); the layers past 2 would be left unpruned"));
  // OPT, stored with or without the "model." prefix.
  for (const bool strip : {false, true}) {
    json opt = tiny_opt(16, true).raw;
    opt["num_hidden_layers"] = 3;
    write(parse_config(opt, "/m/config.json"), "", "", strip);
    EXPECT_THAT(error_of(tiny_opt(16, true)),
                HasSubstr("num_hidden_layers is 2 but the weights hold 3 layers (tensor '" +
                          std::string(strip ? "" : "model.") + "decoder.layers.2."));
  }
  // Names that only look like layers count for nothing.
  std::vector<float> one(1, 1.0f);
  const auto* bytes = reinterpret_cast<const std::byte*>(one.data());
  const std::vector<TensorToWrite> lookalikes = {
      {"model.layers.x.weight", DType::kF32, {1}, {bytes, 4}},
      {"model.layers.7", DType::kF32, {1}, {bytes, 4}},
      {"model.layers.", DType::kF32, {1}, {bytes, 4}},
      {"extra.model.layers.9.weight", DType::kF32, {1}, {bytes, 4}}};
  write(tiny_llama(), "", "", false, false, lookalikes);
  EXPECT_NO_THROW(validate_model_tensors(tiny_llama(), SafetensorsModel::open_dir(dir_)));
}

// Unused tensors of any dtype (transformers' position_ids in I64, an F64 inv_freq) are ignored; a tensor
// the model computes with must be F32, F16 or BF16.
TEST_F(ValidateTest, NonWeightDtypesOnlyForUnusedTensors) {
  const std::vector<int64_t> ids = {0, 1, 2, 3};
  const std::vector<double> inv_freq = {1.0, 0.5};
  const std::vector<TensorToWrite> extra = {
      {"model.position_ids", DType::kI64, {1, 4}, std::as_bytes(std::span(ids))},
      {"model.layers.1.self_attn.rotary_emb.inv_freq", DType::kF64, {2}, std::as_bytes(std::span(inv_freq))}};
  write(tiny_llama(), "", "", false, false, extra);
  EXPECT_NO_THROW(validate_model_tensors(tiny_llama(), SafetensorsModel::open_dir(dir_)));

  // model.norm.weight stored as I32 (same width as F32, so only the dtype is wrong).
  std::vector<TensorToWrite> tensors;
  std::vector<std::vector<std::byte>> storage;
  const auto list = expected_tensors(tiny_llama());
  storage.reserve(list.size());
  for (const auto& e : list) {
    storage.emplace_back(static_cast<size_t>(shape_numel(e.shape)) * 4);
    tensors.push_back(
        {e.name, e.name == "model.norm.weight" ? DType::kI32 : DType::kF32, e.shape, storage.back()});
  }
  write_safetensors_sharded(dir_, tensors, {}, 1ull << 30);
  const std::string expected =
      (dir_ / "model.safetensors").string() +
      ": tensor 'model.norm.weight': unsupported dtype I32 (supported: F32, F16, BF16)";
  EXPECT_THAT(error_of(tiny_llama()), HasSubstr(expected));
  const auto model = SafetensorsModel::open_dir(dir_);
  try {
    load_model_tensor(model, tiny_llama(), "model.norm.weight", {16});
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(expected));
  }
}

TEST_F(ValidateTest, ShardedModelNamesTheShard) {
  const ModelConfig c = tiny_llama();
  std::vector<TensorToWrite> tensors;
  std::vector<std::vector<std::byte>> storage;
  const auto list = expected_tensors(c);
  storage.reserve(list.size());
  for (const auto& e : list) {
    Shape shape = e.shape;
    if (e.name == "model.norm.weight") shape = {15};
    storage.emplace_back(static_cast<size_t>(shape_numel(shape)) * 2);
    tensors.push_back({e.name, DType::kBF16, shape, storage.back()});
  }
  const auto written = write_safetensors_sharded(dir_, tensors, {}, 600);
  ASSERT_GT(written.size(), 2u);
  const auto model = SafetensorsModel::open_dir(dir_);
  const std::string shard = model.weight_map().at("model.norm.weight");
  const std::string msg = error_of(c);
  EXPECT_THAT(msg, HasSubstr("tensor 'model.norm.weight' in " + (dir_ / shard).string() + " has shape [15]"));
}

}  // namespace
}  // namespace symprune::io
