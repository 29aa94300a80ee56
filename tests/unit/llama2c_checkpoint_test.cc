// llama2.c checkpoint reader, RoPE row permutation and the convert-llama2c converter.
#include "io/llama2c_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/convert_llama2c.h"
#include "io/safetensors.h"
#include "support/test_support.h"

namespace symprune::io {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path stories_bin() {
  return symprune::testing::data_dir() / "stories260K" / "stories260K.bin";
}
fs::path stories_tok() {
  return symprune::testing::data_dir() / "stories260K" / "tok512.bin";
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <typename T>
void append(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof value);
}

void append(std::string& out, const std::vector<float>& values) {
  out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

// Expects `fn` to throw symprune::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn&& fn, const std::vector<std::string>& parts) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    for (const auto& part : parts) EXPECT_THAT(e.what(), HasSubstr(part));
  }
}

// A small random llama2.c model that can be written in either layout.
struct SyntheticModel {
  int32_t dim = 8, hidden = 12, layers = 2, heads = 2, kv_heads = 1, vocab = 10, seq = 6;
  bool shared = true;
  double theta = 10000.0;  // for the v0 RoPE tables
  std::vector<float> emb, cls, final_norm, cos_table, sin_table;
  std::vector<std::vector<float>> att_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3;

  void fill(uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    auto make = [&](int64_t n) {
      std::vector<float> v(static_cast<size_t>(n));
      for (auto& x : v) x = dist(rng);
      return v;
    };
    const int32_t kv = dim / heads * kv_heads, hs = dim / heads;
    emb = make(vocab * dim);
    cls = make(vocab * dim);
    final_norm = make(dim);
    for (int l = 0; l < layers; ++l) {
      att_norm.push_back(make(dim));
      wq.push_back(make(dim * dim));
      wk.push_back(make(kv * dim));
      wv.push_back(make(kv * dim));
      wo.push_back(make(dim * dim));
      ffn_norm.push_back(make(dim));
      w1.push_back(make(hidden * dim));
      w2.push_back(make(dim * hidden));
      w3.push_back(make(hidden * dim));
    }
    for (int p = 0; p < seq; ++p) {
      for (int i = 0; i < hs / 2; ++i) {
        const double angle = p * std::pow(theta, -2.0 * i / hs);
        cos_table.push_back(static_cast<float>(std::cos(angle)));
        sin_table.push_back(static_cast<float>(std::sin(angle)));
      }
    }
  }

  void append_all(std::string& out, const std::vector<std::vector<float>>& per_layer) const {
    for (const auto& w : per_layer) append(out, w);
  }

  std::string v0() const {
    std::string out;
    for (int32_t v : {dim, hidden, layers, heads, kv_heads, shared ? vocab : -vocab, seq}) append(out, v);
    append(out, emb);
    append_all(out, att_norm);
    append_all(out, wq);
    append_all(out, wk);
    append_all(out, wv);
    append_all(out, wo);
    append_all(out, ffn_norm);
    append_all(out, w1);
    append_all(out, w2);
    append_all(out, w3);
    append(out, final_norm);
    append(out, cos_table);
    append(out, sin_table);
    if (!shared) append(out, cls);
    return out;
  }

  std::string v1() const {
    std::string out;
    append(out, kLlama2cMagic);
    append(out, int32_t{1});
    for (int32_t v : {dim, hidden, layers, heads, kv_heads, vocab, seq}) append(out, v);
    append(out, static_cast<uint8_t>(shared ? 1 : 0));
    out.resize(256, '\0');
    append_all(out, att_norm);
    append_all(out, ffn_norm);
    append(out, final_norm);
    append(out, emb);
    append_all(out, wq);
    append_all(out, wk);
    append_all(out, wv);
    append_all(out, wo);
    append_all(out, w1);
    append_all(out, w2);
    append_all(out, w3);
    if (!shared) append(out, cls);
    return out;
  }

  // llama2.c tokenizer.bin with `vocab` one-byte tokens.
  std::string tokenizer() const {
    std::string out;
    append(out, int32_t{1});
    for (int32_t t = 0; t < vocab; ++t) {
      append(out, static_cast<float>(-t));
      append(out, int32_t{1});
      out.push_back(static_cast<char>('a' + t % 26));
    }
    return out;
  }
};

std::vector<float> values(const Tensor& t) {
  return {t.values().begin(), t.values().end()};
}

class Llama2cTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = symprune::testing::make_temp_dir("llama2c_test_"); }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path write(const std::string& name, const std::string& bytes) {
    write_bytes(dir_ / name, bytes);
    return dir_ / name;
  }
  fs::path dir_;
};

// ---------------------------------------------------------------- header and loading

TEST_F(Llama2cTest, ParsesStories260KHeader) {
  const Llama2cHeader h = read_llama2c_header(stories_bin());
  EXPECT_EQ(h.version, 0);
  EXPECT_EQ(h.dim, 64);
  EXPECT_EQ(h.hidden_dim, 172);
  EXPECT_EQ(h.n_layers, 5);
  EXPECT_EQ(h.n_heads, 8);
  EXPECT_EQ(h.n_kv_heads, 4);
  EXPECT_EQ(h.vocab_size, 512);
  EXPECT_TRUE(h.shared_classifier);
  EXPECT_EQ(h.seq_len, 512);
  EXPECT_EQ(h.head_size(), 8);
  EXPECT_EQ(h.kv_dim(), 32);
  EXPECT_EQ(h.expected_file_bytes(), 1056540u);
}

TEST_F(Llama2cTest, LoadsStories260KTensorsAtTheirOffsets) {
  const Llama2cCheckpoint ck = load_llama2c_checkpoint(stories_bin());
  const std::string raw = read_bytes(stories_bin());
  auto float_at = [&](size_t float_index) {
    float v;
    std::memcpy(&v, raw.data() + 28 + 4 * float_index, 4);
    return v;
  };
  ASSERT_EQ(ck.wq.size(), 5u);
  EXPECT_EQ(ck.token_embedding.shape(), (std::vector<int64_t>{512, 64}));
  EXPECT_EQ(ck.wk[0].shape(), (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(ck.w2[4].shape(), (std::vector<int64_t>{64, 172}));
  EXPECT_EQ(ck.freq_cis_real.shape(), (std::vector<int64_t>{512, 4}));
  EXPECT_TRUE(ck.wcls.empty());
  EXPECT_EQ(ck.token_embedding[0], float_at(0));
  const size_t emb = 512 * 64;
  EXPECT_EQ(ck.rms_att[1][0], float_at(emb + 64));
  EXPECT_EQ(ck.wq[0][5], float_at(emb + 5 * 64 + 5));
  // The RoPE tables: position 0 is cos 1 / sin 0; the last float of the file is sin[511][3].
  EXPECT_EQ(ck.freq_cis_real[0], 1.0f);
  EXPECT_EQ(ck.freq_cis_imag[0], 0.0f);
  EXPECT_EQ(ck.freq_cis_imag[511 * 4 + 3], float_at((raw.size() - 28) / 4 - 1));
  EXPECT_NO_THROW(check_llama2c_rope_tables(ck, stories_bin()));
}

TEST_F(Llama2cTest, Version1AndLegacyLayoutsGiveTheSameTensors) {
  for (bool shared : {true, false}) {
    SyntheticModel m;
    m.shared = shared;
    m.fill(7);
    const Llama2cCheckpoint a = load_llama2c_checkpoint(write("v0.bin", m.v0()));
    const Llama2cCheckpoint b = load_llama2c_checkpoint(write("v1.bin", m.v1()));
    EXPECT_EQ(a.header.version, 0);
    EXPECT_EQ(b.header.version, 1);
    for (const Llama2cCheckpoint* ck : {&a, &b}) {
      EXPECT_EQ(ck->header.shared_classifier, shared);
      EXPECT_EQ(ck->header.vocab_size, 10);
      EXPECT_EQ(values(ck->token_embedding), m.emb);
      EXPECT_EQ(values(ck->rms_final), m.final_norm);
      for (int l = 0; l < 2; ++l) {
        EXPECT_EQ(values(ck->rms_att[l]), m.att_norm[l]);
        EXPECT_EQ(values(ck->rms_ffn[l]), m.ffn_norm[l]);
        EXPECT_EQ(values(ck->wq[l]), m.wq[l]);
        EXPECT_EQ(values(ck->wk[l]), m.wk[l]);
        EXPECT_EQ(values(ck->wv[l]), m.wv[l]);
        EXPECT_EQ(values(ck->wo[l]), m.wo[l]);
        EXPECT_EQ(values(ck->w1[l]), m.w1[l]);
        EXPECT_EQ(values(ck->w2[l]), m.w2[l]);
        EXPECT_EQ(values(ck->w3[l]), m.w3[l]);
      }
      if (shared) {
        EXPECT_TRUE(ck->wcls.empty());
      } else {
        EXPECT_EQ(values(ck->wcls), m.cls);
      }
    }
    EXPECT_TRUE(b.freq_cis_real.empty());
    EXPECT_EQ(values(a.freq_cis_real), m.cos_table);
  }
}

// ---------------------------------------------------------------- permutation

TEST(Llama2cPermute, MatchesHandComputedRowOrder) {
  // 2 heads of size 4, 2 columns; entry = 10 * row + column so every row is recognisable.
  std::vector<float> v;
  for (int r = 0; r < 8; ++r)
    for (int c = 0; c < 2; ++c) v.push_back(static_cast<float>(10 * r + c));
  const Tensor out = permute_rope_rows_to_hf(Tensor({8, 2}, v), 2);
  // Per head, rows (0,1,2,3) hold pairs (0,1),(2,3); rotate-half wants evens then odds: 0,2,1,3.
  const std::vector<float> expected = {0, 1, 20, 21, 10, 11, 30, 31, 40, 41, 60, 61, 50, 51, 70, 71};
  EXPECT_EQ(values(out), expected);
  EXPECT_EQ(out.shape(), (std::vector<int64_t>{8, 2}));

  // One head of size 6: rows 0,2,4,1,3,5.
  const Tensor six = permute_rope_rows_to_hf(Tensor({6, 1}, {0, 1, 2, 3, 4, 5}), 1);
  EXPECT_EQ(values(six), (std::vector<float>{0, 2, 4, 1, 3, 5}));
}

// The point of the permutation: rotate-half RoPE of the permuted projection equals the permuted
// interleaved RoPE of the original projection, so attention scores are unchanged.
TEST(Llama2cPermute, TurnsInterleavedRopeIntoRotateHalf) {
  const int heads = 2, hs = 6, dim = heads * hs, cols = 5, pos = 3;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> w(dim * cols), x(cols);
  for (auto& e : w) e = dist(rng);
  for (auto& e : x) e = dist(rng);
  auto project = [&](const std::vector<float>& m) {
    std::vector<double> y(dim, 0.0);
    for (int r = 0; r < dim; ++r)
      for (int c = 0; c < cols; ++c) y[r] += double(m[r * cols + c]) * x[c];
    return y;
  };
  auto angle = [&](int i) { return pos * std::pow(10000.0, -2.0 * i / hs); };
  std::vector<double> inter = project(w);
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < hs / 2; ++i) {
      double& a = inter[h * hs + 2 * i];
      double& b = inter[h * hs + 2 * i + 1];
      const double ra = a * std::cos(angle(i)) - b * std::sin(angle(i));
      const double rb = a * std::sin(angle(i)) + b * std::cos(angle(i));
      a = ra;
      b = rb;
    }
  }
  std::vector<double> half = project(values(permute_rope_rows_to_hf(Tensor({dim, cols}, w), heads)));
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < hs / 2; ++i) {
      double& a = half[h * hs + i];
      double& b = half[h * hs + i + hs / 2];
      const double ra = a * std::cos(angle(i)) - b * std::sin(angle(i));
      const double rb = b * std::cos(angle(i)) + a * std::sin(angle(i));
      a = ra;
      b = rb;
    }
  }
  for (int h = 0; h < heads; ++h) {
    for (int i = 0; i < hs / 2; ++i) {
      EXPECT_NEAR(half[h * hs + i], inter[h * hs + 2 * i], 1e-12);
      EXPECT_NEAR(half[h * hs + hs / 2 + i], inter[h * hs + 2 * i + 1], 1e-12);
    }
  }
}

// ---------------------------------------------------------------- errors

TEST_F(Llama2cTest, RefusesMissingFile) {
  expect_error([&] { read_llama2c_header(dir_ / "nope.bin"); },
               {"cannot open llama2.c checkpoint", (dir_ / "nope.bin").string(), "no such file"});
  expect_error([&] { read_llama2c_header(dir_); }, {dir_.string(), "is not a regular file"});
}

TEST_F(Llama2cTest, RefusesTruncatedFiles) {
  const std::string real = read_bytes(stories_bin());
  const fs::path tiny = write("tiny.bin", real.substr(0, 20));
  expect_error([&] { read_llama2c_header(tiny); },
               {tiny.string(), "is truncated: 20 bytes, shorter than the 28-byte header"});
  const fs::path cut = write("cut.bin", real.substr(0, 1000));
  expect_error(
      [&] { load_llama2c_checkpoint(cut); },
      {cut.string(), "has 1000 bytes but its version 0 header", "implies 1056540 bytes (truncated?)"});
  const fs::path longer = write("long.bin", real + "x");
  expect_error([&] { read_llama2c_header(longer); },
               {longer.string(), "has 1056541 bytes", "implies 1056540 bytes (trailing data)"});
  // An unshared classifier needs vocab * dim more floats: flipping the sign makes the real file short.
  std::string flipped = real;
  const int32_t negative_vocab = -512;
  std::memcpy(flipped.data() + 20, &negative_vocab, 4);
  const fs::path unshared = write("unshared.bin", flipped);
  expect_error([&] { read_llama2c_header(unshared); },
               {"has 1056540 bytes", "separate classifier) implies 1187612 bytes (truncated?)"});
  std::string v1 = SyntheticModel{}.v1();
  v1.resize(100);
  const fs::path v1_cut = write("v1cut.bin", v1);
  expect_error([&] { read_llama2c_header(v1_cut); }, {"is truncated: 100 bytes, shorter than the 256-byte"});
}

TEST_F(Llama2cTest, RefusesBadHeaderValues) {
  const std::string real = read_bytes(stories_bin());
  auto with_field = [&](int index, int32_t value) {
    std::string bytes = real;
    std::memcpy(bytes.data() + 4 * index, &value, 4);
    return write("bad.bin", bytes);
  };
  expect_error([&] { read_llama2c_header(with_field(3, 0)); },
               {"bad.bin", "header field n_heads is 0, expected > 0"});
  expect_error([&] { read_llama2c_header(with_field(0, -64)); }, {"header field dim is -64, expected > 0"});
  expect_error([&] { read_llama2c_header(with_field(6, 0)); }, {"header field seq_len is 0, expected > 0"});
  expect_error([&] { read_llama2c_header(with_field(5, 0)); }, {"vocab_size is 0"});
  expect_error([&] { read_llama2c_header(with_field(3, 7)); }, {"n_heads 7 does not divide dim 64"});
  expect_error([&] { read_llama2c_header(with_field(4, 3)); }, {"n_kv_heads 3 does not divide n_heads 8"});
  expect_error([&] { read_llama2c_header(with_field(4, 16)); }, {"n_kv_heads 16 does not divide n_heads 8"});
  expect_error([&] { read_llama2c_header(with_field(3, 64)); },
               {"head size 1 (dim 64 / n_heads 64) is odd; RoPE needs it even"});

  // Sizes whose byte count overflows 64 bits are refused, not wrapped.
  std::string huge;
  for (int32_t v : {1 << 30, 0x7fffffff, 0x7fffffff, 1 << 20, 1 << 20, 512, 512}) append(huge, v);
  const fs::path huge_path = write("huge.bin", huge);
  expect_error([&] { read_llama2c_header(huge_path); },
               {"huge.bin", "implies a size that overflows 64 bits"});
}

TEST_F(Llama2cTest, RefusesUnsupportedVersions) {
  std::string v2 = SyntheticModel{}.v1();
  const int32_t two = 2, seven = 7;
  std::memcpy(v2.data() + 4, &two, 4);
  expect_error([&] { read_llama2c_header(write("q8.bin", v2)); },
               {"q8.bin", "version 2 (Q8_0 quantized), which is not supported"});
  std::memcpy(v2.data() + 4, &seven, 4);
  expect_error([&] { read_llama2c_header(write("v7.bin", v2)); }, {"unknown version 7 (supported: 0 and 1)"});
  std::string flag = SyntheticModel{}.v1();
  flag[36] = 5;
  expect_error([&] { read_llama2c_header(write("flag.bin", flag)); }, {"shared_classifier flag is 5"});
}

TEST_F(Llama2cTest, RefusesRopeTablesOfAnotherTheta) {
  SyntheticModel m;
  m.theta = 500000.0;
  m.fill(1);
  const fs::path path = write("theta.bin", m.v0());
  const Llama2cCheckpoint ck = load_llama2c_checkpoint(path);
  expect_error([&] { check_llama2c_rope_tables(ck, path); },
               {"theta.bin", "RoPE table disagrees with theta 10000 and head size 4 at position 1, index 1",
                "position 1 implies theta 500000"});
}

// ---------------------------------------------------------------- converter

std::vector<std::string> dir_entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST_F(Llama2cTest, ConvertsStories260K) {
  const fs::path out = dir_ / "model";
  const auto summary = convert_llama2c(stories_bin(), stories_tok(), out, false);
  EXPECT_EQ(summary.tokenizer_file, "tokenizer.bin");
  EXPECT_TRUE(summary.hf_tokenizer_json);
  EXPECT_EQ(dir_entries(out),
            (std::vector<std::string>{"config.json", "model.safetensors", "symprune_provenance.json",
                                      "tokenizer.bin", "tokenizer.json", "tokenizer_config.json"}));
  const auto tokenizer_config = nlohmann::json::parse(read_bytes(out / "tokenizer_config.json"));
  EXPECT_EQ(tokenizer_config["tokenizer_class"], "LlamaTokenizerFast");
  EXPECT_FALSE(tokenizer_config.contains("tokenizer_file"));
  EXPECT_EQ(nlohmann::json::parse(read_bytes(out / "tokenizer.json"))["model"]["type"], "BPE");
  EXPECT_EQ(dir_entries(dir_), (std::vector<std::string>{"model"}));  // no temp dir left
  const auto config = nlohmann::json::parse(read_bytes(out / "config.json"));
  EXPECT_EQ(config["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["hidden_size"], 64);
  EXPECT_EQ(config["intermediate_size"], 172);
  EXPECT_EQ(config["num_hidden_layers"], 5);
  EXPECT_EQ(config["num_attention_heads"], 8);
  EXPECT_EQ(config["num_key_value_heads"], 4);
  EXPECT_EQ(config["vocab_size"], 512);
  EXPECT_EQ(config["max_position_embeddings"], 512);
  EXPECT_EQ(config["rms_norm_eps"], 1e-5);
  EXPECT_EQ(config["rope_theta"], 10000.0);
  EXPECT_EQ(config["tie_word_embeddings"], true);
  EXPECT_EQ(config["bos_token_id"], 1);
  EXPECT_EQ(config["eos_token_id"], 2);
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(read_bytes(out / "tokenizer.bin"), read_bytes(stories_tok()));

  const Llama2cCheckpoint ck = load_llama2c_checkpoint(stories_bin());
  const SafetensorsModel model = SafetensorsModel::open_dir(out);
  EXPECT_EQ(model.metadata().at("format"), "pt");
  EXPECT_EQ(model.names().size(), 2u + 5u * 9u);
  EXPECT_FALSE(model.contains("lm_head.weight"));
  EXPECT_EQ(values(model.load_f32("model.embed_tokens.weight")), values(ck.token_embedding));
  EXPECT_EQ(values(model.load_f32("model.layers.3.mlp.gate_proj.weight")), values(ck.w1[3]));
  EXPECT_EQ(values(model.load_f32("model.layers.3.mlp.up_proj.weight")), values(ck.w3[3]));
  EXPECT_EQ(values(model.load_f32("model.layers.3.mlp.down_proj.weight")), values(ck.w2[3]));
  EXPECT_EQ(values(model.load_f32("model.layers.2.self_attn.v_proj.weight")), values(ck.wv[2]));
  EXPECT_EQ(values(model.load_f32("model.layers.2.self_attn.o_proj.weight")), values(ck.wo[2]));
  EXPECT_EQ(values(model.load_f32("model.layers.1.input_layernorm.weight")), values(ck.rms_att[1]));
  EXPECT_EQ(values(model.load_f32("model.layers.1.post_attention_layernorm.weight")), values(ck.rms_ffn[1]));
  EXPECT_EQ(values(model.load_f32("model.norm.weight")), values(ck.rms_final));
  // q: 8 heads of 8 rows; HF row h*8 + 4*j + i is llama2.c row h*8 + 2*i + j.
  const Tensor q = model.load_f32("model.layers.4.self_attn.q_proj.weight");
  const Tensor k = model.load_f32("model.layers.4.self_attn.k_proj.weight");
  EXPECT_EQ(k.shape(), (std::vector<int64_t>{32, 64}));
  for (int h = 0; h < 8; ++h)
    for (int j = 0; j < 2; ++j)
      for (int i = 0; i < 4; ++i) {
        const auto hf = q.row(h * 8 + 4 * j + i);
        const auto orig = ck.wq[4].row(h * 8 + 2 * i + j);
        EXPECT_TRUE(std::equal(hf.begin(), hf.end(), orig.begin()));
        if (h < 4) {
          const auto hf_k = k.row(h * 8 + 4 * j + i);
          const auto orig_k = ck.wk[4].row(h * 8 + 2 * i + j);
          EXPECT_TRUE(std::equal(hf_k.begin(), hf_k.end(), orig_k.begin()));
        }
      }
}

TEST_F(Llama2cTest, ConvertsBothLayoutsToTheSameFilesAndHonoursUntiedClassifier) {
  SyntheticModel m;
  m.shared = false;
  m.fill(11);
  const fs::path tok = write("tok.bin", m.tokenizer());
  convert_llama2c(write("v0.bin", m.v0()), tok, dir_ / "a", false);
  convert_llama2c(write("v1.bin", m.v1()), tok, dir_ / "b", false);
  EXPECT_EQ(read_bytes(dir_ / "a" / "model.safetensors"), read_bytes(dir_ / "b" / "model.safetensors"));
  EXPECT_EQ(read_bytes(dir_ / "a" / "config.json"), read_bytes(dir_ / "b" / "config.json"));
  const auto config = nlohmann::json::parse(read_bytes(dir_ / "a" / "config.json"));
  EXPECT_EQ(config["tie_word_embeddings"], false);
  const SafetensorsModel model = SafetensorsModel::open_dir(dir_ / "a");
  EXPECT_EQ(values(model.load_f32("lm_head.weight")), m.cls);
  EXPECT_EQ(values(model.load_f32("model.embed_tokens.weight")), m.emb);
  // The synthetic vocabulary has no <0xNN> byte pieces, so no tokenizer.json can equal it: the conversion
  // still succeeds, without one (and without a tokenizer class Hugging Face tools would try to load).
  EXPECT_FALSE(fs::exists(dir_ / "a" / "tokenizer.json"));
  EXPECT_FALSE(
      nlohmann::json::parse(read_bytes(dir_ / "a" / "tokenizer_config.json")).contains("tokenizer_class"));
}

TEST_F(Llama2cTest, CopiesASentencePieceModelAsTokenizerModel) {
  const fs::path spm = symprune::testing::data_dir() / "llama2c_tokenizer" / "tokenizer.model";
  SyntheticModel m;
  m.dim = 4;
  m.heads = 2;
  m.kv_heads = 2;
  m.hidden = 4;
  m.layers = 1;
  m.seq = 4;
  m.vocab = 32000;
  m.fill(5);
  const fs::path ck = write("big_vocab.bin", m.v0());
  const auto summary = convert_llama2c(ck, spm, dir_ / "out", false);
  EXPECT_EQ(summary.tokenizer_file, "tokenizer.model");
  EXPECT_FALSE(summary.hf_tokenizer_json);
  EXPECT_EQ(read_bytes(dir_ / "out" / "tokenizer.model"), read_bytes(spm));
  EXPECT_FALSE(fs::exists(dir_ / "out" / "tokenizer.bin"));
  EXPECT_FALSE(fs::exists(dir_ / "out" / "tokenizer.json"));
  const auto tok_config = nlohmann::json::parse(read_bytes(dir_ / "out" / "tokenizer_config.json"));
  EXPECT_EQ(tok_config["tokenizer_class"], "LlamaTokenizer");
  // The 32000-piece model does not fit the 512-token stories260K.
  expect_error([&] { convert_llama2c(stories_bin(), spm, dir_ / "bad", false); },
               {"tokenizer.model", "has 32000 pieces but the checkpoint's vocab_size is 512"});
  EXPECT_FALSE(fs::exists(dir_ / "bad"));
}

TEST_F(Llama2cTest, RefusesTokenizersThatDoNotFit) {
  const fs::path out = dir_ / "out";
  expect_error([&] { convert_llama2c(stories_bin(), dir_ / "missing.bin", out, false); },
               {"cannot open tokenizer", "missing.bin", "no such file"});
  // llama2.c's 32000-token tokenizer.bin against a 512-token checkpoint.
  const fs::path big = symprune::testing::data_dir() / "llama2c_tokenizer" / "tokenizer.bin";
  expect_error([&] { convert_llama2c(stories_bin(), big, out, false); },
               {"neither a llama2.c tokenizer.bin for vocab_size 512",
                "bytes remain after the checkpoint's vocab_size 512 tokens"});
  const std::string tok = read_bytes(stories_tok());
  const fs::path cut = write("cut_tok.bin", tok.substr(0, tok.size() - 3));
  expect_error([&] { convert_llama2c(stories_bin(), cut, out, false); },
               {"cut_tok.bin", "token 511 of length", "runs past the end of the file"});
  EXPECT_FALSE(fs::exists(out));
  EXPECT_EQ(dir_entries(dir_), (std::vector<std::string>{"cut_tok.bin"}));
}

TEST_F(Llama2cTest, OutputDirectoryRules) {
  const fs::path out = dir_ / "out";
  fs::create_directory(out);
  convert_llama2c(stories_bin(), stories_tok(), out, false);  // an existing empty directory is fine
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));

  write_bytes(out / "keep.txt", "x");
  expect_error([&] { convert_llama2c(stories_bin(), stories_tok(), out, false); },
               {out.string(), "exists and is not empty (use --force to replace it)"});
  EXPECT_TRUE(fs::exists(out / "keep.txt"));

  convert_llama2c(stories_bin(), stories_tok(), out, true);
  EXPECT_FALSE(fs::exists(out / "keep.txt"));
  EXPECT_TRUE(fs::exists(out / "model.safetensors"));
  EXPECT_EQ(dir_entries(dir_), (std::vector<std::string>{"out"}));

  // --force never deletes the inputs.
  const fs::path inputs = dir_ / "inputs";
  fs::create_directory(inputs);
  fs::copy_file(stories_bin(), inputs / "m.bin");
  expect_error([&] { convert_llama2c(inputs / "m.bin", stories_tok(), inputs, true); },
               {"contains the input file", "m.bin; choose another directory"});
  EXPECT_TRUE(fs::exists(inputs / "m.bin"));
  // Nor anything symprune did not write.
  const fs::path foreign = dir_ / "foreign";
  fs::create_directory(foreign);
  write_bytes(foreign / "notes.txt", "keep");
  expect_error([&] { convert_llama2c(stories_bin(), stories_tok(), foreign, true); },
               {"was not written by symprune", "--force replaces only symprune outputs"});
  EXPECT_TRUE(fs::exists(foreign / "notes.txt"));
  fs::remove_all(foreign);

  write_bytes(dir_ / "file", "x");
  expect_error([&] { convert_llama2c(stories_bin(), stories_tok(), dir_ / "file", true); },
               {"exists and is not a directory"});
  expect_error([&] { convert_llama2c(stories_bin(), stories_tok(), dir_ / "no" / "such", false); },
               {"parent directory", "does not exist"});

  // A bad checkpoint leaves nothing behind.
  expect_error([&] { convert_llama2c(dir_ / "file", stories_tok(), dir_ / "new", false); },
               {"is truncated: 1 bytes"});
  EXPECT_EQ(dir_entries(dir_), (std::vector<std::string>{"file", "inputs", "out"}));
}

}  // namespace
}  // namespace symprune::io
