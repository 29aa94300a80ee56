#pragma once
// Shared by the calibration reader harnesses: a 4-byte prefix of the input picks the request
// (nsamples, seqlen, seed, flags) and the rest is the file. The tokenizer is a trivial byte tokenizer,
// so the fuzzer's time goes into the readers and the samplers, not into a real tokenizer.
#include <array>
#include <string>

#include "fuzz_support.h"
#include "io/calibration.h"

namespace symprune::fuzz {

class ByteTokenizer final : public io::Tokenizer {
 public:
  static constexpr int32_t kOffset = 3;  // 0..2: unk, BOS, EOS; then the 256 bytes
  std::vector<int32_t> encode(std::string_view text, bool add_bos) const override {
    std::vector<int32_t> ids;
    if (add_bos) ids.push_back(1);
    for (const char c : text) ids.push_back(static_cast<unsigned char>(c) + kOffset);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (const int32_t id : ids)
      if (id >= kOffset) out.push_back(static_cast<char>(id - kOffset));
    return out;
  }
  std::optional<int32_t> bos_id() const override { return 1; }
  std::optional<int32_t> eos_id() const override { return 2; }
  int64_t vocab_size() const override { return 256 + kOffset; }
  std::string kind() const override { return "bytes"; }
};

struct CalibrationRequest {
  io::CalibrationOptions options;
  int64_t vocab_size = 0;  // 0: the tokenizer's
  unsigned flags = 0;
  std::string_view file;
};

// Prefix: nsamples = 1 + b0 % 16; seqlen = 1 + b1 % 64, or 1 << 20 when b1 == 255 (nothing fits);
// seed = b2; flags = b3 (bits 1-3 pick the model vocabulary, see kVocabSizes). Shorter input: defaults.
inline CalibrationRequest parse_calibration_request(const uint8_t* data, size_t size) {
  static constexpr std::array<int64_t, 8> kVocabSizes = {0, 100, 259, 512, 32000, 65536, 65537, 128256};
  CalibrationRequest r;
  r.options.nsamples = 2;
  r.options.seqlen = 8;
  if (size >= 4) {
    r.options.nsamples = 1 + data[0] % 16;
    r.options.seqlen = data[1] == 255 ? int64_t{1} << 20 : 1 + data[1] % 64;
    r.options.seed = data[2];
    r.flags = data[3];
    r.vocab_size = kVocabSizes[(r.flags >> 1) & 7];
    r.file = as_view(data + 4, size - 4);
  } else {
    r.file = as_view(data, size);
  }
  return r;
}

inline void check_calibration_result(const io::CalibrationSet& set, const CalibrationRequest& r,
                                     int64_t vocab_size) {
  const auto n = r.options.nsamples, t = r.options.seqlen;
  if (set.nsamples != n || set.seqlen != t || static_cast<int64_t>(set.tokens.size()) != n * t ||
      static_cast<int64_t>(set.windows.size()) != n)
    violated("calibration set has the wrong size");
  for (const int32_t id : set.tokens)
    if (id < 0 || id >= vocab_size) violated("calibration token outside the vocabulary", std::to_string(id));
  if (set.fingerprint != io::tokens_fingerprint(set.tokens)) violated("fingerprint");
}

// Writes the file as `file_name`, loads it with `format` and checks the result.
inline void run_calibration(const uint8_t* data, size_t size, const std::string& file_name,
                            const std::string& format) {
  CalibrationRequest r = parse_calibration_request(data, size);
  const auto dir = fresh_dir();
  r.options.file = write_file(dir, file_name, r.file);
  r.options.format = format;
  const ByteTokenizer tokenizer;
  const io::CalibrationSet set = io::load_calibration(r.options, tokenizer, r.vocab_size);
  check_calibration_result(set, r, r.vocab_size > 0 ? r.vocab_size : tokenizer.vocab_size());
}

}  // namespace symprune::fuzz
