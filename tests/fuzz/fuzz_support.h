#pragma once
// Shared pieces of the libFuzzer harnesses (tests/fuzz/fuzz_*.cc).
//
// A harness turns the fuzzer's bytes into one or more input files, calls the parser, and lets only
// symprune::Error (an expected rejection of bad input) pass: any other exception escapes
// LLVMFuzzerTestOneInput and aborts, which libFuzzer reports as a crash, as it does sanitizer reports,
// leaks, timeouts and out-of-memory. The same harness, linked with regression_main.cc instead of
// libFuzzer, replays tests/fuzz/regressions/<target>/ in the normal build (ctest fuzz_regression.*).
//
// The parsers take paths, so inputs are written into a scratch directory created once per process
// (each libFuzzer worker has its own) and emptied before every input, so nothing of one input can
// leak into the next (e.g. a stale shard file).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "core/error.h"
#include "io/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace symprune::fuzz {

namespace detail {

class ScratchRoot {
 public:
  ScratchRoot() {
    std::error_code ec;
    std::filesystem::path base = std::filesystem::temp_directory_path(ec);
    if (ec) base = "/tmp";
    std::string pattern = (base / "symprune-fuzz-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("symprune fuzz: mkdtemp");
      std::abort();  // harness setup, not a finding in the code under test
    }
    path_ = pattern;
  }
  ~ScratchRoot() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_bytes(const std::filesystem::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) {
    std::fprintf(stderr, "symprune fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
}

}  // namespace detail

// An empty directory `<scratch>/<name>`, emptied again on every call.
inline std::filesystem::path fresh_dir(const std::string& name = "in") {
  static detail::ScratchRoot root;
  const std::filesystem::path dir = root.path() / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// Writes `bytes` to dir/file_name and returns the path.
inline std::filesystem::path write_file(const std::filesystem::path& dir, const std::string& file_name,
                                        std::string_view bytes) {
  const std::filesystem::path path = dir / file_name;
  detail::write_bytes(path, bytes);
  return path;
}

inline std::string_view as_view(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Text formats that come in pairs (vocab.json + merges.txt): split at the first NUL byte, which
// neither text holds; without one, the second part is empty.
inline std::pair<std::string_view, std::string_view> split_at_nul(std::string_view input) {
  const size_t nul = input.find('\0');
  if (nul == std::string_view::npos) return {input, {}};
  return {input.substr(0, nul), input.substr(nul + 1)};
}

// Binary formats in several files (an index + shards): parts separated by this marker, which real
// files do not contain (scripts/fuzz.sh builds seeds with it).
inline constexpr std::string_view kPartSeparator = "\n--symprune-fuzz-part--\n";

inline std::vector<std::string_view> split_parts(std::string_view input) {
  std::vector<std::string_view> parts;
  while (true) {
    const size_t at = input.find(kPartSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(input.substr(0, at));
    input.remove_prefix(at + kPartSeparator.size());
  }
  parts.push_back(input);
  return parts;
}

// Runs `body`; symprune::Error is the expected answer to bad input, everything else escapes.
template <typename Body>
int run_expecting_only_errors(Body&& body) {
  try {
    body();
  } catch (const symprune::Error&) {
  }
  return 0;
}

// A property of a successful parse that does not hold: a bug, reported as a crash.
[[noreturn]] inline void violated(const char* what, const std::string& detail = {}) {
  std::fprintf(stderr, "symprune fuzz: property violated: %s %s\n", what, detail.c_str());
  std::abort();
}

// After a tokenizer loads, its encoder and decoder run too, so the fuzzer reaches them. Ids that
// encode() produced must lie inside the vocabulary and decode() must accept them.
inline void exercise_tokenizer(const io::Tokenizer& tokenizer) {
  static constexpr std::string_view kText =
      "Hello, world! Once upon a time 12345 <s></s> <|endoftext|>\n\t  caf\xc3\xa9 "
      "\xe4\xb8\xad\xf0\x9f\x98\x80 e\xcc\x81 ";  // e + U+0301: an NFC normalizer composes it
  const int64_t vocab = tokenizer.vocab_size();
  if (vocab <= 0) violated("vocab_size() of a loaded tokenizer is not positive");
  for (const bool add_bos : {false, true}) {
    const std::vector<int32_t> ids = tokenizer.encode(kText, add_bos);
    for (const int32_t id : ids)
      if (id < 0 || id >= vocab)
        violated("encode() produced an id outside [0, vocab_size)", std::to_string(id));
    try {
      (void)tokenizer.decode(ids);
    } catch (const symprune::Error& e) {
      violated("decode() rejected ids that encode() produced:", e.what());
    }
  }
  (void)tokenizer.encode("", true);
  // Decoding arbitrary in-range ids (bytes, specials, the last id) must work as well.
  std::vector<int32_t> some;
  for (int64_t id = 0; id < vocab && id < 300; ++id) some.push_back(static_cast<int32_t>(id));
  some.push_back(static_cast<int32_t>(vocab - 1));
  (void)tokenizer.decode(some);
}

}  // namespace symprune::fuzz
