#pragma once
// Calibration windows: N sequences of T token ids drawn from a C4-style JSONL file, a plain text
// file or a pre-tokenized token file, with the reference tools' random choices (reference notes §1.2).
//
// Formats ("auto" picks by file name, case-insensitively):
//   jsonl       *.jsonl, *.json, *.jsonl.gz, *.json.gz: one JSON object per line with a string field
//               "text"; blank lines are skipped and are not documents. Reference C4 sampler, exactly:
//                 rng = random.seed(seed); for each of the N windows:
//                   repeat d = randint(0, D-1); ids = encode(doc d, with BOS) until len(ids) > T
//                   start = randint(0, len(ids) - T - 1); window = ids[start : start + T]
//               Rejected documents still consume draws. Each document is tokenized at most once
//               (lengths are cached). Guard: after 2·D + 100 consecutive rejections, every document not
//               yet seen is tokenized; if none has more than T tokens the load fails (an impossible
//               request never loops forever, a possible one keeps the reference stream).
//   text        anything else: the whole file is tokenized once, BOS at its start, into a stream of
//               L tokens; window i (i = 0..N-1) starts at randint(0, L-T-1), drawn from the same
//               generator, so Python's `random.seed(S); [random.randint(0, L-T-1) for _ in range(N)]`
//               gives the same starts. Windows may overlap; any N works once L >= T+1.
//   tokens-u16  *.bin: little-endian uint16 ids (nanoGPT / llama2.c pretokenized shards). "auto" picks
//               it only when vocab_size <= 65536; larger vocabularies must say tokens-u16 or tokens-u32.
//               A .bin picked by name whose content is text (io::looks_like_text) is refused: the message
//               says to give tokens-u16 or text explicitly.
//   tokens-u32  little-endian uint32 ids (never chosen by "auto").
//               Token files are used as they are: the file is the stream (no BOS is added; such files
//               carry their own BOS/document separators), windows drawn as for text.
// JSONL and text files may be gzip-compressed (detected from the content, not the name). Their text must
// be UTF-8 without NUL bytes (io::check_text; JSONL: every line, and every decoded "text" field).
// Files are read to their end (pipes and /proc files work); directories and devices are refused.
// Every token of the result is < vocab_size, otherwise the load fails naming the file.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace symprune::io {

struct CalibrationOptions {
  std::filesystem::path file;
  int64_t nsamples = 128;
  int64_t seqlen = 2048;
  uint64_t seed = 0;
  std::string format = "auto";  // auto, jsonl, text, tokens-u16, tokens-u32
};

struct CalibrationWindow {
  int64_t doc = -1;   // JSONL: 0-based document index (blank lines not counted); -1 for text/token streams
  int64_t start = 0;  // first token of the window in the document's (or the stream's) token ids
  bool operator==(const CalibrationWindow&) const = default;
};

struct CalibrationSet {
  std::vector<int32_t> tokens;  // nsamples × seqlen ids, row-major (window i is tokens[i*T, (i+1)*T))
  int64_t nsamples = 0;
  int64_t seqlen = 0;
  std::vector<CalibrationWindow> windows;
  std::string format;         // the resolved format: jsonl, text, tokens-u16 or tokens-u32
  int64_t documents = 0;      // JSONL: number of documents; text/tokens: 1
  int64_t stream_tokens = 0;  // text/tokens: L, the stream length; JSONL: 0
  std::string fingerprint;    // tokens_fingerprint(tokens): identifies the data actually used
};

// The format "auto" resolves to for `file` (see above); other values are validated and returned.
std::string resolve_calibration_format(const std::filesystem::path& file, const std::string& format,
                                       int64_t vocab_size);

// Draws the windows. vocab_size <= 0 means tokenizer.vocab_size(). Bad input (missing, unreadable or
// empty file, bad JSON line, missing "text", ids outside the vocabulary, a u16 file of odd length,
// too little data for a window, nsamples or seqlen < 1) throws symprune::Error naming the file.
CalibrationSet load_calibration(const CalibrationOptions& options, const Tokenizer& tokenizer,
                                int64_t vocab_size);

// 16 lowercase hex digits of the 64-bit FNV-1a hash of the ids as little-endian int32 bytes.
std::string tokens_fingerprint(const std::vector<int32_t>& tokens);

}  // namespace symprune::io
