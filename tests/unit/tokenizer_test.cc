// Tokenizers: golden ids and counts on the shared data, format selection, and clear errors on corrupt files.
#include "io/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/llama2c_tokenizer.h"
#include "support/test_support.h"

namespace symprune::io {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

fs::path data(const char* relative) {
  return symprune::testing::data_dir() / relative;
}

// Runs `f`, expecting a symprune::Error whose message contains every one of `parts`.
template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected symprune::Error";
  } catch (const Error& e) {
    for (const auto& part : parts) EXPECT_THAT(e.what(), HasSubstr(part));
  }
}

const char* const kVaried =
    "Caf\xc3\xa9 na\xc3\xafve \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\xa4\x97 \t\ttabs  spaces\n\n\n123456789 "
    "don't";

// ---- SentencePiece ------------------------------------------------------------------------------

TEST(SentencePieceTokenizer, HelloWorldAndSpecialIds) {
  const auto tok = load_sentencepiece_tokenizer(data("llama2c_tokenizer/tokenizer.model"));
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_THAT(tok->encode("Hello world", false), ElementsAre(15043, 3186));
  EXPECT_THAT(tok->encode("Hello world", true), ElementsAre(1, 15043, 3186));
  EXPECT_EQ(tok->decode(tok->encode(kVaried, true)), kVaried);
}

TEST(SentencePieceTokenizer, AddBosTokenFalseInTheConfigMeansNoBos) {
  // transformers' LlamaTokenizer reads add_bos_token from tokenizer_config.json beside the model.
  const auto dir = symprune::testing::make_temp_dir("symprune_tok_");
  fs::create_symlink(data("llama2c_tokenizer/tokenizer.model"), dir / "tokenizer.model");
  write_file(dir / "tokenizer_config.json", R"({"add_bos_token": false, "bos_token": "<s>"})");
  const auto tok = load_tokenizer(dir);
  EXPECT_EQ(tok->bos_id(), std::nullopt);
  EXPECT_THAT(tok->encode("Hello world", true), ElementsAre(15043, 3186));
  write_file(dir / "tokenizer_config.json", R"({"add_bos_token": true})");
  EXPECT_THAT(load_tokenizer(dir)->encode("Hello world", true), ElementsAre(1, 15043, 3186));
  fs::remove_all(dir);
}

TEST(SentencePieceTokenizer, WikitextGoldenCount) {
  const auto tok = load_tokenizer(data("llama2c_tokenizer"));  // directory: tokenizer.model wins
  EXPECT_EQ(tok->kind(), "sentencepiece");
  const std::string text = read_file(data("wikitext2/wiki.test.hf_rows_joined_nn.txt"));
  EXPECT_EQ(tok->encode(text, true).size(), 341469u);
}

TEST(SentencePieceTokenizer, CorruptModelIsAnError) {
  const auto dir = symprune::testing::make_temp_dir("symprune_tok_");
  write_file(dir / "tokenizer.model", "this is not a protobuf \xff\xff\xff\xff");
  expect_error([&] { load_sentencepiece_tokenizer(dir / "tokenizer.model"); },
               {(dir / "tokenizer.model").string(), "could not be loaded"});
  write_file(dir / "empty.model", "");
  expect_error([&] { load_tokenizer(dir / "empty.model"); }, {(dir / "empty.model").string(), "is empty"});
  fs::remove_all(dir);
}

// ---- GPT-2 vocab.json + merges.txt --------------------------------------------------------------

TEST(Gpt2Tokenizer, HelloWorldAndSpecials) {
  const auto tok = load_tokenizer(data("gpt2_tokenizer/vocab.json"));
  EXPECT_EQ(tok->kind(), "bpe-gpt2");
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->bos_id(), std::nullopt);  // HF GPT-2 prepends nothing
  EXPECT_EQ(tok->eos_id(), 50256);
  EXPECT_THAT(tok->encode("Hello world", false), ElementsAre(15496, 995));
  EXPECT_THAT(tok->encode("Hello world", true), ElementsAre(15496, 995));
  EXPECT_THAT(tok->encode("a<|endoftext|>b", false), ElementsAre(64, 50256, 65));
  EXPECT_TRUE(tok->encode("", false).empty());
  EXPECT_EQ(tok->decode(tok->encode(kVaried, false)), kVaried);  // byte-level BPE is lossless
}

TEST(Gpt2Tokenizer, WikitextGoldenCount) {
  const auto tok = load_tokenizer(data("gpt2_tokenizer"));
  const std::string text = read_file(data("wikitext2/wiki.test.hf_rows_joined_nn.txt"));
  EXPECT_EQ(tok->encode(text, false).size(), 287644u);
}

TEST(Gpt2Tokenizer, InvalidUtf8AndBadIdsAreErrors) {
  const auto tok = load_tokenizer(data("gpt2_tokenizer"));
  expect_error([&] { tok->encode("ok \xff\xfe", false); }, {"vocab.json", "not valid UTF-8 (byte 3 of 5)"});
  expect_error([&] { tok->decode({15496, 60000}); }, {"token id 60000 is not in the vocabulary"});
}

// ---- tokenizer.json (LLaMA-3) -------------------------------------------------------------------

TEST(HfTokenizerJson, Llama3) {
  const auto tok = load_tokenizer(data("llama3_tokenizer"));
  EXPECT_EQ(tok->kind(), "bpe-tokenizer.json");
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->bos_id(), 128000);  // from tokenizer_config.json (this post-processor adds nothing)
  EXPECT_EQ(tok->eos_id(), 128001);
  EXPECT_THAT(tok->encode("Hello world", false), ElementsAre(9906, 1917));
  EXPECT_THAT(tok->encode("Hello world", true), ElementsAre(128000, 9906, 1917));
  // Special tokens are split off first; digits go in groups of at most three.
  EXPECT_THAT(tok->encode("<|begin_of_text|>1234567", false), ElementsAre(128000, 4513, 10961, 22));
  EXPECT_EQ(tok->decode(tok->encode(kVaried, true)), std::string("<|begin_of_text|>") + kVaried);
}

// A tiny hand-made tokenizer.json: checks merge ranks and ignore_merges exactly.
std::string tiny_tokenizer_json(bool ignore_merges, const std::string& merges = R"(["b c", "a b"])",
                                const std::string& extra_vocab = "") {
  return R"({"version": "1.0", "added_tokens": [{"id": 6, "content": "<x>", "special": true}],
    "normalizer": null, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<x>", "type_id": 0}},
      {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {"<x>": {"id": "<x>", "ids": [6],
      "tokens": ["<x>"]}}},
    "decoder": {"type": "ByteLevel"},
    "model": {"type": "BPE", "dropout": null, "unk_token": null, "ignore_merges": )" +
         std::string(ignore_merges ? "true" : "false") +
         R"(, "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5)" + extra_vocab +
         R"(}, "merges": )" + merges + "}}";
}

TEST(HfTokenizerJson, MergeRanksIgnoreMergesAndTemplateBos) {
  const auto dir = symprune::testing::make_temp_dir("symprune_tok_");
  write_file(dir / "tokenizer.json", tiny_tokenizer_json(false));
  auto tok = load_tokenizer(dir);
  EXPECT_EQ(tok->bos_id(), 6);  // the TemplateProcessing's leading special token
  // "b c" has rank 0, so "abc" becomes [a, bc] and no merge joins them.
  EXPECT_THAT(tok->encode("abc", false), ElementsAre(0, 4));
  EXPECT_THAT(tok->encode("abc<x>ab", true), ElementsAre(6, 0, 4, 6, 3));
  write_file(dir / "tokenizer.json", tiny_tokenizer_json(true));
  tok = load_tokenizer(dir / "tokenizer.json");
  EXPECT_THAT(tok->encode("abc", false), ElementsAre(5));  // whole word in the vocab
  // Merges as [a, b] pairs (newer tokenizers) read the same.
  write_file(dir / "tokenizer.json", tiny_tokenizer_json(false, R"([["b", "c"], ["a", "b"]])"));
  EXPECT_THAT(load_tokenizer(dir)->encode("abc", false), ElementsAre(0, 4));
  fs::remove_all(dir);
}

TEST(HfTokenizerJson, CorruptAndUnsupportedFilesAreErrors) {
  const auto dir = symprune::testing::make_temp_dir("symprune_tok_");
  const auto path = dir / "tokenizer.json";
  const std::string p = path.string();
  write_file(path, "{\"model\": {\"type\": \"BPE\", ");
  expect_error([&] { load_tokenizer(dir); }, {p, "invalid JSON"});
  write_file(path, tiny_tokenizer_json(false, R"(["b c", "a d"])"));
  expect_error([&] { load_tokenizer(path); },
               {p, "merge 1", "references token \"d\", which is not in the vocabulary"});
  write_file(path, tiny_tokenizer_json(false, R"(["c a"])"));
  expect_error([&] { load_tokenizer(path); }, {p, "references token \"ca\""});
  write_file(path, tiny_tokenizer_json(false, R"(["abc"])"));
  expect_error([&] { load_tokenizer(path); },
               {p, "merge 0 \"abc\" is not two tokens separated by one space"});
  write_file(path, tiny_tokenizer_json(false, R"(["a b"])", R"(, "z": -4)"));
  expect_error([&] { load_tokenizer(path); }, {p, "vocab token \"z\" has id -4"});
  write_file(path, tiny_tokenizer_json(false, R"([1, 2])"));
  expect_error([&] { load_tokenizer(path); }, {p, "merge 0 is 1, expected"});
  write_file(path, R"({"model": {"type": "WordPiece", "vocab": {}}})");
  expect_error([&] { load_tokenizer(path); },
               {p, "model type \"WordPiece\" is not supported", "byte-level BPE"});
  // LLaMA-2's HF tokenizer.json: BPE, but SentencePiece-style (Metaspace / byte_fallback), not byte-level.
  write_file(path, R"({"normalizer": null, "pre_tokenizer": {"type": "Metaspace", "replacement": "_"},
                       "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  expect_error([&] { load_tokenizer(path); }, {p, "not byte-level", "tokenizer.model"});
  // NFC (Qwen2's) is read; NFKC, or NFC inside a Sequence, is not.
  write_file(path, R"({"normalizer": {"type": "NFKC"}, "pre_tokenizer": {"type": "ByteLevel"},
                       "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  expect_error([&] { load_tokenizer(path); }, {p, "normalizer NFKC is not supported"});
  write_file(path, R"({"normalizer": {"type": "Sequence", "normalizers": [{"type": "NFC"}]},
                       "pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": {"a": 0},
                       "merges": []}})");
  expect_error([&] { load_tokenizer(path); }, {p, "normalizer Sequence is not supported"});
  write_file(path, R"({"normalizer": null, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                       {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"},
                       {"type": "ByteLevel", "use_regex": false}]},
                       "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  expect_error([&] { load_tokenizer(path); }, {p, "regex \"(unclosed\" does not compile"});
  write_file(path, R"({"normalizer": null, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                       {"type": "Digits"}, {"type": "ByteLevel"}]},
                       "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  expect_error([&] { load_tokenizer(path); }, {p, "pre-tokenizer \"Digits\" is not supported"});
  write_file(path,
             R"({"normalizer": null, "pre_tokenizer": {"type": "ByteLevel"}, "added_tokens": [{"id": 1}],
                       "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}})");
  expect_error([&] { load_tokenizer(path); }, {p, "added token", "has no content/id"});
  write_file(path, R"({"normalizer": null, "pre_tokenizer": {"type": "ByteLevel"},
                       "model": {"type": "BPE", "ignore_merges": "yes", "vocab": {"a": 0}, "merges": []}})");
  expect_error([&] { load_tokenizer(path); }, {p, "malformed tokenizer.json"});
  write_file(path, tiny_tokenizer_json(false));
  write_file(dir / "tokenizer_config.json", "{not json");
  expect_error([&] { load_tokenizer(path); }, {(dir / "tokenizer_config.json").string(), "invalid JSON"});
  fs::remove_all(dir);
}

TEST(Gpt2Tokenizer, CorruptFilesAreErrors) {
  const auto dir = symprune::testing::make_temp_dir("symprune_tok_");
  write_file(dir / "vocab.json", R"({"a": 0, "b": 1, "ab": 2})");
  write_file(dir / "merges.txt", "#version: 0.2\na b\na c\n");
  expect_error([&] { load_tokenizer(dir); },
               {(dir / "merges.txt").string() + ": line 3 (\"a\" \"c\") references token \"c\""});
  write_file(dir / "merges.txt", "#version: 0.2\nab\n");
  expect_error([&] { load_tokenizer(dir); },
               {(dir / "merges.txt").string() + ": line 2 \"ab\" is not two tokens"});
  write_file(dir / "merges.txt", "#version: 0.2\na b\n");
  write_file(dir / "vocab.json", R"(["a", "b"])");
  expect_error([&] { load_tokenizer(dir / "merges.txt"); },
               {(dir / "vocab.json").string(), "vocab must be a JSON object"});
  fs::remove(dir / "vocab.json");
  expect_error([&] { load_tokenizer(dir / "merges.txt"); }, {"needs both vocab.json and merges.txt"});
  fs::remove_all(dir);
}

// ---- llama2.c tokenizer.bin ---------------------------------------------------------------------

TEST(Llama2cTokenizer, ReferenceEncodingTok512) {
  const auto tok = load_tokenizer(data("stories260K/tok512.bin"));
  EXPECT_EQ(tok->kind(), "llama2c");
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  const std::string text = "Once upon a time, there was a little girl named Lily.";
  const auto ids = tok->encode(text, true);
  EXPECT_THAT(ids, ElementsAre(1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426));
  EXPECT_EQ(tok->decode(ids), text);  // run.c drops the dummy-prefix space after BOS
  EXPECT_TRUE(tok->encode("", false).empty());
  EXPECT_THAT(tok->encode("", true), ElementsAre(1));
  // Byte fallback: a character outside the 512 vocabulary becomes its UTF-8 bytes + 3, decoded back.
  const auto cjk = tok->encode("\xe4\xbd\xa0", true);
  EXPECT_EQ(tok->decode(cjk), "\xe4\xbd\xa0");
}

TEST(Llama2cTokenizer, Llama2BinAgreesWithSentencePiece) {
  const auto bin = load_llama2c_tokenizer(data("llama2c_tokenizer/tokenizer.bin"), 32000);
  const auto sp = load_sentencepiece_tokenizer(data("llama2c_tokenizer/tokenizer.model"));
  const std::string text = read_file(data("tinystories/tinystories_val.txt")).substr(0, 20000);
  EXPECT_EQ(bin->encode(text, true), sp->encode(text, true));
  EXPECT_THAT(bin->encode("Hello world", false), ElementsAre(15043, 3186));
}

// Builds a llama2.c tokenizer.bin: max_token_length then {score, len, bytes} per token.
std::string make_bin(int32_t max_len, const std::vector<std::pair<float, std::string>>& tokens) {
  std::string out(reinterpret_cast<const char*>(&max_len), 4);
  for (const auto& [score, piece] : tokens) {
    const auto len = static_cast<int32_t>(piece.size());
    out.append(reinterpret_cast<const char*>(&score), 4);
    out.append(reinterpret_cast<const char*>(&len), 4);
    out += piece;
  }
  return out;
}

TEST(Llama2cTokenizer, CorruptFilesAreErrors) {
  const auto dir = symprune::testing::make_temp_dir("symprune_tok_");
  const std::string tok512 = read_file(data("stories260K/tok512.bin"));
  const auto path = dir / "tokenizer.bin";
  const std::string p = path.string();
  write_file(path, tok512.substr(0, 1000));
  expect_error([&] { load_tokenizer(path); }, {p, "is truncated"});
  write_file(path, tok512.substr(0, 2));
  expect_error([&] { load_tokenizer(path); }, {p, "is truncated: 2 bytes, no max_token_length header"});
  std::string bad = tok512;
  const int32_t huge = 0x7fffffff;
  std::memcpy(bad.data(), &huge, 4);
  write_file(path, bad);
  expect_error([&] { load_tokenizer(path); }, {p, "max_token_length 2147483647 is out of range"});
  bad = tok512;
  const int32_t negative = -5;
  std::memcpy(bad.data() + 8, &negative, 4);  // length of token 0
  write_file(path, bad);
  expect_error([&] { load_tokenizer(path); }, {p, "token 0 has negative length -5"});
  write_file(path, make_bin(3, {{0.f, "<unk>"}}));
  expect_error([&] { load_tokenizer(path); }, {p, "token 0 has length 5 > max_token_length 3"});
  write_file(path, make_bin(8, {{0.f, "<unk>"}, {0.f, "<s>"}, {0.f, "</s>"}}));
  expect_error([&] { load_tokenizer(path); }, {p, "has only 3 tokens"});
  // An explicit vocab size must match the file exactly.
  write_file(path, tok512);
  expect_error([&] { load_llama2c_tokenizer(path, 600); }, {p, "is truncated", "token 512"});
  expect_error([&] { load_llama2c_tokenizer(path, 500); }, {p, "trailing bytes after the 500 tokens"});
  // In a directory the vocab size comes from config.json.
  write_file(dir / "config.json", R"({"vocab_size": 512})");
  EXPECT_EQ(load_tokenizer(dir)->vocab_size(), 512);
  write_file(dir / "config.json", R"({"vocab_size": 511})");
  expect_error([&] { load_tokenizer(dir); }, {p, "trailing bytes after the 511 tokens"});
  write_file(dir / "config.json", R"({"vocab_size": "many"})");
  expect_error([&] { load_tokenizer(dir); }, {(dir / "config.json").string(), "vocab_size \"many\""});
  const auto tok = load_llama2c_tokenizer(data("stories260K/tok512.bin"), 0);
  expect_error([&] { tok->decode({1, 512}); }, {"token id 512 is outside the vocabulary (size 512)"});
  fs::remove_all(dir);
}

// The tokenizer.json that convert-llama2c writes beside tokenizer.bin: the `tokenizers` library must give
// run.c's ids (BOS included) for every text; checked on both llama2.c vocabularies of the shared data.
TEST(Llama2cTokenizer, HfTokenizerJsonEncodesLikeRunC) {
  const fs::path python = symprune::testing::python_executable();
  if (!fs::exists(python)) GTEST_SKIP() << "no test Python (set SYMPRUNE_PYTHON)";
  const auto dir = symprune::testing::make_temp_dir("symprune_tokjson_");
  nlohmann::json texts = nlohmann::json::array({kVaried, "", " ", "   ", "\n\n\n", "a", "  two  spaces  ",
                                                "emoji \xF0\x9F\x98\x80\xF0\x9F\x8E\x89 and \xE2\x88\x91",
                                                std::string(300, 'x'), "Zoo"});
  const std::string stories = read_file(data("tinystories/tinystories_val.txt")).substr(0, 60000);
  for (size_t at = 0; at < stories.size();) {
    const size_t blank = stories.find("\n\n", at);
    const size_t end = blank == std::string::npos ? stories.size() : blank + 2;
    texts.push_back(stories.substr(at, end - at));
    at = end;
  }
  const std::string wiki = read_file(data("wikitext2/wiki.test.raw")).substr(0, 30000);
  texts.push_back(wiki);
  std::ifstream c4(data("c4/c4_train00000_first1000.jsonl"));
  std::string line;
  for (int i = 0; i < 40 && std::getline(c4, line); ++i) texts.push_back(nlohmann::json::parse(line)["text"]);
  write_file(dir / "texts.json", texts.dump());
  write_file(dir / "encode.py", R"PY(
import json, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
texts = json.load(open(sys.argv[2], encoding="utf-8"))
json.dump([tok.encode(t).ids for t in texts], open(sys.argv[3], "w"))
)PY");
  for (const char* bin : {"stories260K/tok512.bin", "llama2c_tokenizer/tokenizer.bin"}) {
    SCOPED_TRACE(bin);
    const std::string bytes = read_file(data(bin));
    write_file(dir / "tokenizer.json", llama2c_hf_tokenizer_json(parse_llama2c_vocabulary(bytes, bin, 0)));
    const std::string cmd = python.string() + " " + (dir / "encode.py").string() + " " +
                            (dir / "tokenizer.json").string() + " " + (dir / "texts.json").string() + " " +
                            (dir / "ids.json").string();
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    const auto theirs = nlohmann::json::parse(read_file(dir / "ids.json"));
    const auto ours = load_llama2c_tokenizer(data(bin), 0);
    ASSERT_EQ(theirs.size(), texts.size());
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::string text = texts[i].get<std::string>();
      EXPECT_EQ(theirs[i].get<std::vector<int32_t>>(), ours->encode(text, true)) << text.substr(0, 80);
    }
  }
  fs::remove_all(dir);
}

TEST(Llama2cTokenizer, HfTokenizerJsonRefusesWhatItCannotExpress) {
  std::vector<std::pair<float, std::string>> base = {{0.f, "<unk>"}, {0.f, "\n<s>\n"}, {0.f, "\n</s>\n"}};
  for (int b = 0; b < 256; ++b) base.emplace_back(0.f, fmt::format("<0x{:02X}>", b));
  const auto json_of = [&](std::vector<std::pair<float, std::string>> extra) {
    auto tokens = base;
    tokens.insert(tokens.end(), extra.begin(), extra.end());
    return llama2c_hf_tokenizer_json(parse_llama2c_vocabulary(make_bin(8, tokens), "t.bin", 0));
  };
  // Minimal valid vocabulary: " ", "a", "b", " a" (" a" = " " + "a" is the one merge).
  const auto ok = nlohmann::json::parse(json_of({{-1.f, " "}, {-2.f, "a"}, {-3.f, "b"}, {-4.f, " a"}}));
  EXPECT_EQ(ok["model"]["merges"], nlohmann::json::array({"\u2581 a"}));
  EXPECT_EQ(ok["model"]["vocab"]["\u2581a"], 262);
  EXPECT_EQ(ok["model"]["vocab"]["<s>"], 1);
  // Pieces scoring -1e10 or less never merge in run.c, so they get no merge.
  EXPECT_TRUE(
      nlohmann::json::parse(json_of({{-1.f, " "}, {-2.f, "a"}, {-1e10f, " a"}}))["model"]["merges"].empty());
  expect_error([&] { json_of({{-1.f, "a"}}); }, {"no ' ' piece"});
  expect_error(
      [&] {
        json_of({{-1.f, " "}, {-2.f, "a"}, {-3.f, "a"}});
      },
      {"pieces 260 and 261 are both 'a'"});
  expect_error([&] { json_of({{-1.f, " "}, {-2.f, "\xE2\x96\x81x"}}); }, {"piece 260 contains"});
  expect_error([&] { json_of({{-1.f, " "}, {-2.f, "\xFF"}}); }, {"piece 260 is not valid UTF-8"});
  base[3 + 65].second = "A";
  expect_error([&] { json_of({{-1.f, " "}}); }, {"piece 68 is 'A', not the byte token <0x41>"});
}

// ---- load_tokenizer selection -------------------------------------------------------------------

TEST(LoadTokenizer, DirectoryPreferenceAndErrors) {
  const auto dir = symprune::testing::make_temp_dir("symprune_tok_");
  expect_error([&] { load_tokenizer(dir); },
               {"no tokenizer found in directory " + dir.string(),
                "tokenizer.model, tokenizer.json, vocab.json + merges.txt, tokenizer.bin"});
  expect_error([&] { load_tokenizer(dir / "missing.model"); },
               {(dir / "missing.model").string(), "does not exist"});
  write_file(dir / "notes.txt", "x");
  expect_error([&] { load_tokenizer(dir / "notes.txt"); }, {"cannot tell the tokenizer format of"});
  // A LLaMA-2 style directory: tokenizer.model is used even though tokenizer.json is present.
  fs::create_symlink(data("llama2c_tokenizer/tokenizer.model"), dir / "tokenizer.model");
  write_file(dir / "tokenizer.json", R"({"model": {"type": "BPE"}, "pre_tokenizer": {"type": "Metaspace"}})");
  EXPECT_EQ(load_tokenizer(dir)->kind(), "sentencepiece");
  fs::remove(dir / "tokenizer.model");
  expect_error([&] { load_tokenizer(dir); }, {(dir / "tokenizer.json").string(), "not byte-level"});
  fs::remove(dir / "tokenizer.json");
  fs::create_symlink(data("stories260K/tok512.bin"), dir / "tokenizer.bin");
  EXPECT_EQ(load_tokenizer(dir)->kind(), "llama2c");
  // A converted llama2.c directory: tokenizer.bin is read, not its tokenizer.json twin.
  write_file(dir / "tokenizer.json", R"({"model": {"type": "BPE"}, "pre_tokenizer": {"type": "Metaspace"}})");
  EXPECT_EQ(load_tokenizer(dir)->kind(), "llama2c");
  fs::remove(dir / "tokenizer.json");
  fs::create_symlink(data("gpt2_tokenizer/vocab.json"), dir / "vocab.json");
  fs::create_symlink(data("gpt2_tokenizer/merges.txt"), dir / "merges.txt");
  EXPECT_EQ(load_tokenizer(dir)->kind(), "bpe-gpt2");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace symprune::io
