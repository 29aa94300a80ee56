// Parser bugs found by the fuzzers (tests/fuzz): each input that crashed is replayed by ctest
// (fuzz_regression.<target>); here the error each one must give now is checked by message.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/error.h"
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

// One SentencePiece piece in protobuf wire format (ModelProto.pieces: piece, score, type).
std::string sentencepiece_piece(std::string_view text, float score, int type) {
  std::string m = "\x0a" + std::string(1, static_cast<char>(text.size())) + std::string(text) + "\x15";
  char bits[4];
  std::memcpy(bits, &score, 4);
  m.append(bits, 4);
  m += '\x18';
  m += static_cast<char>(type);
  return "\x0a" + std::string(1, static_cast<char>(m.size())) + m;
}

// A piece made of NUL bytes made libsentencepiece throw Darts::Details::Exception ("zero-length key") from
// LoadFromSerializedProto instead of returning a Status; the CLI printed it without naming the file.
TEST(FuzzFindings, SentencePieceModelWithNulPieceIsAnErrorNamingTheFile) {
  const fs::path dir = symprune::testing::make_temp_dir("symprune_fuzz_findings_");
  const fs::path path = dir / "tokenizer.model";
  write_file(path, sentencepiece_piece("<unk>", 0, 2) + sentencepiece_piece("<s>", 0, 3) +
                       sentencepiece_piece("</s>", 0, 3) + sentencepiece_piece("a", -1, 1) +
                       sentencepiece_piece(std::string_view("\0", 1), -2, 1));
  const std::string message = error_of([&] { symprune::io::load_sentencepiece_tokenizer(path); });
  EXPECT_THAT(message, HasSubstr("SentencePiece model " + path.string() + " could not be loaded: "));
  EXPECT_THAT(message, HasSubstr("zero-length key"));
  fs::remove_all(dir);
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
