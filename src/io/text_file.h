#pragma once
// Input files read by the commands (calibration text, evaluation text, tokenize --text-file): checks
// that name the real problem (missing, a directory, a device), reading to EOF rather than by st_size
// (/proc files report 0 bytes), and the check that text really is text: UTF-8 without NUL bytes, with
// a hint at what the bytes are instead (UTF-16, gzip, Latin-1, binary).
#include <cstdint>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace symprune::io {

// Throws unless `path` exists and is a regular file or a pipe. `what` names the file's role in the
// message ("calibration file", "evaluation text (--eval)"): "<path>: <what> not found", "... is a directory".
void check_input_file(const std::filesystem::path& path, std::string_view what);

// Waits until the pipe `fd` has data or its writer has gone, checking for a signal (interrupt::received:
// Interrupted even where local checks are off) every 100 ms: a pipe nobody writes to (a FIFO whose writer has
// not started, or has stalled) is then stopped by SIGTERM like any other work, instead of holding the run in
// a blocking read. Before a writer connects, Linux reports no event, so this also waits for the writer (a
// read then would return end of file).
void wait_for_pipe_data(int fd);

// check_input_file, then every byte up to EOF; a pipe is read as it comes, through wait_for_pipe_data.
std::string read_input_file(const std::filesystem::path& path, std::string_view what);

// read_input_file, then check_text over the whole file.
std::string read_text_file(const std::filesystem::path& path, std::string_view what);

// read_text_file for a text to evaluate (perplexity): also refused when it is JSON lines with a "text"
// field (C4's documents), which would be scored as its raw JSON, keys and URLs included.
std::string read_evaluation_text(const std::filesystem::path& path, std::string_view what);

// Throws unless `text` is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF) without
// NUL bytes. The message names `path` and `what`, gives the offset of the first bad byte (plus
// `base_offset`, for text that starts inside the file) and says what the bytes look like instead.
void check_text(std::string_view text, const std::filesystem::path& path, std::string_view what,
                uint64_t base_offset = 0);

// Whether `text` is well-formed UTF-8 (NUL bytes allowed).
bool is_valid_utf8(std::string_view text);
// The offset of the first byte of `text` that does not begin a well-formed UTF-8 character, if any.
std::optional<size_t> first_invalid_utf8(std::string_view text);

// `text` safe to print on a terminal: valid UTF-8, newlines and tabs as they are; other control characters
// and bytes that are not UTF-8 (a binary file's bytes quoted in a parse error) as \xNN.
std::string printable_message(std::string_view text);

// `value` with every string and object key that is not well-formed UTF-8 made printable_message's (bytes as
// \xNN): JSON text holds UTF-8 only, and nlohmann::json::dump throws on anything else, so a path with a
// Latin-1 byte in a run's configuration failed the run when its report or provenance was written.
nlohmann::json with_utf8_strings(const nlohmann::json& value);

// Whether `bytes` read as text: valid UTF-8 without NUL and almost entirely printable characters or
// whitespace. Token-id files fail it (their ids' high bytes are small, so NUL and control bytes abound).
bool looks_like_text(std::string_view bytes);

}  // namespace symprune::io
