// The shared input-file reader: what is refused (missing, directories, devices, bytes that are not UTF-8
// text) with which message and hint, and what is read in full although its size says otherwise (/proc,
// pipes).
#include "io/text_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "support/test_support.h"

namespace symprune::io {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using namespace std::string_literals;

class TextFileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = symprune::testing::make_temp_dir("symprune_text_"); }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path write(const std::string& name, const std::string& bytes) {
    return symprune::testing::write_file(dir_ / name, bytes);
  }
  // The message read_text_file throws for a file holding `bytes`.
  std::string error_of(const std::string& bytes) {
    const fs::path path = write("t.txt", bytes);
    try {
      read_text_file(path, "text file (--text)");
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "no error";
    return {};
  }
  fs::path dir_;
};

TEST_F(TextFileTest, Utf8TextIsReadUnchanged) {
  const std::string text =
      "Once upon a time \xF0\x9F\x98\x80 caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC\r\n\t end"s;
  EXPECT_EQ(read_text_file(write("ok.txt", text), "text"), text);
  EXPECT_EQ(read_text_file(write("empty.txt", ""), "text"), "");
  // A UTF-8 byte order mark is valid UTF-8.
  EXPECT_EQ(read_text_file(write("bom.txt", "\xEF\xBB\xBFhi"), "text"), "\xEF\xBB\xBFhi");
  // U+10FFFF is the last code point; U+FFFF and U+E000 are allowed.
  EXPECT_NO_THROW(check_text("\xF4\x8F\xBF\xBF \xEF\xBF\xBF \xEE\x80\x80", "x", "text"));
}

TEST_F(TextFileTest, MalformedUtf8IsRefusedAtItsOffset) {
  const std::pair<std::string, size_t> cases[] = {
      {"ab\xC0\x80", 2},           // overlong NUL
      {"ab\xE0\x80\xAF", 2},       // overlong '/'
      {"a\xED\xA0\x80", 1},        // surrogate D800
      {"a\xF4\x90\x80\x80", 1},    // past U+10FFFF
      {"abc\xF8\x88\x80\x80", 3},  // 5-byte form
      {"abc\xE2\x82", 3},          // truncated at the end
      {"a\x80", 1},                // lone continuation byte
      {"\xC3(", 0},                // continuation missing
  };
  for (const auto& [bytes, offset] : cases) {
    SCOPED_TRACE(offset);
    EXPECT_THAT(error_of(bytes), HasSubstr("t.txt: text file (--text) is not UTF-8 text: invalid byte 0x"));
    EXPECT_THAT(error_of(bytes), HasSubstr("at offset " + std::to_string(offset) + ";"));
  }
  // Offsets count from base_offset (text taken from inside a file).
  try {
    check_text("ok\xFF", "/d/c.jsonl", "calibration file (line 3)", 1000);
    FAIL();
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("/d/c.jsonl: calibration file (line 3) is not UTF-8 text: invalid byte "
                                    "0xFF at offset 1002"));
  }
}

TEST_F(TextFileTest, HintsSayWhatTheBytesAre) {
  const std::string path = (dir_ / "t.txt").string();
  EXPECT_THAT(error_of("\xFF\xFEH\0i\0"s),
              HasSubstr("invalid byte 0xFF at offset 0; it looks like UTF-16 (BOM FF FE); convert it with: "
                        "iconv -f UTF-16 -t UTF-8 " +
                        path + " > " + (dir_ / "t.utf8.txt").string()));
  EXPECT_THAT(error_of("\xFE\xFF\0H\0i"s), HasSubstr("it looks like UTF-16 (BOM FE FF)"));
  EXPECT_THAT(error_of("\xFF\xFE\0\0H\0\0\0"s), HasSubstr("it looks like UTF-32 (BOM FF FE 00 00)"));
  EXPECT_THAT(
      error_of("H\0e\0l\0l\0o\0"s),
      HasSubstr("is not text: NUL byte at offset 1; it looks like UTF-16LE without a byte order mark; "
                "convert it with: iconv -f UTF-16LE -t UTF-8"));
  EXPECT_THAT(error_of("\0H\0e\0l\0l\0o"s),
              HasSubstr("NUL byte at offset 0; it looks like UTF-16BE without a byte order mark"));
  EXPECT_THAT(error_of("\x1F\x8B\x08\0\0\0"s),
              HasSubstr("it looks gzip-compressed; decompress it first: gunzip -k"));
  EXPECT_THAT(
      error_of("caf\xE9 au lait, na\xEFve"),
      HasSubstr("invalid byte 0xE9 at offset 3; it looks like Latin-1 or Windows-1252 text; convert it "
                "with: iconv -f WINDOWS-1252 -t UTF-8"));
  EXPECT_THAT(error_of(std::string(64, '\0')),
              HasSubstr("NUL byte at offset 0; text never holds NUL bytes: it looks like a binary file"));
  EXPECT_THAT(error_of("a long enough line of text then padding\0\0\0\0"s),
              HasSubstr("NUL byte at offset 39; text never holds NUL bytes: it looks like a binary file (or "
                        "text padded with NUL bytes)"));
  EXPECT_THAT(error_of("\x7F"
                       "ELF\x02\x01\x01\xFF\xFF\x03\x04"),
              HasSubstr("it looks like a binary file"));
}

TEST_F(TextFileTest, FilesThatAreNotFilesSayWhatTheyAre) {
  const auto error = [&](const fs::path& path) {
    try {
      read_text_file(path, "evaluation text (--eval)");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "no error for " << path;
    return std::string();
  };
  EXPECT_EQ(error(dir_ / "absent.txt"),
            (dir_ / "absent.txt").string() + ": evaluation text (--eval) not found");
  EXPECT_EQ(error(dir_), dir_.string() + ": evaluation text (--eval) is a directory, not a file");
  EXPECT_EQ(error("/dev/null"), "/dev/null: evaluation text (--eval) is a character device");
  // /proc/self/mem opens but reading address 0 fails: the error names the file and the reason.
  EXPECT_THAT(error("/proc/self/mem"), HasSubstr("/proc/self/mem: cannot read evaluation text (--eval): "));
  EXPECT_THROW(check_input_file(dir_ / "absent.txt", "x"), Error);
  EXPECT_NO_THROW(check_input_file(write("a.txt", "a"), "x"));
}

// /proc files report st_size 0 but have content: read to EOF, not by size.
TEST_F(TextFileTest, ProcFilesAreReadToTheEnd) {
  ASSERT_EQ(fs::file_size("/proc/self/status"), 0u);
  const std::string text = read_text_file("/proc/self/status", "text");
  EXPECT_THAT(text, HasSubstr("Name:"));
  EXPECT_THAT(text, HasSubstr("Pid:"));
  EXPECT_GT(text.size(), 100u);
}

TEST_F(TextFileTest, PipesAreReadToTheEnd) {
  const fs::path fifo = dir_ / "pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const std::string payload(3 << 20, 'p');  // more than one read chunk
  std::thread writer([&] {
    std::ofstream out(fifo, std::ios::binary);
    out << payload;
  });
  const std::string text = read_text_file(fifo, "text");
  writer.join();
  EXPECT_EQ(text, payload);
}

TEST_F(TextFileTest, LooksLikeText) {
  EXPECT_TRUE(looks_like_text("Once upon a time, there was a little girl.\nShe liked cats.\n"));
  EXPECT_TRUE(looks_like_text("Grüße aus Köln, 日本語 \xF0\x9F\x98\x80\n"));
  EXPECT_FALSE(looks_like_text(""));
  EXPECT_FALSE(looks_like_text("text\0more"s));
  EXPECT_FALSE(looks_like_text("caf\xE9 au lait"));
  // A character cut by the end of the data (a file cut short) is still text; a broken one is not.
  EXPECT_TRUE(looks_like_text("Once upon a time, said the caf\xC3"));
  EXPECT_TRUE(looks_like_text("Once upon a time, said the emoji \xF0\x9F\x98"));
  EXPECT_FALSE(looks_like_text("Once upon a time, said the caf\xC3("));
  EXPECT_FALSE(looks_like_text("Once upon a time, said the caf\xFF"));
  EXPECT_FALSE(looks_like_text("\x01\x02\x03\x04\x05\x06 mostly control bytes"));
  // uint16 token ids of a small and of a LLaMA-sized vocabulary, as a pretokenized .bin holds them.
  std::string small, large;
  uint32_t state = 12345;
  for (int i = 0; i < 4000; ++i) {
    state = state * 1103515245u + 12345u;
    const uint16_t a = static_cast<uint16_t>((state >> 8) % 512),
                   b = static_cast<uint16_t>((state >> 4) % 32000);
    small.push_back(static_cast<char>(a & 0xFF));
    small.push_back(static_cast<char>(a >> 8));
    large.push_back(static_cast<char>(b & 0xFF));
    large.push_back(static_cast<char>(b >> 8));
  }
  EXPECT_FALSE(looks_like_text(small));
  EXPECT_FALSE(looks_like_text(large));
}

// Error messages quote what a file holds (a parse error names the bad character): printed as \xNN unless
// it is valid UTF-8, so a binary file's bytes never reach the terminal raw.
TEST(PrintableMessage, KeepsUtf8AndEscapesEverythingElse) {
  EXPECT_EQ(printable_message("plain\ttext\nnext line"), "plain\ttext\nnext line");
  EXPECT_EQ(printable_message("caf\xC3\xA9 \xE2\x96\x81 \xF0\x9F\x99\x82"),
            "caf\xC3\xA9 \xE2\x96\x81 \xF0\x9F\x99\x82");
  EXPECT_EQ(printable_message("unknown escape character: \xDA"), "unknown escape character: \\xDA");
  EXPECT_EQ(printable_message(std::string("a\0b\x1B[2Jc\x7F", 9)), "a\\x00b\\x1B[2Jc\\x7F");
  // Overlong forms, surrogates, code points past U+10FFFF and cut-off sequences are not UTF-8.
  EXPECT_EQ(printable_message("\xC0\xAF"), "\\xC0\\xAF");
  EXPECT_EQ(printable_message("\xED\xA0\x80"), "\\xED\\xA0\\x80");
  EXPECT_EQ(printable_message("\xF4\x90\x80\x80"), "\\xF4\\x90\\x80\\x80");
  EXPECT_EQ(printable_message("end \xE2\x96"), "end \\xE2\\x96");
  // C1 controls (U+009B starts an escape sequence on some terminals) and bidirectional overrides, though
  // valid UTF-8, act on the terminal: escaped too. Their neighbours are plain characters.
  EXPECT_EQ(printable_message("a\xC2\x9B"
                              "2Jb"),
            "a\\xC2\\x9B2Jb");
  EXPECT_EQ(printable_message("x\xE2\x80\xAEy\xE2\x81\xA6z"), "x\\xE2\\x80\\xAEy\\xE2\\x81\\xA6z");
  EXPECT_EQ(printable_message("\xC2\xA0\xE2\x80\xA9\xE2\x81\xAA"), "\xC2\xA0\xE2\x80\xA9\xE2\x81\xAA");
}

}  // namespace
}  // namespace symprune::io
