// load_calibration on synthetic files with a byte-level tokenizer (id = byte + 3, BOS = 1), so token
// counts are known exactly. Expected windows were printed by the venv's Python running the reference
// loop (reference-implementations.md §1.2) with `random` on the same documents; see each test.
#include "io/calibration.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "support/test_support.h"

namespace symprune::io {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace std::string_literals;

class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text, bool add_bos) const override {
    std::vector<int32_t> ids;
    if (add_bos) ids.push_back(1);
    for (const char c : text) ids.push_back(static_cast<unsigned char>(c) + 3);
    return ids;
  }
  std::string decode(const std::vector<int32_t>&) const override { return {}; }
  std::optional<int32_t> bos_id() const override { return 1; }
  std::optional<int32_t> eos_id() const override { return 2; }
  int64_t vocab_size() const override { return 259; }
  std::string kind() const override { return "bytes"; }
};

class CalibrationTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = symprune::testing::make_temp_dir("calibration_test"); }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& bytes) {
    const fs::path path = dir_ / name;
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path;
  }
  fs::path write_gz(const std::string& name, const std::string& bytes) {
    const fs::path path = dir_ / name;
    gzFile file = gzopen(path.c_str(), "wb");
    EXPECT_NE(file, nullptr);
    EXPECT_EQ(gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    gzclose(file);
    return path;
  }
  CalibrationSet load(const fs::path& file, int64_t n, int64_t t, uint64_t seed,
                      const std::string& format = "auto", int64_t vocab = 0) {
    CalibrationOptions options;
    options.file = file;
    options.nsamples = n;
    options.seqlen = t;
    options.seed = seed;
    options.format = format;
    return load_calibration(options, tokenizer_, vocab);
  }
  // The message of the Error that load() throws.
  std::string error_of(const fs::path& file, int64_t n, int64_t t, const std::string& format = "auto",
                       int64_t vocab = 0) {
    try {
      load(file, n, t, 0, format, vocab);
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "no error for " << file;
    return {};
  }

  fs::path dir_;
  ByteTokenizer tokenizer_;
};

// Documents i = 0..19 of (i*37) % 50 letters: lengths 0, 37, 24, 11, 48, ... (python list in the header).
std::vector<std::string> synthetic_docs() {
  std::vector<std::string> docs;
  for (int i = 0; i < 20; ++i) {
    std::string doc;
    for (int j = 0; j < (i * 37) % 50; ++j) doc += static_cast<char>('a' + (i + j) % 26);
    docs.push_back(doc);
  }
  return docs;
}

std::string jsonl_of(const std::vector<std::string>& docs) {
  std::string out;
  for (const auto& d : docs) out += "{\"text\":\"" + d + "\",\"url\":\"u\",\"timestamp\":\"t\"}\n";
  return out;
}

std::vector<CalibrationWindow> windows(std::initializer_list<std::pair<int64_t, int64_t>> list) {
  std::vector<CalibrationWindow> out;
  for (const auto& [d, s] : list) out.push_back({d, s});
  return out;
}

// Every window must be the T ids of its document (BOS first) from its start.
void expect_windows_are_document_slices(const CalibrationSet& set, const std::vector<std::string>& docs) {
  ASSERT_EQ(set.tokens.size(), static_cast<size_t>(set.nsamples * set.seqlen));
  ByteTokenizer tok;
  for (int64_t i = 0; i < set.nsamples; ++i) {
    const auto& w = set.windows[static_cast<size_t>(i)];
    const auto ids = tok.encode(docs[static_cast<size_t>(w.doc)], true);
    ASSERT_GT(static_cast<int64_t>(ids.size()), set.seqlen) << "window " << i;
    ASSERT_LE(w.start, static_cast<int64_t>(ids.size()) - set.seqlen - 1) << "window " << i;
    for (int64_t j = 0; j < set.seqlen; ++j)
      ASSERT_EQ(set.tokens[static_cast<size_t>(i * set.seqlen + j)], ids[static_cast<size_t>(w.start + j)])
          << "window " << i << " position " << j;
  }
}

TEST_F(CalibrationTest, JsonlMatchesReferenceLoopSeed0) {
  const auto docs = synthetic_docs();
  const auto set = load(write("docs.jsonl", jsonl_of(docs)), 8, 30, 0);
  EXPECT_EQ(set.format, "jsonl");
  EXPECT_EQ(set.documents, 20);
  EXPECT_EQ(set.windows, windows({{12, 12}, {13, 0}, {8, 16}, {12, 14}, {9, 3}, {16, 2}, {9, 1}, {8, 4}}));
  expect_windows_are_document_slices(set, docs);
  // Window 1 starts at 0, so it begins with BOS.
  EXPECT_EQ(set.tokens[30], 1);
  EXPECT_EQ(set.fingerprint, tokens_fingerprint(set.tokens));
}

TEST_F(CalibrationTest, JsonlMatchesReferenceLoopSeed5) {
  const auto docs = synthetic_docs();
  const auto set = load(write("docs.json", jsonl_of(docs)), 8, 30, 5);
  EXPECT_EQ(set.windows, windows({{8, 11}, {16, 0}, {1, 2}, {12, 8}, {13, 1}, {5, 3}, {5, 0}, {4, 14}}));
  expect_windows_are_document_slices(set, docs);
}

TEST_F(CalibrationTest, JsonlGzipAndPlainAreIdentical) {
  const auto docs = synthetic_docs();
  const auto plain = load(write("docs.jsonl", jsonl_of(docs)), 8, 30, 5);
  const auto gz = load(write_gz("docs.jsonl.gz", jsonl_of(docs)), 8, 30, 5);
  EXPECT_EQ(gz.format, "jsonl");
  EXPECT_EQ(gz.windows, plain.windows);
  EXPECT_EQ(gz.tokens, plain.tokens);
  EXPECT_EQ(gz.fingerprint, plain.fingerprint);
  // Also .json.gz and explicit format on an unrelated name.
  EXPECT_EQ(load(write_gz("docs.json.gz", jsonl_of(docs)), 8, 30, 5).tokens, plain.tokens);
  EXPECT_EQ(load(write("docs.dat", jsonl_of(docs)), 8, 30, 5, "jsonl").tokens, plain.tokens);
}

TEST_F(CalibrationTest, JsonlBlankLinesAreNotDocumentsAndCrlfIsAccepted) {
  const auto docs = synthetic_docs();
  std::string text = "\n";
  for (const auto& d : docs) text += "{\"text\":\"" + d + "\"}\r\n  \n";
  const auto set = load(write("docs.jsonl", text), 8, 30, 0);
  EXPECT_EQ(set.documents, 20);
  EXPECT_EQ(set.windows, windows({{12, 12}, {13, 0}, {8, 16}, {12, 14}, {9, 3}, {16, 2}, {9, 1}, {8, 4}}));
  expect_windows_are_document_slices(set, docs);
}

TEST_F(CalibrationTest, JsonlLastLineWithoutNewline) {
  const auto docs = synthetic_docs();
  std::string text = jsonl_of(docs);
  text.pop_back();
  EXPECT_EQ(load(write("docs.jsonl", text), 8, 30, 0).windows,
            windows({{12, 12}, {13, 0}, {8, 16}, {12, 14}, {9, 3}, {16, 2}, {9, 1}, {8, 4}}));
}

TEST_F(CalibrationTest, JsonlJsonEscapesAreDecodedBeforeTokenizing) {
  // "a\nb\u00e9" is 5 bytes (a, newline, b, 0xC3 0xA9): with BOS 6 tokens, so T=5 gives start 0.
  const auto set = load(write("e.jsonl", "{\"text\":\"a\\nb\\u00e9\"}\n"), 1, 5, 0);
  EXPECT_EQ(set.tokens, (std::vector<int32_t>{1, 'a' + 3, '\n' + 3, 'b' + 3, 0xC3 + 3}));
}

TEST_F(CalibrationTest, JsonlWithOneLongDocumentAmongManyKeepsTheReferenceStream) {
  // 300 documents of 5 bytes, document 137 of 40: python gives [(137, 0), (137, 19), (137, 14)] for
  // N=3, T=20, seed 7. Hundreds of rejections per window, past the 2·D+100 guard at times.
  std::vector<std::string> docs(300, "xxxxx");
  docs[137] = std::string(40, 'y');
  const auto set = load(write("one.jsonl", jsonl_of(docs)), 3, 20, 7);
  EXPECT_EQ(set.windows, windows({{137, 0}, {137, 19}, {137, 14}}));
  expect_windows_are_document_slices(set, docs);
}

TEST_F(CalibrationTest, TextMatchesPythonRandintStarts) {
  std::string text;
  for (int i = 0; i < 1000; ++i) text += static_cast<char>(' ' + (i * 7) % 90);
  const auto path = write("corpus.txt", text);
  // L = 1000 bytes + BOS = 1001. random.seed(S); [random.randint(0, 1001-64-1) for _ in range(10)]
  const std::vector<int64_t> starts0 = {864, 394, 776, 911, 430, 41, 265, 523, 497, 414};
  const std::vector<int64_t> starts9 = {474, 627, 382, 273, 141, 190, 887, 692, 6, 346};
  for (const auto& [seed, starts] : {std::pair{uint64_t{0}, starts0}, std::pair{uint64_t{9}, starts9}}) {
    const auto set = load(path, 10, 64, seed);
    EXPECT_EQ(set.format, "text");
    EXPECT_EQ(set.stream_tokens, 1001);
    const auto stream = ByteTokenizer().encode(text, true);
    for (size_t i = 0; i < starts.size(); ++i) {
      EXPECT_EQ(set.windows[i], (CalibrationWindow{-1, starts[i]})) << "seed " << seed << " window " << i;
      for (int64_t j = 0; j < 64; ++j)
        ASSERT_EQ(set.tokens[i * 64 + static_cast<size_t>(j)], stream[static_cast<size_t>(starts[i] + j)]);
    }
  }
  // gzip-compressed text gives the same windows.
  EXPECT_EQ(load(write_gz("corpus.txt.gz", text), 10, 64, 0).tokens, load(path, 10, 64, 0).tokens);
}

TEST_F(CalibrationTest, TextOfExactlyTPlusOneTokensHasOneWindowPosition) {
  const auto set = load(write("short.txt", std::string(200, 'q')), 4, 200, 1);
  EXPECT_EQ(set.windows, windows({{-1, 0}, {-1, 0}, {-1, 0}, {-1, 0}}));
  EXPECT_EQ(set.tokens[0], 1);
  EXPECT_EQ(set.tokens[200], 1);
  EXPECT_EQ(set.tokens[399], 'q' + 3);
}

TEST_F(CalibrationTest, TokenFileU16MatchesPythonRandintStarts) {
  std::string bytes;
  std::vector<int32_t> ids;
  for (int i = 0; i < 1000; ++i) {
    const int id = (i * 7) % 259;
    ids.push_back(id);
    bytes += static_cast<char>(id & 0xff);
    bytes += static_cast<char>(id >> 8);
  }
  // No BOS added: L = 1000. random.seed(3); [random.randint(0, 1000-100-1) for _ in range(6)]
  const auto set = load(write("tok.bin", bytes), 6, 100, 3);
  EXPECT_EQ(set.format, "tokens-u16");
  EXPECT_EQ(set.stream_tokens, 1000);
  const std::vector<int64_t> starts = {243, 606, 557, 133, 378, 618};
  for (size_t i = 0; i < starts.size(); ++i) {
    EXPECT_EQ(set.windows[i].start, starts[i]);
    EXPECT_EQ(set.windows[i].doc, -1);
    for (size_t j = 0; j < 100; ++j)
      ASSERT_EQ(set.tokens[i * 100 + j], ids[static_cast<size_t>(starts[i]) + j]);
  }
}

TEST_F(CalibrationTest, TokenFileU32WithLargeVocabulary) {
  std::string bytes;
  std::vector<int32_t> ids;
  for (int i = 0; i < 70000; ++i) {
    const uint32_t id = static_cast<uint32_t>((static_cast<int64_t>(i) * 7919) % 100000);
    ids.push_back(static_cast<int32_t>(id));
    for (int b = 0; b < 4; ++b) bytes += static_cast<char>((id >> (8 * b)) & 0xff);
  }
  const auto path = write("tok32.bin", bytes);
  // random.seed(11); [random.randint(0, 70000-1000-1) for _ in range(5)]
  const auto set = load(path, 5, 1000, 11, "tokens-u32", 100000);
  EXPECT_EQ(set.format, "tokens-u32");
  const std::vector<int64_t> starts = {59294, 61033, 59222, 66563, 24890};
  for (size_t i = 0; i < starts.size(); ++i) {
    EXPECT_EQ(set.windows[i].start, starts[i]);
    for (size_t j = 0; j < 1000; ++j)
      ASSERT_EQ(set.tokens[i * 1000 + j], ids[static_cast<size_t>(starts[i]) + j]);
  }
  // auto on .bin refuses to guess the width for a vocabulary beyond uint16.
  EXPECT_EQ(error_of(path, 5, 1000, "auto", 100000),
            path.string() +
                ": the id width of a .bin token file is ambiguous for a vocabulary of 100000 ids "
                "(more than uint16 holds); give the format explicitly: tokens-u32 (or tokens-u16)");
}

TEST_F(CalibrationTest, FormatResolution) {
  EXPECT_EQ(resolve_calibration_format("a/C4.JSONL.GZ", "auto", 32000), "jsonl");
  EXPECT_EQ(resolve_calibration_format("x.json", "auto", 32000), "jsonl");
  EXPECT_EQ(resolve_calibration_format("x.bin", "auto", 65536), "tokens-u16");
  EXPECT_EQ(resolve_calibration_format("x.txt", "auto", 32000), "text");
  EXPECT_EQ(resolve_calibration_format("x.txt.gz", "auto", 32000), "text");
  EXPECT_EQ(resolve_calibration_format("x.bin", "text", 200000), "text");
  try {
    resolve_calibration_format("x.txt", "csv", 100);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_STREQ(
        e.what(),
        "x.txt: unknown calibration format 'csv' (expected auto, jsonl, text, tokens-u16 or tokens-u32)");
  }
}

TEST_F(CalibrationTest, FingerprintIsFnv1aOfLittleEndianInt32) {
  EXPECT_EQ(tokens_fingerprint({}), "cbf29ce484222325");
  // FNV-1a 64 of bytes 01 00 00 00 (computed in Python).
  EXPECT_EQ(tokens_fingerprint({1}), "ad2aca7747985764");
}

// ---- errors ----

TEST_F(CalibrationTest, MissingDirectoryAndEmptyFiles) {
  const fs::path missing = dir_ / "nope.jsonl";
  EXPECT_EQ(error_of(missing, 1, 4), missing.string() + ": calibration file not found");
  EXPECT_EQ(error_of(dir_, 1, 4, "text"), dir_.string() + ": calibration file is a directory, not a file");
  EXPECT_EQ(error_of("/dev/null", 1, 4, "text"), "/dev/null: calibration file is a character device");
  for (const char* name : {"e.jsonl", "e.txt", "e.bin"}) {
    const auto path = write(name, "");
    EXPECT_EQ(error_of(path, 1, 4), path.string() + ": calibration file is empty");
  }
  const auto gz_empty = write_gz("empty.txt.gz", "");
  EXPECT_EQ(error_of(gz_empty, 1, 4), gz_empty.string() + ": calibration file is empty");
  const auto blank = write("blank.jsonl", "\n  \n\n");
  EXPECT_EQ(error_of(blank, 1, 4), blank.string() + ": no documents (every line is blank)");
}

// UTF-16, Latin-1, NUL bytes: refused with the file, the offset of the first bad byte and a hint, instead
// of being tokenized into garbage windows.
TEST_F(CalibrationTest, TextThatIsNotUtf8IsRefused) {
  const auto utf16 = write("u16.txt", "\xFF\xFEO\0n\0c\0e\0"s);
  EXPECT_THAT(error_of(utf16, 1, 2),
              HasSubstr(utf16.string() + ": calibration file is not UTF-8 text: invalid byte 0xFF at "
                                         "offset 0; it looks like UTF-16 (BOM FF FE)"));
  const auto nul = write("nul.txt", "abc\0def"s);
  EXPECT_THAT(error_of(nul, 1, 2),
              HasSubstr(nul.string() + ": calibration file is not text: NUL byte at offset 3"));
  const auto gz = write_gz("g.txt.gz", "ok \xFF");
  EXPECT_THAT(error_of(gz, 1, 2),
              HasSubstr(gz.string() + ": calibration file (after gzip decompression) is not UTF-8 text: "
                                      "invalid byte 0xFF at offset 3"));
  // JSONL: raw lines are checked with their offset in the file, decoded "text" fields for \u0000.
  const auto line = write("l.jsonl", "{\"text\":\"abc\"}\n{\"text\":\"caf\xE9\"}\n");
  EXPECT_THAT(error_of(line, 1, 2),
              HasSubstr(line.string() + ": calibration file (line 2) is not UTF-8 text: invalid byte 0xE9 at "
                                        "offset 27; it looks like Latin-1"));
  const auto gz_line = write_gz("l.jsonl.gz", "{\"text\":\"caf\xE9\"}\n");
  EXPECT_THAT(error_of(gz_line, 1, 2),
              HasSubstr(": calibration file (line 1, after gzip decompression) is not UTF-8 text"));
  // The hint converts the decompressed content, and its copy keeps the extensions that select the format.
  EXPECT_THAT(error_of(gz_line, 1, 2),
              HasSubstr("convert it with: zcat " + gz_line.string() +
                        " | iconv -f WINDOWS-1252 -t UTF-8 | gzip > " + (dir_ / "l.utf8.jsonl.gz").string()));
  EXPECT_THAT(error_of(line, 1, 2), HasSubstr(" > " + (dir_ / "l.utf8.jsonl").string()));
  const auto escaped = write("e.jsonl", "{\"text\":\"abcdef\"}\n{\"text\":\"a\\u0000b\"}\n");
  EXPECT_THAT(error_of(escaped, 1, 2),
              HasSubstr(escaped.string() + ": calibration file (line 2, \"text\" field) is not text: "
                                           "NUL byte at offset 1"));
  const auto utf16_jsonl = write("u16.jsonl", "\xFF\xFE{\0\"\0"s);
  EXPECT_THAT(error_of(utf16_jsonl, 1, 2),
              HasSubstr("it looks like UTF-16 (BOM FF FE); convert it with: iconv"));
}

// A text file named .bin used to be read as uint16 ids; with a LLaMA-sized vocabulary most pairs of
// ASCII letters are valid ids, so nothing else caught it. The content decides; forced formats are obeyed.
TEST_F(CalibrationTest, TextNamedBinIsNotReadAsTokenIds) {
  std::string text;
  while (text.size() < 2000)
    text += "Once upon a time, there was a little girl named Lily. She loved to play.\n";
  if (text.size() % 2) text += " ";
  const auto bin = write("story.bin", text);
  EXPECT_EQ(
      error_of(bin, 1, 8, "auto", 32000),
      bin.string() +
          ": the .bin file holds text, not uint16 token ids (its bytes are printable UTF-8); give "
          "--calib-format text to tokenize it as text, or --calib-format tokens-u16 to read it as token "
          "ids anyway");
  EXPECT_EQ(load(bin, 1, 8, 0, "tokens-u16", 32000).format, "tokens-u16");
  EXPECT_EQ(load(bin, 1, 8, 0, "text").format, "text");
}

TEST_F(CalibrationTest, BadJsonLinesNameTheLine) {
  const auto bad = write("bad.jsonl", "{\"text\":\"abc\"}\n\n{\"text\": \"x\",,}\n");
  EXPECT_EQ(error_of(bad, 1, 2).rfind(bad.string() + " line 3: invalid JSON: ", 0), 0u)
      << error_of(bad, 1, 2);
  // A long document with an error at its end: the message quotes the end of what was read, not all of it.
  const auto long_line = write("long.jsonl", "{\"text\": \"" + std::string(100000, 'a') + "\" oops}\n");
  const std::string message = error_of(long_line, 1, 2);
  EXPECT_LT(message.size(), 400u) << message.substr(0, 400);
  EXPECT_THAT(message, HasSubstr("last read: '...aaaa"));
  const auto no_text = write("notext.jsonl", "{\"text\":\"abc\"}\n{\"content\":\"abc\"}\n");
  EXPECT_EQ(error_of(no_text, 1, 2), no_text.string() + " line 2: no \"text\" field");
  const auto not_string = write("num.jsonl", "{\"text\":12}\n");
  EXPECT_EQ(error_of(not_string, 1, 2), not_string.string() + " line 1: \"text\" is not a string");
  const auto not_object = write("arr.jsonl", "{\"text\":\"abc\"}\n[\"abc\"]\n");
  EXPECT_EQ(error_of(not_object, 1, 2),
            not_object.string() + " line 2: expected a JSON object with a \"text\" field");
  const auto deep = write("deep.jsonl", std::string(100, '[') + std::string(100, ']') + "\n");
  EXPECT_EQ(error_of(deep, 1, 2), deep.string() + " line 1: invalid JSON: nesting deeper than 64 levels");
}

TEST_F(CalibrationTest, NoDocumentLongEnoughFailsInsteadOfLooping) {
  const auto path = write("short.jsonl", jsonl_of({"abc", "abcdefg", "", "abcd"}));
  // Longest: "abcdefg" = 7 bytes + BOS = 8 tokens.
  EXPECT_EQ(error_of(path, 4, 8),
            "no document in " + path.string() +
                " has more than T=8 tokens (the longest of its 4 documents has 8, BOS included); at most "
                "--seqlen 7 would fit");
  // With T=6 only document 1 (8 tokens) qualifies; for seed 2 the third window's draws visit the last
  // untokenized document, which runs the "does any document fit" check mid-stream without disturbing the
  // draws. python: [(1, 1), (1, 0), (1, 1), (1, 0)].
  EXPECT_EQ(load(path, 4, 6, 2).windows, windows({{1, 1}, {1, 0}, {1, 1}, {1, 0}}));
  EXPECT_EQ(load(path, 4, 7, 0).windows, windows({{1, 0}, {1, 0}, {1, 0}, {1, 0}}));
}

TEST_F(CalibrationTest, StreamTooShortSaysWhatFits) {
  const auto text = write("small.txt", std::string(299, 'z'));  // 300 tokens with BOS
  EXPECT_EQ(error_of(text, 4, 512),
            text.string() +
                ": 300 tokens; a window of T=512 needs at least T+1 = 513 tokens, so no window fits; "
                "at most --seqlen 299 would fit");
  EXPECT_EQ(error_of(text, 4, 300),
            text.string() +
                ": 300 tokens; a window of T=300 needs at least T+1 = 301 tokens, so no window fits; "
                "at most --seqlen 299 would fit");
  EXPECT_NO_THROW(load(text, 4, 299, 0));
  const auto one = write("one.bin", std::string("\x05\x00", 2));
  EXPECT_EQ(error_of(one, 1, 4), one.string() +
                                     ": 1 tokens; a window of T=4 needs at least T+1 = 5 tokens, so no "
                                     "window fits");
}

TEST_F(CalibrationTest, TokenFileErrors) {
  const auto odd = write("odd.bin", std::string(1001, '\0'));
  EXPECT_EQ(error_of(odd, 1, 4),
            odd.string() + ": 1001 bytes is not a whole number of uint16 tokens (2 bytes each)");
  const auto u32 = write("six.bin", std::string(6, '\0'));
  EXPECT_EQ(error_of(u32, 1, 4, "tokens-u32"),
            u32.string() + ": 6 bytes is not a whole number of uint32 tokens (4 bytes each)");
  // Ids 0, 1, 259 (little-endian u16 0x0103): 259 is outside a 259-id vocabulary.
  const auto big = write("big.bin", std::string("\x00\x00\x01\x00\x03\x01", 6));
  EXPECT_EQ(error_of(big, 1, 1),
            big.string() + ": token id 259 at position 2 is outside the vocabulary (size 259)");
  const auto huge = write("huge.bin", std::string("\xff\xff\xff\xff", 4));
  EXPECT_EQ(error_of(huge, 1, 1, "tokens-u32", 100000),
            huge.string() + ": token id 4294967295 at position 0 is outside the vocabulary (size 100000)");
}

TEST_F(CalibrationTest, TokenizerIdsBeyondTheModelVocabulary) {
  // 'z' + 3 = 125: outside a model vocabulary of 100.
  const auto text = write("t.txt", std::string(50, 'z'));
  EXPECT_EQ(error_of(text, 1, 8, "auto", 100),
            text.string() + ": the tokenizer produced id 125, outside the model's vocabulary (size 100)");
  const auto jsonl = write("t.jsonl", jsonl_of({std::string(50, 'z')}));
  EXPECT_EQ(error_of(jsonl, 1, 8, "auto", 100),
            jsonl.string() + ": the tokenizer produced id 125, outside the model's vocabulary (size 100)");
}

TEST_F(CalibrationTest, BadCountsAndCorruptGzip) {
  const auto text = write("t.txt", std::string(50, 'z'));
  EXPECT_EQ(error_of(text, 0, 8), "--nsamples must be at least 1, got 0");
  EXPECT_EQ(error_of(text, 2, 0), "--seqlen must be at least 1, got 0");
  EXPECT_EQ(error_of(text, int64_t{1} << 20, int64_t{1} << 20),
            text.string() +
                ": --nsamples 1048576 × --seqlen 1048576 is more than the 2147483648 calibration "
                "tokens supported");
  // A gzip stream cut in half.
  const auto gz = write_gz("full.jsonl.gz", jsonl_of(synthetic_docs()));
  std::ifstream in(gz, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto cut = write("cut.jsonl.gz", bytes.substr(0, bytes.size() / 2));
  EXPECT_EQ(error_of(cut, 1, 4),
            cut.string() +
                ": the gzip data is truncated or corrupt (unexpected end of file): copy or download "
                "the file again");
}

}  // namespace
}  // namespace symprune::io
