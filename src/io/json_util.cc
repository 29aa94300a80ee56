#include "io/json_util.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <system_error>

#include "core/error.h"

namespace symprune::io {

std::string read_text_file(const std::filesystem::path& path, uint64_t max_bytes) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  SYMPRUNE_CHECK(!ec && std::filesystem::exists(status), "{}: file not found", path.string());
  SYMPRUNE_CHECK(std::filesystem::is_regular_file(status), "{}: not a regular file", path.string());
  const uint64_t size = std::filesystem::file_size(path, ec);
  SYMPRUNE_CHECK(!ec, "{}: cannot get the file size: {}", path.string(), ec.message());
  SYMPRUNE_CHECK(size <= max_bytes, "{}: file is {} bytes, more than the {} bytes accepted", path.string(),
                 size, max_bytes);
  std::ifstream in(path, std::ios::binary);
  SYMPRUNE_CHECK(in.good(), "{}: cannot open: {}", path.string(), std::strerror(errno));
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  SYMPRUNE_CHECK(static_cast<uint64_t>(in.gcount()) == size, "{}: short read ({} of {} bytes)", path.string(),
                 in.gcount(), size);
  return text;
}

namespace {

// nlohmann's parse errors quote everything read so far ("last read: '...'"), a whole document on a long line:
// keep the end of it, where the error is.
std::string clipped_parse_error(std::string message) {
  constexpr std::string_view kLastRead = "last read: '";
  constexpr size_t kKeep = 60;
  const size_t open = message.find(kLastRead);
  const size_t close = message.rfind('\'');
  if (open == std::string::npos || close == std::string::npos) return message;
  const size_t begin = open + kLastRead.size();
  if (close <= begin || close - begin <= kKeep) return message;
  return message.substr(0, begin) + "..." + message.substr(close - kKeep);
}

}  // namespace

nlohmann::json parse_json_text(std::string_view text, const std::string& source) {
  // Depth pre-scan (strings skipped, escapes honoured) so hostile nesting cannot overflow the stack.
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      SYMPRUNE_CHECK(++depth <= kMaxJsonDepth, "{}: invalid JSON: nesting deeper than {} levels", source,
                     kMaxJsonDepth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    fail("{}: invalid JSON: {}", source, clipped_parse_error(e.what()));
  }
}

nlohmann::json read_json_file(const std::filesystem::path& path, uint64_t max_bytes) {
  return parse_json_text(read_text_file(path, max_bytes), path.string());
}

}  // namespace symprune::io
