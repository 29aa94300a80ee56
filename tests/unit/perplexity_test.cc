// Perplexity protocol and the block API (observer, overrides, micro-batching) on a tiny random LLaMA
// written to safetensors here.
#include "model/perplexity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/decoder_model.h"
#include "model/fingerprint.h"
#include "support/test_support.h"

namespace symprune::model {
namespace {

constexpr int64_t kVocab = 16, kHidden = 8, kFfn = 12, kLayers = 2, kHeads = 2, kKvHeads = 1, kMaxPos = 64;

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::filesystem::path make_tiny_llama() {
  const auto dir = testing::make_temp_dir("symprune_ppl");
  write_text(dir / "config.json", R"({"model_type": "llama", "hidden_size": 8, "intermediate_size": 12,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 16,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
    "tie_word_embeddings": false, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
    "torch_dtype": "float32"})");
  std::mt19937 gen(7);
  std::normal_distribution<float> dist(0.0f, 0.5f);
  std::vector<std::pair<std::string, Tensor>> tensors;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool ones_plus_noise = false) {
    Tensor t(shape);
    for (float& v : t.values()) v = ones_plus_noise ? 1.0f + 0.1f * dist(gen) : dist(gen);
    tensors.emplace_back(name, std::move(t));
  };
  const int64_t hd = kHidden / kHeads;
  add("model.embed_tokens.weight", {kVocab, kHidden});
  for (int64_t i = 0; i < kLayers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {kHidden}, true);
    add(p + "self_attn.q_proj.weight", {kHeads * hd, kHidden});
    add(p + "self_attn.k_proj.weight", {kKvHeads * hd, kHidden});
    add(p + "self_attn.v_proj.weight", {kKvHeads * hd, kHidden});
    add(p + "self_attn.o_proj.weight", {kHidden, kHeads * hd});
    add(p + "post_attention_layernorm.weight", {kHidden}, true);
    add(p + "mlp.gate_proj.weight", {kFfn, kHidden});
    add(p + "mlp.up_proj.weight", {kFfn, kHidden});
    add(p + "mlp.down_proj.weight", {kHidden, kFfn});
  }
  add("model.norm.weight", {kHidden}, true);
  add("lm_head.weight", {kVocab, kHidden});
  std::vector<io::TensorToWrite> to_write;
  for (const auto& [name, t] : tensors)
    to_write.push_back({name, DType::kF32, t.shape(),
                        std::span<const std::byte>(reinterpret_cast<const std::byte*>(t.data()),
                                                   static_cast<size_t>(t.numel()) * 4)});
  io::write_safetensors(dir / "model.safetensors", to_write, {{"format", "pt"}});
  return dir;
}

std::vector<int32_t> random_tokens(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, kVocab - 1);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& v : t) v = dist(gen);
  t[0] = 1;  // BOS
  return t;
}

// Mean next-token NLL of one chunk from the model's logits, written out naively.
double naive_chunk_nll(DecoderModel& m, std::span<const int32_t> chunk) {
  const int64_t T = static_cast<int64_t>(chunk.size());
  const Tensor logits = m.forward(chunk, 1, T);
  double total = 0;
  for (int64_t t = 0; t + 1 < T; ++t) {
    double z = 0;
    for (int64_t j = 0; j < kVocab; ++j) z += std::exp(static_cast<double>(logits[t * kVocab + j]));
    total += std::log(z) - logits[t * kVocab + chunk[static_cast<size_t>(t + 1)]];
  }
  return total / static_cast<double>(T - 1);
}

class TinyLlama : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = new std::filesystem::path(make_tiny_llama()); }
  static void TearDownTestSuite() {
    std::filesystem::remove_all(*dir_);
    delete dir_;
  }
  static std::filesystem::path* dir_;
};
std::filesystem::path* TinyLlama::dir_ = nullptr;

TEST_F(TinyLlama, PerplexityIsExpOfMeanChunkNllAndDropsTheTail) {
  auto m = DecoderModel::open(*dir_);
  const int64_t T = 8;
  const auto tokens = random_tokens(3 * T + 5, 1);  // 3 chunks + a tail of 5
  double sum = 0;
  std::vector<double> per_chunk;
  for (int64_t c = 0; c < 3; ++c) {
    per_chunk.push_back(naive_chunk_nll(m, std::span(tokens).subspan(static_cast<size_t>(c * T), T)));
    sum += per_chunk.back();
  }
  const double want = std::exp(sum / 3);
  std::vector<std::pair<int64_t, int64_t>> progress;
  const auto r =
      evaluate_perplexity(m, tokens, {.seqlen = T, .batch_sequences = 2},
                          [&](int64_t done, int64_t total) { progress.emplace_back(done, total); });
  EXPECT_EQ(r.chunks, 3);
  EXPECT_EQ(r.tokens, 3 * T + 5);
  EXPECT_EQ(r.evaluated_tokens, 3 * T);
  EXPECT_EQ(r.seqlen, T);
  EXPECT_NEAR(r.perplexity, want, 1e-5 * want);
  EXPECT_NEAR(r.mean_nll, sum / 3, 1e-5);
  ASSERT_EQ(r.chunk_nll.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(r.chunk_nll[i], per_chunk[i], 1e-5);
  EXPECT_EQ(progress, (std::vector<std::pair<int64_t, int64_t>>{{2, 3}, {3, 3}}));
  EXPECT_GE(r.wall_seconds, 0.0);

  // The tail does not matter; batching does not matter.
  auto other_tail = tokens;
  for (size_t i = 3 * T; i < other_tail.size(); ++i) other_tail[i] = (other_tail[i] + 5) % kVocab;
  const auto r2 = evaluate_perplexity(m, other_tail, {.seqlen = T, .batch_sequences = 1});
  EXPECT_NEAR(r2.perplexity, r.perplexity, 1e-6 * r.perplexity);
  // max_chunks takes the first K chunks.
  const auto r3 = evaluate_perplexity(m, tokens, {.seqlen = T, .max_chunks = 1});
  EXPECT_EQ(r3.chunks, 1);
  EXPECT_NEAR(r3.mean_nll, per_chunk[0], 1e-5);
}

// Each part of a split evaluation runs as many batch slots as the largest part holds batches (so that a
// slot may be a collective), its own batches first and empty slots after them; the parts' NLLs, concatenated
// in part order, are one stream's.
TEST_F(TinyLlama, EveryPartRunsTheSameNumberOfBatchSlots) {
  auto m = DecoderModel::open(*dir_);
  const int64_t T = 4;
  struct Split {
    int64_t chunks, batch;
    int parts;
    int64_t slots;  // ceil(ceil(chunks / batch) / parts)
  };
  for (const Split split : {Split{5, 2, 2, 2}, Split{3, 1, 5, 1}, Split{4, 4, 3, 1}, Split{7, 2, 3, 2}}) {
    SCOPED_TRACE(std::to_string(split.chunks) + " chunks, batch " + std::to_string(split.batch) + ", " +
                 std::to_string(split.parts) + " parts");
    const auto tokens = random_tokens(split.chunks * T, 11);
    const PerplexityOptions options{.seqlen = T, .batch_sequences = split.batch};
    std::vector<double> whole;
    {
      PerplexityStream one(m, tokens, options);
      for (int64_t b = 0; b < m.num_blocks(); ++b) one.run_block(b);
      whole = one.local_chunk_nll();
    }
    std::vector<double> joined;
    for (int part = 0; part < split.parts; ++part) {
      PerplexityStream stream(m, tokens, options, split.parts, part);
      EXPECT_EQ(stream.batch_slots(), split.slots);
      for (int64_t b = 0; b < m.num_blocks(); ++b) stream.run_block(b);
      std::vector<int64_t> done_after_slot;  // local chunks done after each slot
      int64_t done = 0;
      const auto nll = stream.local_chunk_nll([&](int64_t d, int64_t) { done = d; },
                                              [&](const std::function<void()>& batch) {
                                                batch();
                                                done_after_slot.push_back(done);
                                              });
      ASSERT_EQ(static_cast<int64_t>(done_after_slot.size()), split.slots);
      for (int64_t i = 0; i < split.slots; ++i)  // the part's batches in order, then empty slots
        EXPECT_EQ(done_after_slot[static_cast<size_t>(i)],
                  std::min((i + 1) * split.batch, stream.local_chunks()));
      EXPECT_EQ(static_cast<int64_t>(nll.size()), stream.local_chunks());
      joined.insert(joined.end(), nll.begin(), nll.end());
    }
    ASSERT_EQ(joined.size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i) EXPECT_DOUBLE_EQ(joined[i], whole[i]) << "chunk " << i;
  }
}

TEST_F(TinyLlama, PerplexityErrors) {
  auto m = DecoderModel::open(*dir_);
  const auto tokens = random_tokens(5, 2);
  try {
    evaluate_perplexity(m, tokens, {.seqlen = 8});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "5 tokens, fewer than one chunk of 8");
  }
  const auto many = random_tokens(200, 3);
  try {
    evaluate_perplexity(m, many, {.seqlen = 100});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              (*dir_ / "config.json").string() + ": sequence length 100 exceeds max_position_embeddings 64");
  }
  try {
    evaluate_perplexity(m, many, {.seqlen = 1});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "perplexity needs a sequence length of at least 2, got 1");
  }
  std::vector<int32_t> bad = random_tokens(8, 4);
  bad[3] = kVocab;
  try {
    m.forward(bad, 1, 8);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "token id 16 at position 3 outside the vocabulary [0, 16) of " + dir_->string());
  }
}

TEST_F(TinyLlama, BatchedSequencesMatchSingleSequences) {
  auto m = DecoderModel::open(*dir_);
  const int64_t T = 11;
  const auto tokens = random_tokens(3 * T, 5);
  const Tensor batched = m.forward(tokens, 3, T);
  for (int64_t s = 0; s < 3; ++s) {
    const Tensor single = m.forward(std::span(tokens).subspan(static_cast<size_t>(s * T), T), 1, T);
    for (int64_t i = 0; i < single.numel(); ++i)
      ASSERT_NEAR(batched[s * T * kVocab + i], single[i], 1e-5f) << "seq " << s << " element " << i;
  }
}

struct RecordingObserver : LinearObserver {
  struct Call {
    LinearId id;
    std::vector<int64_t> in_shape, out_shape;
    double max_err = 0;  // output vs input · Wᵀ recomputed here
  };
  DecoderModel* model = nullptr;
  std::vector<Call> calls;
  void on_linear(const LinearId& id, const Tensor& input, const Tensor& output, const Tensor*) override {
    const Tensor& w = model->block_weights(id.block).linears.at(id.name).weight;
    const int64_t rows = input.dim(0), n = input.dim(1), mo = output.dim(1);
    double err = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < mo; ++j) {
        double s = 0;
        for (int64_t c = 0; c < n; ++c) s += static_cast<double>(input[r * n + c]) * w[j * n + c];
        err = std::max(err, std::abs(s - output[r * mo + j]));
      }
    calls.push_back({id, input.shape(), output.shape(), err});
  }
};

TEST_F(TinyLlama, ObserverSeesEveryLinearInOrder) {
  auto m = DecoderModel::open(*dir_);
  const int64_t T = 6, n = 2;
  const auto tokens = random_tokens(n * T, 6);
  Tensor h = m.embed(tokens, n, T);
  RecordingObserver obs;
  obs.model = &m;
  m.run_block(1, h, n, T, &obs);
  const std::vector<std::string> names = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                          "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                          "mlp.down_proj"};
  EXPECT_EQ(m.linear_names(), names);
  ASSERT_EQ(obs.calls.size(), names.size());
  const int64_t hd = kHidden / kHeads;
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {kHidden, kHeads * hd}, {kHidden, kKvHeads * hd}, {kHidden, kKvHeads * hd}, {kHeads * hd, kHidden},
      {kHidden, kFfn},        {kHidden, kFfn},          {kFfn, kHidden}};
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(obs.calls[i].id, (LinearId{1, names[i]}));
    EXPECT_EQ(obs.calls[i].in_shape, (std::vector<int64_t>{n * T, shapes[i].first}));
    EXPECT_EQ(obs.calls[i].out_shape, (std::vector<int64_t>{n * T, shapes[i].second}));
    EXPECT_LT(obs.calls[i].max_err, 1e-5) << names[i];
  }
  EXPECT_EQ(LinearId({1, "mlp.up_proj"}).to_string(), "1.mlp.up_proj");
}

TEST_F(TinyLlama, ZeroOverridesOfOutputProjectionsLeaveOnlyTheResidual) {
  auto m = DecoderModel::open(*dir_);
  const int64_t T = 5;
  const auto tokens = random_tokens(T, 7);
  const Tensor h0 = m.embed(tokens, 1, T);
  WeightOverrides overrides;
  overrides[{0, "self_attn.o_proj"}] = Tensor({kHidden, kHidden});
  overrides[{0, "mlp.down_proj"}] = Tensor({kHidden, kFfn});
  Tensor h = h0;
  m.run_block(0, h, 1, T, nullptr, &overrides);
  for (int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(h[i], h0[i]);
  // Overriding with the stored weights changes nothing.
  WeightOverrides same;
  same[{0, "mlp.up_proj"}] = m.block_weights(0).linears.at("mlp.up_proj").weight;
  Tensor a = h0, b = h0;
  m.run_block(0, a, 1, T);
  m.run_block(0, b, 1, T, nullptr, &same);
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a[i], b[i]);
  // Overrides of other blocks are ignored; a wrong shape is an error.
  WeightOverrides bad;
  bad[{0, "mlp.up_proj"}] = Tensor({3, 3});
  try {
    m.run_block(0, b, 1, T, nullptr, &bad);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "weight override for '0.mlp.up_proj' has shape [3, 3], expected [12, 8]");
  }
}

TEST_F(TinyLlama, MicroBatchesGiveTheSameHiddenStatesAndWholeSequencesToTheObserver) {
  auto m = DecoderModel::open(*dir_);
  const int64_t T = 7, n = 5;
  const auto tokens = random_tokens(n * T, 8);
  Tensor a = m.embed(tokens, n, T), b = a;
  m.run_block(0, a, n, T);
  m.set_max_tokens_per_pass(2 * T);  // passes of 2, 2, 1 sequences
  RecordingObserver obs;
  obs.model = &m;
  m.run_block(0, b, n, T, &obs);
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_NEAR(a[i], b[i], 1e-6f);
  ASSERT_EQ(obs.calls.size(), 3 * m.linear_names().size());
  EXPECT_EQ(obs.calls[0].in_shape[0], 2 * T);
  EXPECT_EQ(obs.calls.back().in_shape[0], T);
}

TEST_F(TinyLlama, PassProgressHearsOfEachMicroBatchWhileSet) {
  auto m = DecoderModel::open(*dir_);
  const int64_t T = 7, n = 5;
  Tensor h = m.embed(random_tokens(n * T, 9), n, T);
  std::vector<int64_t> heard;
  m.set_pass_progress([&](int64_t sequences) { heard.push_back(sequences); });
  m.run_block(0, h, n, T);  // one pass
  EXPECT_EQ(heard, (std::vector<int64_t>{5}));
  m.set_max_tokens_per_pass(2 * T);
  m.run_block(1, h, n, T);
  EXPECT_EQ(heard, (std::vector<int64_t>{5, 2, 2, 1}));
  m.set_pass_progress({});
  m.run_block(0, h, n, T);
  EXPECT_EQ(heard.size(), 4u);
}

TEST_F(TinyLlama, BlocksLoadOnDemandAndCanBeReleased) {
  auto m = DecoderModel::open(*dir_);
  m.set_max_resident_blocks(1);
  const Tensor before = m.block_weights(0).linears.at("self_attn.q_proj").weight;
  m.block_weights(1);  // evicts block 0
  const Tensor again = m.block_weights(0).linears.at("self_attn.q_proj").weight;
  for (int64_t i = 0; i < before.numel(); ++i) ASSERT_EQ(before[i], again[i]);
  m.release_block(0);
  EXPECT_EQ(m.block_weights(0).linears.size(), 7u);
}

TEST_F(TinyLlama, SetLinearWeightPersistsAndPinsTheBlock) {
  auto m = DecoderModel::open(*dir_);
  const int64_t T = 5;
  const auto tokens = random_tokens(T, 9);
  const Tensor h0 = m.embed(tokens, 1, T);
  m.set_max_resident_blocks(1);
  m.set_linear_weight({0, "self_attn.o_proj"}, Tensor({kHidden, kHidden}));
  m.set_linear_weight({0, "mlp.down_proj"}, Tensor({kHidden, kFfn}));
  m.block_weights(1);  // would evict block 0 if it were not pinned
  Tensor h = h0;
  m.run_block(0, h, 1, T);
  for (int64_t i = 0; i < h.numel(); ++i) ASSERT_EQ(h[i], h0[i]);
  try {
    m.set_linear_weight({1, "fc1"}, Tensor({1}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unknown linear '1.fc1'");
  }
  try {
    m.set_linear_weight({1, "mlp.up_proj"}, Tensor({1}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "new weight for '1.mlp.up_proj' has shape [1], expected [12, 8]");
  }
  // Released, the block reads the stored weights again.
  m.release_block(0);
  Tensor h2 = h0;
  m.run_block(0, h2, 1, T);
  bool changed = false;
  for (int64_t i = 0; i < h2.numel(); ++i) changed |= h2[i] != h0[i];
  EXPECT_TRUE(changed);
}

TEST_F(TinyLlama, FingerprintIsStableAndSeesTheConfig) {
  const std::string a = model_fingerprint(*dir_);
  EXPECT_EQ(a.size(), 16u);
  EXPECT_EQ(model_fingerprint(*dir_), a);
  const auto copy = testing::make_temp_dir("symprune_fp");
  std::filesystem::copy(
      *dir_, copy,
      std::filesystem::copy_options::recursive | std::filesystem::copy_options::overwrite_existing);
  EXPECT_EQ(model_fingerprint(copy), a);
  {
    std::ofstream out(copy / "config.json", std::ios::app);
    out << " ";
  }
  EXPECT_NE(model_fingerprint(copy), a);
  std::filesystem::remove_all(copy);
  try {
    model_fingerprint(copy);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), copy.string() + ": missing config.json");
  }
}

}  // namespace
}  // namespace symprune::model
