#pragma once
// Small helpers shared by the readers of JSON files (safetensors headers, config.json, shard
// indexes): bounded file reading and parsing that reports the file on every failure.
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace symprune::io {

// Deeper nesting is refused before parsing: the recursive parser would otherwise exhaust the stack
// on hostile input such as "[[[[...". Real model files nest at most a few levels.
inline constexpr int kMaxJsonDepth = 64;

// Reads a whole file, refusing files larger than `max_bytes`; errors name the path.
std::string read_text_file(const std::filesystem::path& path, uint64_t max_bytes);

// Parses `text`; errors name `source` (usually the file path) and the parser's message.
nlohmann::json parse_json_text(std::string_view text, const std::string& source);

// read_text_file + parse_json_text.
nlohmann::json read_json_file(const std::filesystem::path& path, uint64_t max_bytes = 64ull << 20);

}  // namespace symprune::io
