// config.json parsing: real-world LLaMA-2/3 and OPT configs, transformers' defaults, and every
// refusal (unknown model_type, unsupported rope scaling / activation, bad sizes) with its message.
#include "io/hf_config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "support/test_support.h"

namespace symprune::io {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

// The config.json of meta-llama/Llama-2-7b-hf.
json llama2_7b() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "tie_word_embeddings": false,
    "torch_dtype": "float16", "transformers_version": "4.31.0.dev0", "use_cache": true, "vocab_size": 32000})");
}

// The config.json of meta-llama/Llama-3.1-8B.
json llama31_8b() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 128256})");
}

// The config.json of facebook/opt-350m (post-LN, project_in/out, no final layer norm).
json opt_350m() {
  return json::parse(R"({
    "_remove_final_layer_norm": false, "activation_dropout": 0.0, "activation_function": "relu",
    "architectures": ["OPTForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 2, "do_layer_norm_before": false,
    "dropout": 0.1, "eos_token_id": 2, "ffn_dim": 4096, "hidden_size": 1024, "init_std": 0.02, "layerdrop": 0.0,
    "max_position_embeddings": 2048, "model_type": "opt", "num_attention_heads": 16, "num_hidden_layers": 24,
    "pad_token_id": 1, "prefix": "</s>", "torch_dtype": "float16", "transformers_version": "4.20.0.dev0",
    "use_cache": true, "vocab_size": 50272, "word_embed_proj_dim": 512})");
}

// The config.json of facebook/opt-1.3b.
json opt_1_3b() {
  return json::parse(R"({
    "_remove_final_layer_norm": false, "activation_function": "relu", "architectures": ["OPTForCausalLM"],
    "bos_token_id": 2, "do_layer_norm_before": true, "eos_token_id": 2, "ffn_dim": 8192, "hidden_size": 2048,
    "max_position_embeddings": 2048, "model_type": "opt", "num_attention_heads": 32, "num_hidden_layers": 24,
    "pad_token_id": 1, "torch_dtype": "float16", "vocab_size": 50272, "word_embed_proj_dim": 2048})");
}

void expect_error(const json& j, const std::vector<std::string>& parts) {
  try {
    parse_config(j, "/models/x/config.json");
    FAIL() << "expected symprune::Error for " << j.dump();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/models/x/config.json"));
    for (const auto& part : parts) EXPECT_THAT(e.what(), HasSubstr(part));
  }
}

TEST(HfConfig, Llama2) {
  const ModelConfig c = parse_config(llama2_7b(), "cfg");
  EXPECT_EQ(c.family, ModelFamily::kLlama);
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.intermediate_size, 11008);
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 32);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 32000);
  EXPECT_EQ(c.max_position_embeddings, 4096);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(c.torch_dtype, "float16");
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.rope_scaling.has_value());
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.hidden_act, "silu");
  EXPECT_FALSE(c.has_project_in_out());
  EXPECT_EQ(c.raw, llama2_7b());
  EXPECT_EQ(c.source, "cfg");
}

TEST(HfConfig, Llama3WithRopeScalingAndGqa) {
  const ModelConfig c = parse_config(llama31_8b(), "cfg");
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling->high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);
  EXPECT_EQ(c.bos_token_id, 128000);

  // Older files spell the key "type"; "default" means no scaling; eos may be a list (3.1 instruct).
  json j = llama31_8b();
  j["rope_scaling"].erase("rope_type");
  j["rope_scaling"]["type"] = "llama3";
  j["eos_token_id"] = {128001, 128008, 128009};
  const ModelConfig c2 = parse_config(j, "cfg");
  ASSERT_TRUE(c2.rope_scaling.has_value());
  EXPECT_EQ(c2.rope_scaling->type, "llama3");
  EXPECT_EQ(c2.eos_token_id, 128001);
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_FALSE(parse_config(j, "cfg").rope_scaling.has_value());
}

// transformers 5 writes RoPE settings as "rope_parameters" (theta and scaling together); read as the older
// keys are, never ignored (theta 500000 read as the default 10000 gives another model without a word).
TEST(HfConfig, RopeParametersOfTransformers5) {
  json j = llama31_8b();
  json params = j["rope_scaling"];
  params["rope_theta"] = 500000.0;
  j.erase("rope_scaling");
  j.erase("rope_theta");
  j["rope_parameters"] = params;
  const ModelConfig c = parse_config(j, "cfg");
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  ASSERT_TRUE(c.rope_scaling.has_value());
  EXPECT_EQ(c.rope_scaling->type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling->factor, 8.0);
  EXPECT_EQ(c.rope_scaling->original_max_position_embeddings, 8192);

  j["rope_theta"] = nullptr;  // written as null beside rope_parameters
  EXPECT_DOUBLE_EQ(parse_config(j, "cfg").rope_theta, 500000.0);
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1000000.0}};
  const ModelConfig d = parse_config(j, "cfg");
  EXPECT_DOUBLE_EQ(d.rope_theta, 1000000.0);
  EXPECT_FALSE(d.rope_scaling.has_value());

  // Both spellings in one file must agree.
  json both = llama31_8b();
  both["rope_parameters"] = both["rope_scaling"];
  both["rope_parameters"]["rope_theta"] = 500000.0;
  EXPECT_DOUBLE_EQ(parse_config(both, "cfg").rope_theta, 500000.0);
  both["rope_parameters"]["rope_theta"] = 10000.0;
  expect_error(both, {"\"rope_theta\" (500000) and rope_parameters.rope_theta (10000) disagree"});
  both["rope_parameters"]["rope_theta"] = 500000.0;
  both["rope_parameters"]["factor"] = 4.0;
  expect_error(both, {"\"rope_scaling\" and \"rope_parameters\" describe different RoPE scalings"});

  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 2.0}};
  expect_error(
      j, {"rope_parameters type 'yarn' is not supported (supported: llama3, linear, dynamic, or none)"});
  j["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}, {"rope_theta", 10000.0}}}};
  expect_error(j, {"rope_parameters per attention type (\"full_attention\": {...}) are not supported"});
}

TEST(HfConfig, RopeScalingWithoutItsTypeOrOnPartOfTheHeadIsRefused) {
  json j = llama2_7b();
  j["rope_scaling"] = {{"factor", 4.0}};  // transformers refuses it too; it used to run unscaled
  expect_error(j, {"rope_scaling has \"factor\" but no \"rope_type\" (or \"type\")"});
  j["rope_scaling"] = json::object();
  EXPECT_FALSE(parse_config(j, "cfg").rope_scaling.has_value());
  j["partial_rotary_factor"] = 0.5;
  expect_error(j, {"partial_rotary_factor 0.5 is not supported (only 1: RoPE on the whole head)"});
  j["partial_rotary_factor"] = 1.0;
  EXPECT_NO_THROW(parse_config(j, "cfg"));
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.25}};
  expect_error(j, {"rope_parameters.partial_rotary_factor 0.25 is not supported"});
}

TEST(HfConfig, LlamaDefaultsFollowTransformers) {
  const ModelConfig c = parse_config(
      json::parse(
          R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
                      "intermediate_size": 128, "vocab_size": 100})"),
      "cfg");
  EXPECT_EQ(c.num_kv_heads, 4);  // num_key_value_heads defaults to num_attention_heads
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(c.torch_dtype, "");
  // Everything absent takes LlamaConfig's defaults (the 7B shape).
  const ModelConfig d = parse_config(json{{"model_type", "llama"}}, "cfg");
  EXPECT_EQ(d.hidden_size, 4096);
  EXPECT_EQ(d.intermediate_size, 11008);
  EXPECT_EQ(d.num_layers, 32);
  EXPECT_EQ(d.vocab_size, 32000);
  // An explicit null num_key_value_heads also means MHA; an explicit head_dim is honoured.
  json j = llama2_7b();
  j["num_key_value_heads"] = nullptr;
  j["head_dim"] = 64;
  const ModelConfig e = parse_config(j, "cfg");
  EXPECT_EQ(e.num_kv_heads, 32);
  EXPECT_EQ(e.head_dim, 64);
  j["hidden_act"] = "swish";
  EXPECT_EQ(parse_config(j, "cfg").hidden_act, "silu");
  j["attention_bias"] = true;
  j["tie_word_embeddings"] = true;
  EXPECT_TRUE(parse_config(j, "cfg").attention_bias);
  EXPECT_TRUE(parse_config(j, "cfg").tie_word_embeddings);
}

TEST(HfConfig, OptPostLnWithProjection) {
  const ModelConfig c = parse_config(opt_350m(), "cfg");
  EXPECT_EQ(c.family, ModelFamily::kOpt);
  EXPECT_EQ(c.hidden_size, 1024);
  EXPECT_EQ(c.intermediate_size, 4096);  // ffn_dim
  EXPECT_EQ(c.num_layers, 24);
  EXPECT_EQ(c.num_heads, 16);
  EXPECT_EQ(c.num_kv_heads, 16);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.word_embed_proj_dim, 512);
  EXPECT_TRUE(c.has_project_in_out());
  EXPECT_FALSE(c.do_layer_norm_before);
  EXPECT_FALSE(c.remove_final_layer_norm);
  EXPECT_TRUE(c.tie_word_embeddings);  // PretrainedConfig default for OPT
  EXPECT_TRUE(c.enable_bias);
  EXPECT_EQ(c.activation_function, "relu");
  EXPECT_EQ(c.bos_token_id, 2);
  EXPECT_EQ(c.max_position_embeddings, 2048);
}

TEST(HfConfig, OptPreLnAndDefaults) {
  const ModelConfig c = parse_config(opt_1_3b(), "cfg");
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.word_embed_proj_dim, 2048);
  EXPECT_FALSE(c.has_project_in_out());
  EXPECT_TRUE(c.do_layer_norm_before);

  json j = opt_1_3b();
  for (const char* key :
       {"word_embed_proj_dim", "do_layer_norm_before", "_remove_final_layer_norm", "activation_function"}) {
    j.erase(key);
  }
  j["tie_word_embeddings"] = false;
  j["_remove_final_layer_norm"] = true;
  j["enable_bias"] = false;
  const ModelConfig d = parse_config(j, "cfg");
  EXPECT_EQ(d.word_embed_proj_dim, 2048);  // defaults to hidden_size
  EXPECT_TRUE(d.do_layer_norm_before);
  EXPECT_TRUE(d.remove_final_layer_norm);
  EXPECT_FALSE(d.tie_word_embeddings);
  EXPECT_FALSE(d.enable_bias);
  EXPECT_EQ(d.activation_function, "relu");
  const ModelConfig e = parse_config(json{{"model_type", "opt"}}, "cfg");  // OPTConfig defaults (125m)
  EXPECT_EQ(e.hidden_size, 768);
  EXPECT_EQ(e.intermediate_size, 3072);
  EXPECT_EQ(e.num_layers, 12);
  EXPECT_EQ(e.num_heads, 12);
  EXPECT_EQ(e.vocab_size, 50272);
}

// The config.json of mistralai/Mistral-7B-v0.1 (sliding window 4096) and of Qwen/Qwen2.5-7B.
json mistral_7b_v01() {
  return json::parse(R"({
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 32768,
    "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0", "use_cache": true, "vocab_size": 32000})");
}

json qwen25_7b() {
  return json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
    "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
    "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
    "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 152064})");
}

TEST(HfConfig, MistralIsLlamaWithItsWindow) {
  const ModelConfig c = parse_config(mistral_7b_v01(), "cfg");
  EXPECT_EQ(c.family, ModelFamily::kLlama);
  EXPECT_EQ(c.model_type, "mistral");
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_FALSE(c.attention_bias || c.qkv_bias || c.mlp_bias);
  EXPECT_EQ(c.sliding_window, 4096);
  EXPECT_EQ(c.max_seq_len(), 4096);
  EXPECT_EQ(c.max_seq_len_limit(), "sliding_window 4096");
  json j = mistral_7b_v01();  // v0.2 on: no window
  j["sliding_window"] = nullptr;
  EXPECT_EQ(parse_config(j, "cfg").max_seq_len(), 32768);
  EXPECT_EQ(parse_config(j, "cfg").max_seq_len_limit(), "max_position_embeddings 32768");
  // MistralConfig's defaults: window 4096, 8 kv heads, 131072 positions.
  const ModelConfig d = parse_config(json{{"model_type", "mistral"}}, "cfg");
  EXPECT_EQ(d.sliding_window, 4096);
  EXPECT_EQ(d.num_kv_heads, 8);
  EXPECT_EQ(d.max_position_embeddings, 131072);
  EXPECT_EQ(d.bos_token_id, 1);
  j = mistral_7b_v01();
  j["sliding_window"] = 0;
  expect_error(j, {"\"sliding_window\" must be positive, got 0"});
  j = mistral_7b_v01();
  j["hidden_act"] = "gelu";
  expect_error(j, {"hidden_act 'gelu' is not supported for mistral (supported: silu)"});
}

TEST(HfConfig, Qwen2HasQkvBiasesAndAWindowOnlyWhenUsed) {
  const ModelConfig c = parse_config(qwen25_7b(), "cfg");
  EXPECT_EQ(c.family, ModelFamily::kLlama);
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.attention_bias || c.mlp_bias);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_theta, 1e6);
  EXPECT_FALSE(c.sliding_window.has_value());  // use_sliding_window false
  EXPECT_EQ(c.max_seq_len(), 131072);
  json j = qwen25_7b();
  j["use_sliding_window"] = true;  // every layer from max_window_layers (28) on: none of the 28
  EXPECT_FALSE(parse_config(j, "cfg").sliding_window.has_value());
  j["max_window_layers"] = 14;
  j["sliding_window"] = 2048;
  EXPECT_EQ(parse_config(j, "cfg").max_seq_len_limit(), "sliding_window 2048");
  j.erase("sliding_window");  // Qwen2Config's default window, 4096; only null means none
  EXPECT_EQ(parse_config(j, "cfg").sliding_window, 4096);
  j["sliding_window"] = nullptr;
  EXPECT_FALSE(parse_config(j, "cfg").sliding_window.has_value());
  // transformers >= 4.53 lists each layer's attention.
  j = qwen25_7b();
  j["num_hidden_layers"] = 2;
  j["use_sliding_window"] = true;
  j["layer_types"] = json::array({"full_attention", "sliding_attention"});
  j["sliding_window"] = 64;
  EXPECT_EQ(parse_config(j, "cfg").sliding_window, 64);
  j["layer_types"] = json::array({"full_attention", "full_attention"});
  EXPECT_FALSE(parse_config(j, "cfg").sliding_window.has_value());
  j["layer_types"] = json::array({"chunked_attention", "full_attention"});
  expect_error(j, {"layer type \"chunked_attention\" is not supported"});
  j["layer_types"] = json::array({"full_attention"});
  expect_error(j, {"\"layer_types\" must list one type per layer (2), got [\"full_attention\"]"});
  j["layer_types"] = json::array({"full_attention", "sliding_attention"});
  j["use_sliding_window"] = false;  // transformers has no window for it then, and refuses the layer
  expect_error(j, {"lists sliding_attention, but use_sliding_window is false or sliding_window null"});
  // Qwen2Config's defaults: no BOS (its tokenizer adds none), 32 kv heads whatever the heads; a null
  // num_key_value_heads is num_attention_heads (for every type).
  const ModelConfig d = parse_config(json{{"model_type", "qwen2"}, {"num_attention_heads", 64}}, "cfg");
  EXPECT_FALSE(d.bos_token_id.has_value());
  EXPECT_EQ(d.num_kv_heads, 32);
  for (const char* type : {"qwen2", "mistral", "llama"})
    EXPECT_EQ(
        parse_config(
            json{{"model_type", type}, {"num_attention_heads", 16}, {"num_key_value_heads", nullptr}}, "cfg")
            .num_kv_heads,
        16)
        << type;
  EXPECT_EQ(d.vocab_size, 151936);
  EXPECT_EQ(d.max_position_embeddings, 32768);
}

// The config.json of Qwen/Qwen3-8B.
json qwen3_8b() {
  return json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 12288, "max_position_embeddings": 40960,
    "max_window_layers": 36, "model_type": "qwen3", "num_attention_heads": 32, "num_hidden_layers": 36,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

TEST(HfConfig, Qwen3HasHeadNormsItsOwnHeadDimAndAttentionBiasesOnRequest) {
  const ModelConfig c = parse_config(qwen3_8b(), "cfg");
  EXPECT_EQ(c.family, ModelFamily::kLlama);
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attention_bias || c.qkv_bias || c.mlp_bias);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_FALSE(c.sliding_window.has_value());
  EXPECT_EQ(c.max_seq_len(), 40960);
  // Qwen3-0.6B: heads of 128 with hidden 1024 and 16 heads (q_proj 2048 x 1024).
  json j = qwen3_8b();
  j["hidden_size"] = 1024;
  j["num_attention_heads"] = 16;
  EXPECT_EQ(parse_config(j, "cfg").head_dim, 128);
  // Qwen3Config's head_dim is 128 when config.json has none, whatever hidden / heads; Qwen2's is derived.
  j.erase("head_dim");
  EXPECT_EQ(parse_config(j, "cfg").head_dim, 128);
  j["model_type"] = "qwen2";
  EXPECT_EQ(parse_config(j, "cfg").head_dim, 64);
  EXPECT_FALSE(parse_config(j, "cfg").qk_norm);
  // attention_bias puts biases on q, k, v and o; Qwen3's MLP has none whatever mlp_bias says.
  j = qwen3_8b();
  j["attention_bias"] = true;
  j["mlp_bias"] = true;
  const ModelConfig biased = parse_config(j, "cfg");
  EXPECT_TRUE(biased.attention_bias);
  EXPECT_FALSE(biased.mlp_bias || biased.qkv_bias);
  EXPECT_TRUE(biased.attention_bias_configurable());
  EXPECT_FALSE(biased.mlp_bias_configurable());
  // Windows as Qwen2's.
  j = qwen3_8b();
  j["use_sliding_window"] = true;
  j["max_window_layers"] = 30;
  j["sliding_window"] = 4096;
  EXPECT_EQ(parse_config(j, "cfg").sliding_window, 4096);
  j["max_window_layers"] = 36;
  EXPECT_FALSE(parse_config(j, "cfg").sliding_window.has_value());
  // Qwen3Config's defaults.
  const ModelConfig d = parse_config(json{{"model_type", "qwen3"}}, "cfg");
  EXPECT_EQ(d.head_dim, 128);
  EXPECT_EQ(d.num_kv_heads, 32);
  EXPECT_EQ(d.vocab_size, 151936);
  EXPECT_FALSE(d.bos_token_id.has_value());
  j = qwen3_8b();
  j["head_dim"] = nullptr;  // transformers' Qwen3 cannot build it; LLaMA's derives it
  expect_error(j, {"\"head_dim\" must be an integer, got null"});
  j["model_type"] = "llama";
  EXPECT_EQ(parse_config(j, "cfg").head_dim, 128);
  j = qwen3_8b();
  j["head_dim"] = 127;
  expect_error(j, {"head_dim (127) must be even for rotary embeddings"});
}

TEST(HfConfig, UnknownOrMissingModelType) {
  expect_error(json{{"model_type", "gpt2"}},
               {"model_type 'gpt2' is not supported (supported: llama, mistral, qwen2, qwen3, opt)"});
  expect_error(json{{"hidden_size", 8}}, {"no \"model_type\""});
  expect_error(json::array(), {"expected a JSON object"});
}

TEST(HfConfig, LinearAndDynamicRopeScalingTakeTheFactor) {
  json j = llama31_8b();
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  const ModelConfig linear = parse_config(j, "cfg");
  ASSERT_TRUE(linear.rope_scaling.has_value());
  EXPECT_EQ(linear.rope_scaling->type, "linear");
  EXPECT_EQ(linear.rope_scaling->factor, 4.0);
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};
  EXPECT_EQ(parse_config(j, "cfg").rope_scaling->type, "dynamic");
  // transformers 5's spelling.
  j.erase("rope_scaling");
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 500000.0}};
  EXPECT_EQ(parse_config(j, "cfg").rope_scaling->factor, 2.0);
}

TEST(HfConfig, UnsupportedRopeScalingAndActivation) {
  json j = llama31_8b();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 2.0}};
  expect_error(j,
               {"rope_scaling type 'yarn' is not supported (supported: llama3, linear, dynamic, or none)"});
  j["rope_scaling"] = {{"type", "linear"}};
  expect_error(j, {"rope_scaling of type linear needs \"factor\""});
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 0.0}};
  expect_error(j, {"rope_scaling factor must be positive, got 0"});
  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  expect_error(j, {"rope_scaling of type llama3 needs \"low_freq_factor\""});
  j = llama31_8b();
  j["rope_scaling"]["high_freq_factor"] = 1.0;
  expect_error(j, {"high_freq_factor (1) must be greater than low_freq_factor (1)"});
  j = llama31_8b();
  j["rope_scaling"] = "llama3";
  expect_error(j, {"\"rope_scaling\" must be an object or null"});
  j = llama2_7b();
  j["hidden_act"] = "gelu";
  expect_error(j, {"hidden_act 'gelu' is not supported for llama (supported: silu)"});
  j = opt_1_3b();
  j["activation_function"] = "gelu";
  expect_error(j, {"activation_function 'gelu' is not supported for opt (supported: relu)"});
}

TEST(HfConfig, BadValues) {
  json j = llama2_7b();
  j["hidden_size"] = 4100;
  expect_error(j, {"hidden_size (4100) must be divisible by num_attention_heads (32)"});
  j = llama2_7b();
  j["num_key_value_heads"] = 5;
  expect_error(j, {"num_attention_heads (32) must be divisible by num_key_value_heads (5)"});
  j = llama2_7b();
  j["num_hidden_layers"] = 0;
  expect_error(j, {"\"num_hidden_layers\" must be positive, got 0"});
  j = llama2_7b();
  j["vocab_size"] = -3;
  expect_error(j, {"\"vocab_size\" must be positive, got -3"});
  j = llama2_7b();
  j["num_attention_heads"] = 0;
  expect_error(j, {"\"num_attention_heads\" must be positive"});
  j = llama2_7b();
  j["hidden_size"] = "4096";
  expect_error(j, {"\"hidden_size\" must be an integer, got \"4096\""});
  j = llama2_7b();
  j["hidden_size"] = 4096.5;
  expect_error(j, {"\"hidden_size\" must be an integer"});
  j = llama2_7b();
  j["rms_norm_eps"] = 0;
  expect_error(j, {"\"rms_norm_eps\" must be positive"});
  j = llama2_7b();
  j["rope_theta"] = "big";
  expect_error(j, {"\"rope_theta\" must be a number"});
  j = llama2_7b();
  j["tie_word_embeddings"] = 1;
  expect_error(j, {"\"tie_word_embeddings\" must be true or false"});
  j = llama2_7b();
  j["head_dim"] = 3;
  expect_error(j, {"head_dim (3) must be even"});
  j = llama2_7b();
  j["hidden_size"] = 18446744073709551615ull;
  expect_error(j, {"\"hidden_size\" = 18446744073709551615 is too large"});
  j = opt_1_3b();
  j["hidden_size"] = 2050;
  expect_error(j, {"hidden_size (2050) must be divisible by num_attention_heads (32)"});
  j = opt_1_3b();
  j["ffn_dim"] = 0;
  expect_error(j, {"\"ffn_dim\" must be positive"});
  j = opt_1_3b();
  j["word_embed_proj_dim"] = -1;
  expect_error(j, {"\"word_embed_proj_dim\" must be positive"});
  j = opt_1_3b();
  j["do_layer_norm_before"] = "yes";
  expect_error(j, {"\"do_layer_norm_before\" must be true or false"});
}

TEST(HfConfig, MoreBadValues) {
  json j = llama31_8b();
  j["rope_scaling"]["factor"] = 0;
  expect_error(j, {"rope_scaling factor must be positive, got 0"});
  j = llama31_8b();
  j["rope_scaling"]["low_freq_factor"] = -1;
  expect_error(j, {"rope_scaling low_freq_factor must be positive"});
  j = llama31_8b();
  j["rope_scaling"]["original_max_position_embeddings"] = 0;
  expect_error(j, {"\"rope_scaling.original_max_position_embeddings\" must be positive"});
  j = llama31_8b();
  j["rope_scaling"]["factor"] = "8";
  expect_error(j, {"\"factor\" must be a number"});
  j = llama2_7b();
  j["model_type"] = 3;
  expect_error(j, {"\"model_type\" must be a string, got 3"});
  j = llama2_7b();
  j["head_dim"] = 0;
  expect_error(j, {"\"head_dim\" must be positive, got 0"});
  j = llama2_7b();
  j["eos_token_id"] = "</s>";
  expect_error(j, {"\"eos_token_id\" must be an integer"});
  j = llama2_7b();
  j["max_position_embeddings"] = 0;
  expect_error(j, {"\"max_position_embeddings\" must be positive"});
}

TEST(HfConfig, LoadConfigFromFile) {
  const auto dir = symprune::testing::make_temp_dir("symprune_cfg_");
  const auto path = dir / "config.json";
  std::ofstream(path) << llama2_7b().dump(2);
  const ModelConfig c = load_config(path);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.source, path.string());
  std::ofstream(path) << "{\"model_type\": \"llama\",";
  try {
    load_config(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(path.string()));
    EXPECT_THAT(e.what(), HasSubstr("invalid JSON"));
  }
  try {
    load_config(dir / "absent.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((dir / "absent.json").string() + ": file not found"));
  }
  try {
    load_config(dir);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(dir.string() + ": not a regular file"));
  }
  std::filesystem::resize_file(path, (16ull << 20) + 1);  // sparse: cheap
  try {
    load_config(path);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("file is 16777217 bytes, more than the 16777216 bytes accepted"));
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace symprune::io
