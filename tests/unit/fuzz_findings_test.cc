// Parser bugs found by the fuzzers (tests/fuzz): each input that crashed is replayed by ctest
// (fuzz_regression.<target>); here the error each one must give now is checked by message.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "io/sentencepiece_model_check.h"
#include "io/tokenizer.h"
#include "support/error_text.h"
#include "support/test_support.h"

namespace {

namespace fs = std::filesystem;
using symprune::Error;
using ::testing::HasSubstr;

void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

using symprune::test::error_of;

// fmt's "{:?}" (through libspdlog's copy of libfmt 9) aborted with "negative value" on a merges.txt line
// ending in a truncated UTF-8 sequence; the line is now quoted by hand, bad bytes as \xNN.
TEST(FuzzFindings, Gpt2MergeLineWithInvalidUtf8IsQuotedInTheError) {
  const fs::path dir = symprune::testing::make_temp_dir("symprune_fuzz_findings_");
  write_file(dir / "vocab.json", R"({"a": 0, "b": 1, "ab": 2})");
  write_file(dir / "merges.txt", "#version: 0.2\na b\n\xc4\xa0\xe2\x63\n");
  const std::string message =
      error_of([&] { symprune::io::load_gpt2_tokenizer(dir / "vocab.json", dir / "merges.txt"); });
  EXPECT_THAT(message, HasSubstr((dir / "merges.txt").string()));
  EXPECT_THAT(message, HasSubstr("line 3 \"\xc4\xa0\\xe2c\" is not two tokens separated by one space"));
  // Quotes, backslashes and control characters are escaped too; valid UTF-8 stays readable.
  write_file(dir / "merges.txt", "a b\n\"q\\\x01\t\xc3\xa9\n");
  EXPECT_THAT(error_of([&] { symprune::io::load_gpt2_tokenizer(dir / "vocab.json", dir / "merges.txt"); }),
              HasSubstr("line 2 \"\\\"q\\\\\\x01\\t\xc3\xa9\" is not two tokens"));
  fs::remove_all(dir);
}

// Protobuf length-delimited field `number` holding `payload` (varint tag and length).
std::string proto_field(int number, std::string_view payload) {
  std::string out;
  const auto varint = [&](uint64_t value) {
    for (; value >= 0x80; value >>= 7) out += static_cast<char>((value & 0x7f) | 0x80);
    out += static_cast<char>(value);
  };
  varint(static_cast<uint64_t>(number) << 3 | 2);
  varint(payload.size());
  out += payload;
  return out;
}

// One SentencePiece piece in protobuf wire format (ModelProto.pieces: piece, score, type).
std::string sentencepiece_piece(std::string_view text, float score, int type) {
  char bits[4];
  std::memcpy(bits, &score, 4);
  std::string m = proto_field(1, text) + "\x15" + std::string(bits, 4) + "\x18" + static_cast<char>(type);
  return proto_field(1, m);
}

// The pieces every test model starts with: <unk> (UNKNOWN), <s> and </s> (CONTROL), ids 0..2.
std::string special_pieces() {
  return sentencepiece_piece("<unk>", 0, 2) + sentencepiece_piece("<s>", 0, 3) +
         sentencepiece_piece("</s>", 0, 3);
}

// A piece made of NUL bytes made libsentencepiece throw Darts::Details::Exception ("zero-length key") from
// LoadFromSerializedProto instead of returning a Status; the CLI printed it without naming the file.
TEST(FuzzFindings, SentencePieceModelWithNulPieceIsAnErrorNamingTheFile) {
  const fs::path dir = symprune::testing::make_temp_dir("symprune_fuzz_findings_");
  const fs::path path = dir / "tokenizer.model";
  write_file(path, special_pieces() + sentencepiece_piece("a", -1, 1) +
                       sentencepiece_piece(std::string_view("\0", 1), -2, 1));
  const std::string message = error_of([&] { symprune::io::load_sentencepiece_tokenizer(path); });
  EXPECT_THAT(message, HasSubstr("SentencePiece model " + path.string() + " could not be loaded: "));
  EXPECT_THAT(message, HasSubstr("zero-length key"));
  fs::remove_all(dir);
}

// A precompiled_charsmap of `rules` nested rules key, key key, ... -> "a", as a darts-clone double array
// of 256-unit blocks: the root (unit 0) sends lookups to state 256; level k's state is 256 (k + 1), its
// unit (state ^ 0) a leaf-type unit no byte matches, and unit state ^ key is labelled `key`, has a leaf and
// leads to the next level's state, whose own unit holds the replacement's offset (0) in the strings after
// the trie ("a\0"). One rule, "A" -> "a": root state 256, edge unit 321, replacement unit 512.
struct Charsmap {
  std::vector<uint32_t> units;
  std::string strings = std::string("a\0", 2);
  explicit Charsmap(uint32_t rules = 1, unsigned char key = 'A') : units(256 * (rules + 2), 0) {
    units[0] = 256U << 10;
    units[256] = 1U << 31;
    for (uint32_t level = 0; level < rules; ++level) {
      const uint32_t state = 256 * (level + 1), next = 256 * (level + 2);
      units[state ^ key] = (state ^ key ^ next) << 10 | 1U << 8 | key;
      units[next] = 1U << 31 | 0;
    }
  }
  std::string blob() const {
    std::string out(4 + 4 * units.size(), '\0');
    const auto trie_bytes = static_cast<uint32_t>(4 * units.size());
    std::memcpy(out.data(), &trie_bytes, 4);
    std::memcpy(out.data() + 4, units.data(), 4 * units.size());
    return out + strings;
  }
};

// A model of pieces a, b, A with the given NormalizerSpec (field 3) fields.
std::string model_with_normalizer(std::string_view normalizer_fields) {
  return special_pieces() + sentencepiece_piece("a", -1, 1) + sentencepiece_piece("b", -2, 1) +
         sentencepiece_piece("A", -3, 1) + proto_field(3, normalizer_fields);
}

class SentencePieceCheck : public ::testing::Test {
 protected:
  void TearDown() override { fs::remove_all(dir_); }
  std::unique_ptr<symprune::io::Tokenizer> load(std::string_view model_bytes) {
    write_file(path_, model_bytes);
    return symprune::io::load_sentencepiece_tokenizer(path_);
  }
  std::string message_for(std::string_view model_bytes) {
    return error_of([&] { load(model_bytes); });
  }
  std::string charsmap_error(const Charsmap& charsmap) {
    return message_for(model_with_normalizer(proto_field(2, charsmap.blob())));
  }
  const fs::path dir_ = symprune::testing::make_temp_dir("symprune_fuzz_findings_");
  const fs::path path_ = dir_ / "tokenizer.model";
  const std::string loading_ = "SentencePiece model " + path_.string() + " could not be loaded: ";
  const std::string add_dummy_prefix_off_ = std::string("\x18\x00", 2);
};

// libsentencepiece walks a model's normalization trie without bounds checks: a fuzzed model crashed it
// (SIGSEGV in Normalizer::NormalizePrefix). Every state a lookup can reach is now checked first.
TEST_F(SentencePieceCheck, NormalizationTrieMustStayInsideItself) {
  // The well-formed trie is used as written: "A" is normalized to "a" (piece 3), "b" is untouched.
  EXPECT_EQ(load(model_with_normalizer(proto_field(2, Charsmap().blob()) + add_dummy_prefix_off_))
                ->encode("Ab", false),
            (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(load(model_with_normalizer(add_dummy_prefix_off_))->encode("Ab", false),
            (std::vector<int32_t>{5, 4}));

  Charsmap root_outside;
  root_outside.units[0] = 1024U << 10;
  EXPECT_THAT(charsmap_error(root_outside),
              HasSubstr(loading_ + "normalizer_spec.precompiled_charsmap is corrupt: trie state 1024 leads "
                                   "outside the trie (768 units)"));
  Charsmap root_far_outside;  // the shape of the fuzzed model: an offset of 2^30 units, a read 4 GiB away
  root_far_outside.units[0] = 0x3FFFFFU << 10 | 1U << 9;
  EXPECT_THAT(charsmap_error(root_far_outside), HasSubstr("trie state 1073741568 leads outside the trie"));
  Charsmap child_outside;
  child_outside.units[321] = (321U ^ 4096U) << 10 | 1U << 8 | 'A';
  EXPECT_THAT(charsmap_error(child_outside), HasSubstr("trie state 4096 leads outside the trie (768 units)"));
  Charsmap replacement_outside;
  replacement_outside.units[512] = 1U << 31 | 100;
  EXPECT_THAT(charsmap_error(replacement_outside),
              HasSubstr("trie unit 512 points at replacement byte 100 of 2"));
  Charsmap no_strings;
  no_strings.strings.clear();
  EXPECT_THAT(charsmap_error(no_strings), HasSubstr("trie unit 512 points at replacement byte 0 of 0"));
  Charsmap loop;  // the edge for 'A' leads back to the root state
  loop.units[321] = (321U ^ 256U) << 10 | 'A';
  EXPECT_THAT(charsmap_error(loop), HasSubstr("corrupt: trie state 256 loops back to itself"));

  const std::string blob = Charsmap().blob();
  EXPECT_THAT(message_for(model_with_normalizer(proto_field(2, blob.substr(0, 3)))),
              HasSubstr("precompiled_charsmap is corrupt: 3 bytes, too short to hold a trie"));
  EXPECT_THAT(message_for(model_with_normalizer(proto_field(2, blob.substr(0, 1000)))),
              HasSubstr("precompiled_charsmap is corrupt: its trie of 3072 bytes does not fit in 996 bytes"));
  EXPECT_THAT(message_for(model_with_normalizer(proto_field(2, std::string(4, '\0') + "a"))),
              HasSubstr("precompiled_charsmap is corrupt: its trie is empty"));
  // The denormalizer (field 5) is checked the same way.
  EXPECT_THAT(message_for(model_with_normalizer("") + proto_field(5, proto_field(2, root_outside.blob()))),
              HasSubstr(loading_ + "denormalizer_spec.precompiled_charsmap is corrupt: trie state 1024"));
  // A spec cut short is reported where the cut is.
  const std::string truncated_spec =
      "\x1a\x04\x12\x10"
      "ab";
  EXPECT_THAT(
      message_for(truncated_spec),
      HasSubstr(loading_ + "normalizer_spec: malformed protobuf at byte 2: a field longer than the rest"));
}

// More than 32 rules matching one input overran libsentencepiece's 32-entry result array (SIGSEGV in
// strlen, or a huge allocation); keys and replacements are bounded so that no rule set stalls or floods it.
TEST_F(SentencePieceCheck, NormalizationRulesStayWithinTheLibrarysLimits) {
  const auto encode_with = [&](const Charsmap& charsmap, std::string_view text) {
    return load(model_with_normalizer(proto_field(2, charsmap.blob()) + add_dummy_prefix_off_))
        ->encode(text, false);
  };
  // 32 nested rules "a".."a" x 32 -> "a": the longest match wins, so 40 a's become "a" + "a" (from 8 a's).
  EXPECT_EQ(encode_with(Charsmap(32, 'a'), std::string(40, 'a')), (std::vector<int32_t>{3, 3}));
  EXPECT_THAT(
      charsmap_error(Charsmap(33, 'a')),
      HasSubstr(loading_ + "normalizer_spec.precompiled_charsmap is corrupt: more than 32 rules match "
                           "one input, the most libsentencepiece holds"));

  Charsmap long_key(300, 'b');  // only the last level is a rule: one key of 300 bytes
  for (uint32_t level = 0; level + 1 < 300; ++level) long_key.units[256 * (level + 1) ^ 'b'] &= ~(1U << 8);
  EXPECT_THAT(charsmap_error(long_key), HasSubstr("corrupt: a rule key is longer than 256 bytes"));
  long_key = Charsmap(256, 'b');
  for (uint32_t level = 0; level + 1 < 256; ++level) long_key.units[256 * (level + 1) ^ 'b'] &= ~(1U << 8);
  EXPECT_EQ(encode_with(long_key, std::string(256, 'b')), (std::vector<int32_t>{3}));

  Charsmap long_replacement;
  long_replacement.strings = std::string(65, 'b');
  EXPECT_THAT(charsmap_error(long_replacement),
              HasSubstr("corrupt: the replacement at byte 0 is longer than the 64 bytes accepted"));
  long_replacement.strings = std::string(64, 'b') + '\0';
  EXPECT_EQ(encode_with(long_replacement, "A"), (std::vector<int32_t>(64, 4)));
}

// darts-clone recurses once per byte of a piece while libsentencepiece builds its trie: a piece of ~100 KB
// overflowed the stack at load (SIGSEGV; google/sentencepiece#1263). Pieces are limited to 16 KiB.
TEST_F(SentencePieceCheck, PieceLongerThanTheLimitIsRefused) {
  const auto model_with_piece_of = [](size_t bytes) {
    return special_pieces() + sentencepiece_piece("a", -1, 1) +
           sentencepiece_piece(std::string(bytes, 'x'), -2, 1);
  };
  EXPECT_EQ(load(model_with_piece_of(symprune::io::kMaxSentencePieceBytes))->vocab_size(), 5);
  EXPECT_THAT(message_for(model_with_piece_of(200000)),
              HasSubstr(loading_ + "piece 4 is 200000 bytes long, more than the 16384 accepted"));
}

// More than 64 user-defined pieces that are prefixes of one another overran PrefixMatcher's 64-entry
// result array (SIGSEGV at load when a self-test sample held them, or on encoding such a text).
TEST_F(SentencePieceCheck, UserDefinedPiecesNestedPastTheLibrarysLimitAreRefused) {
  const auto model_with_nested_user_pieces = [](int count) {
    std::string model = special_pieces() + sentencepiece_piece("d", -1, 1);
    for (int k = 1; k <= count; ++k) model += sentencepiece_piece(std::string(k, 'c'), 0, 4);
    return model;
  };
  // "\u2581" (the dummy prefix, unknown here), then the longest user-defined pieces: c x 64 (id 67), c x 6.
  EXPECT_EQ(load(model_with_nested_user_pieces(64))->encode(std::string(70, 'c'), false),
            (std::vector<int32_t>{0, 67, 9}));
  EXPECT_THAT(message_for(model_with_nested_user_pieces(65)),
              HasSubstr(loading_ + "more than 64 user-defined pieces are prefixes of one another, the most "
                                   "libsentencepiece holds"));
}

// protobuf-lite reads a tag of up to 5 bytes and drops bits above 32: "8a 80 80 80 10" is field 1 to it
// but field 2^29 + 1 to a 64-bit reader, which hid a piece (or a trie) from the check.
TEST_F(SentencePieceCheck, TagsLongerThan32BitsAreRefused) {
  const std::string valid = model_with_normalizer("");
  const std::string piece =
      sentencepiece_piece(std::string(200000, 'x'), -1, 1).substr(1);  // without its tag
  EXPECT_THAT(message_for(valid + "\x8a\x80\x80\x80\x10" + piece),
              HasSubstr(loading_ + "malformed protobuf at byte " + std::to_string(valid.size() + 5) +
                        ": a field tag longer than 32 bits"));
}

// libsentencepiece runs the model's self-test samples at load; their cost grows with their size, so a
// model whose samples hold more than 8 KiB of input is loaded without them.
TEST_F(SentencePieceCheck, LargeSelfTestSamplesAreLeftOut) {
  const auto with_self_test = [&](size_t bytes) {
    const std::string sample = proto_field(1, std::string(bytes, 'a')) + proto_field(2, "x");
    return model_with_normalizer(add_dummy_prefix_off_) + proto_field(4, proto_field(1, sample));
  };
  // Within the bound the library runs them: "x" is not what 8192 a's encode to.
  EXPECT_THAT(message_for(with_self_test(8192)), HasSubstr(loading_ + "Internal: Self-test failures"));
  // Beyond it the samples are not run, and the model is otherwise the same.
  EXPECT_EQ(load(with_self_test(8193))->encode("ab", false), (std::vector<int32_t>{3, 4}));
  const auto check = symprune::io::check_sentencepiece_model(with_self_test(8193));
  EXPECT_EQ(check.problem, "");
  EXPECT_TRUE(check.self_test_left_out);
  EXPECT_EQ(check.self_test_bytes, 8193U);
  EXPECT_EQ(check.model_to_load, model_with_normalizer(add_dummy_prefix_off_));
}

// An added token with id 2^31 - 1 made the dense id -> token table allocate 2^31 entries (80 GB).
TEST(FuzzFindings, HugeTokenIdIsRefusedBeforeAllocating) {
  const fs::path dir = symprune::testing::make_temp_dir("symprune_fuzz_findings_");
  const fs::path path = dir / "tokenizer.json";
  write_file(path, R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
                      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
                      "added_tokens": [{"id": 2147483647, "content": "<huge>", "special": true}]})");
  const std::string message = error_of([&] { symprune::io::load_hf_tokenizer_json(path); });
  EXPECT_THAT(message, HasSubstr(path.string()));
  EXPECT_THAT(message, HasSubstr("added token \"<huge>\" has id 2147483647, expected a non-negative integer "
                                 "(at most 4194303)"));
  // The largest id allowed still loads (a sparse table of 4 Mi entries).
  write_file(path, R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
                      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
                      "added_tokens": [{"id": 4194303, "content": "<last>", "special": true}]})");
  EXPECT_EQ(symprune::io::load_hf_tokenizer_json(path)->vocab_size(), 4194304);
  fs::remove_all(dir);
}

}  // namespace
