#include "io/text_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/error.h"
#include "core/interrupt.h"
#include "io/mapped_file.h"

namespace symprune::io {
namespace fs = std::filesystem;

namespace {

using namespace std::string_view_literals;

// Bytes looked at to guess what a file that is not UTF-8 text holds instead.
constexpr size_t kSniffBytes = 4096;

const char* file_kind(fs::file_type type) {
  switch (type) {
    case fs::file_type::character:
      return "a character device";
    case fs::file_type::block:
      return "a block device";
    case fs::file_type::socket:
      return "a socket";
    default:
      return "not a regular file";
  }
}

// Length of the well-formed UTF-8 sequence at text[i] (Unicode table 3-7), or 0 when there is none.
size_t utf8_length(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char c = byte(0);
  if (c < 0x80) return 1;
  size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    length = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    length = 3;
    if (c == 0xE0) low = 0xA0;   // overlong
    if (c == 0xED) high = 0x9F;  // surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    length = 4;
    if (c == 0xF0) low = 0x90;   // overlong
    if (c == 0xF4) high = 0x8F;  // past U+10FFFF
  } else {
    return 0;
  }
  if (text.size() - i < length || byte(1) < low || byte(1) > high) return 0;
  for (size_t k = 2; k < length; ++k)
    if ((byte(k) & 0xC0) != 0x80) return 0;
  return length;
}

// Whether `tail` (shorter than a character) is the start of a well-formed UTF-8 sequence.
bool is_utf8_prefix(std::string_view tail) {
  for (const char filler : {'\x80', '\x90', '\xA0', '\xB0'}) {
    std::string completed(tail);
    while (completed.size() < 4) completed.push_back(filler);
    if (utf8_length(completed, 0) > tail.size()) return true;
  }
  return false;
}

bool printable_ascii(unsigned char c) {
  return (c >= 0x20 && c < 0x7F) || c == '\t' || c == '\n' || c == '\r';
}

// What bytes that failed as UTF-8 text (at a NUL byte when `nul`) look like, with the command that
// fixes them.
std::string encoding_hint(std::string_view text, const fs::path& path, bool nul) {
  const std::string file = path.string();
  // The converted copy keeps the file's extensions (c4.jsonl.gz -> c4.utf8.jsonl.gz), which pick its format.
  const bool gz = path.extension() == ".gz";
  const fs::path inner = gz ? path.stem() : path.filename();
  const std::string converted =
      (path.parent_path() / inner.stem()).string() + ".utf8" + inner.extension().string() + (gz ? ".gz" : "");
  const auto convert = [&](std::string_view what, std::string_view from) {
    if (gz)
      return fmt::format("it looks like {}; convert it with: zcat {} | iconv -f {} -t UTF-8 | gzip > {}",
                         what, file, from, converted);
    return fmt::format("it looks like {}; convert it with: iconv -f {} -t UTF-8 {} > {}", what, from, file,
                       converted);
  };
  if (text.starts_with("\xFF\xFE\0\0"sv)) return convert("UTF-32 (BOM FF FE 00 00)", "UTF-32");
  if (text.starts_with("\0\0\xFE\xFF"sv)) return convert("UTF-32 (BOM 00 00 FE FF)", "UTF-32");
  if (text.starts_with("\xFF\xFE"sv)) return convert("UTF-16 (BOM FF FE)", "UTF-16");
  if (text.starts_with("\xFE\xFF"sv)) return convert("UTF-16 (BOM FE FF)", "UTF-16");
  if (text.starts_with("\x1F\x8B"sv))
    return fmt::format("it looks gzip-compressed; decompress it first: gunzip -k {}", file);
  const std::string_view sample = text.substr(0, kSniffBytes);
  size_t nul_even = 0, nul_odd = 0, ascii = 0, printable = 0;
  for (size_t i = 0; i < sample.size(); ++i) {
    const auto c = static_cast<unsigned char>(sample[i]);
    if (c == 0) ++(i % 2 ? nul_odd : nul_even);
    if (c < 0x80) ++ascii;
    if (printable_ascii(c)) ++printable;
  }
  // ASCII in UTF-16 without a BOM: every other byte is NUL.
  const size_t pairs = sample.size() / 2;
  if (pairs >= 2 && nul_odd * 2 > pairs && nul_even * 20 < pairs)
    return convert("UTF-16LE without a byte order mark", "UTF-16LE");
  if (pairs >= 2 && nul_even * 2 > pairs && nul_odd * 20 < pairs)
    return convert("UTF-16BE without a byte order mark", "UTF-16BE");
  if (nul) return "text never holds NUL bytes: it looks like a binary file (or text padded with NUL bytes)";
  // Single-byte European text: mostly ASCII, no control bytes, the high bytes are letters.
  if (ascii * 2 >= sample.size() && printable * 20 >= ascii * 19)
    return convert("Latin-1 or Windows-1252 text", "WINDOWS-1252");
  return "it looks like a binary file, not text";
}

}  // namespace

void wait_for_pipe_data(int fd) {
  pollfd waiting{fd, POLLIN, 0};
  while (true) {
    const int ready = ::poll(&waiting, 1, 100);
    if (ready > 0) return;                    // data, or the writer closed (POLLHUP): read() tells which
    if (ready < 0 && errno != EINTR) return;  // read() will name the error
    // received(), not check(): with several ranks local checks are off, and a rank whose FIFO has no writer
    // on its node would wait on. Every caller runs under agree_on_errors, which stops every rank alike.
    if (const int signal = interrupt::received()) throw interrupt::Interrupted(signal);
  }
}

void check_input_file(const fs::path& path, std::string_view what) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  SYMPRUNE_CHECK(status.type() != fs::file_type::not_found, "{}: {} not found", path.string(), what);
  SYMPRUNE_CHECK(!ec, "{}: cannot read {}: {}", path.string(), what, ec.message());
  SYMPRUNE_CHECK(!fs::is_directory(status), "{}: {} is a directory, not a file", path.string(), what);
  // Pipes are fine (process substitution: --eval <(zcat text.gz)); devices such as /dev/zero never end.
  SYMPRUNE_CHECK(fs::is_regular_file(status) || fs::is_fifo(status), "{}: {} is {}", path.string(), what,
                 file_kind(status.type()));
}

std::string read_input_file(const fs::path& path, std::string_view what) {
  check_input_file(path, what);
  const int fd = open_for_reading(path);  // a FIFO's open does not wait for a writer
  SYMPRUNE_CHECK(fd >= 0, "{}: cannot read {}: {}", path.string(), what, std::strerror(errno));
  const std::unique_ptr<const int, void (*)(const int*)> closer(&fd, [](const int* f) { ::close(*f); });
  std::string bytes;
  struct stat st {};
  const bool fstat_ok = ::fstat(fd, &st) == 0;
  if (fstat_ok && st.st_size > 0) bytes.reserve(static_cast<size_t>(st.st_size));
  const bool pipe = fstat_ok && S_ISFIFO(st.st_mode);
  // To EOF, not st_size: /proc and sysfs files report 0 bytes, pipes report nothing at all.
  constexpr size_t kChunk = size_t{1} << 20;
  while (true) {
    if (pipe) wait_for_pipe_data(fd);
    const size_t old = bytes.size();
    bytes.resize(old + kChunk);
    const ssize_t n = ::read(fd, bytes.data() + old, kChunk);
    bytes.resize(old + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n > 0) continue;
    if (n == 0) break;
    if (errno == EINTR) continue;
    fail("{}: cannot read {}: {}", path.string(), what, std::strerror(errno));
  }
  return bytes;
}

std::string read_text_file(const fs::path& path, std::string_view what) {
  std::string text = read_input_file(path, what);
  check_text(text, path, what);
  return text;
}

void check_text(std::string_view text, const fs::path& path, std::string_view what, uint64_t base_offset) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == 0) {
      fail("{}: {} is not text: NUL byte at offset {}; {}", path.string(), what, base_offset + i,
           encoding_hint(text, path, true));
    }
    if (c < 0x80) {
      ++i;
      continue;
    }
    const size_t length = utf8_length(text, i);
    if (length == 0) {
      fail("{}: {} is not UTF-8 text: invalid byte 0x{:02X} at offset {}; {}", path.string(), what, c,
           base_offset + i, encoding_hint(text, path, false));
    }
    i += length;
  }
}

// Characters that act on a terminal or on how it orders text: C0 controls but newline and tab, DEL, C1
// controls (U+0080..U+009F; U+009B starts an escape sequence on some terminals), bidirectional overrides and
// isolates (U+202A..U+202E, U+2066..U+2069).
static bool is_control_character(std::string_view character) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(character[k]); };
  if (character.size() == 1) return (byte(0) < 0x20 && byte(0) != '\n' && byte(0) != '\t') || byte(0) == 0x7F;
  if (character.size() == 2) return byte(0) == 0xC2 && byte(1) <= 0x9F;
  if (character.size() != 3 || byte(0) != 0xE2) return false;
  return (byte(1) == 0x80 && byte(2) >= 0xAA && byte(2) <= 0xAE) ||
         (byte(1) == 0x81 && byte(2) >= 0xA6 && byte(2) <= 0xA9);
}

std::string printable_message(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    const size_t length = utf8_length(text, i);
    if (length > 0 && !is_control_character(text.substr(i, length))) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      out += fmt::format("\\x{:02X}", c);
      ++i;
    }
  }
  return out;
}

nlohmann::json with_utf8_strings(const nlohmann::json& value) {
  const auto valid = [](const std::string& text) {
    return is_valid_utf8(text) ? text : printable_message(text);
  };
  if (value.is_string()) return valid(value.get_ref<const std::string&>());
  if (value.is_array()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& item : value) out.push_back(with_utf8_strings(item));
    return out;
  }
  if (value.is_object()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& [key, item] : value.items()) out[valid(key)] = with_utf8_strings(item);
    return out;
  }
  return value;
}

std::optional<size_t> first_invalid_utf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t length = utf8_length(text, i);
    if (length == 0) return i;
    i += length;
  }
  return std::nullopt;
}

bool is_valid_utf8(std::string_view text) {
  return !first_invalid_utf8(text).has_value();
}

bool looks_like_text(std::string_view bytes) {
  if (bytes.empty()) return false;
  size_t printable = 0;
  for (size_t i = 0; i < bytes.size();) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    if (c == 0) return false;
    if (c < 0x80) {
      printable += printable_ascii(c) ? 1 : 0;
      ++i;
      continue;
    }
    const size_t length = utf8_length(bytes, i);
    // A character cut by the end of the data (a sample, or a file cut short) does not make it binary.
    if (length == 0 && !(bytes.size() - i < 4 && is_utf8_prefix(bytes.substr(i)))) return false;
    const size_t step = length != 0 ? length : bytes.size() - i;
    printable += step;
    i += step;
  }
  return printable * 20 >= bytes.size() * 19;  // at least 95 %
}

std::string read_evaluation_text(const fs::path& path, std::string_view what) {
  std::string text = read_text_file(path, what);
  const size_t start = text.find_first_not_of(" \t\r\n\xEF\xBB\xBF");  // a byte order mark too
  if (start != std::string::npos && text[start] == '{') {
    const size_t end = text.find('\n', start);
    const auto first = nlohmann::json::parse(text.substr(start, end == std::string::npos ? end : end - start),
                                             nullptr, /*allow_exceptions=*/false);
    SYMPRUNE_CHECK(
        !(first.is_object() && first.contains("text") && first["text"].is_string()),
        "{}: {} is JSON lines (documents with a \"text\" field, as C4's), which would be scored as "
        "raw JSON, keys and URLs included; give plain text instead: Wanda's C4 evaluation scores the "
        "documents' texts joined by spaces, e.g. python3 -c \"import json, sys; print(' '.join("
        "json.loads(l)['text'] for l in sys.stdin))\" < {} > c4_text.txt",
        path.string(), what, path.string());
  }
  return text;
}

}  // namespace symprune::io
