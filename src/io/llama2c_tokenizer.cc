// llama2.c tokenizer.bin: int32 max_token_length, then per token {f32 score, i32 length, bytes}.
// Encoding and decoding follow karpathy/llama2.c run.c (encode()/decode()) step for step, so ids
// equal the reference implementation's, quirks included (greedy highest-score pair merging).
#include "io/llama2c_tokenizer.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <unordered_map>

#include "core/error.h"
#include "io/tokenizer.h"

namespace symprune::io {
namespace {

// run.c sizes its merge buffer from max_token_length; anything beyond this is a corrupt header.
constexpr int32_t kMaxTokenLengthLimit = 1 << 16;
constexpr int32_t kBosId = 1;
constexpr int32_t kEosId = 2;
constexpr int32_t kByteFallbackOffset = 3;  // <0x00> is id 3 in llama2.c vocabularies

class Llama2cTokenizer final : public Tokenizer {
 public:
  Llama2cTokenizer(const std::filesystem::path& path, int64_t expected_vocab_size) : path_(path) {
    std::ifstream in(path, std::ios::binary);
    SYMPRUNE_CHECK(in.good(), "cannot open llama2.c tokenizer {}", path.string());
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    Llama2cVocabulary vocabulary = parse_llama2c_vocabulary(bytes, path, expected_vocab_size);
    vocab_ = std::move(vocabulary.pieces);
    scores_ = std::move(vocabulary.scores);
    // run.c looks tokens up with bsearch over a sorted copy; the vocabularies have no duplicates, and on a
    // duplicate we keep the lowest id.
    lookup_.reserve(vocab_.size() * 2);
    for (size_t i = 0; i < vocab_.size(); ++i) lookup_.emplace(vocab_[i], static_cast<int32_t>(i));
    const auto space = lookup_.find(" ");
    // run.c assumes " " exists; without it the dummy prefix falls back to the raw byte, like any other char.
    dummy_prefix_id_ = space != lookup_.end() ? space->second : ' ' + kByteFallbackOffset;
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos) const override {
    std::vector<int32_t> tokens;
    tokens.reserve(text.size() + 2);
    if (add_bos) tokens.push_back(kBosId);
    if (!text.empty()) tokens.push_back(dummy_prefix_id_);
    // Code point by code point (at most 4 bytes per lookup), with byte fallback.
    std::string buffer;
    for (size_t i = 0; i < text.size(); ++i) {
      const auto c = static_cast<unsigned char>(text[i]);
      if ((c & 0xC0) != 0x80) buffer.clear();
      buffer.push_back(static_cast<char>(c));
      const bool next_is_continuation =
          i + 1 < text.size() && (static_cast<unsigned char>(text[i + 1]) & 0xC0) == 0x80;
      if (next_is_continuation && buffer.size() < 4) continue;
      const auto it = lookup_.find(buffer);
      if (it != lookup_.end()) {
        tokens.push_back(it->second);
      } else {
        for (const char b : buffer) tokens.push_back(static_cast<unsigned char>(b) + kByteFallbackOffset);
      }
      buffer.clear();
    }
    merge_pairs(tokens);
    return tokens;
  }

  // As run.c: the space after BOS is dropped and <0xXX> pieces become raw bytes. BOS/EOS print nothing.
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    int32_t prev = -1;
    for (const int32_t id : ids) {
      SYMPRUNE_CHECK(id >= 0 && static_cast<size_t>(id) < vocab_.size(),
                     "llama2.c tokenizer {}: token id {} is outside the vocabulary (size {})", path_.string(),
                     id, vocab_.size());
      if (id == kBosId || id == kEosId) {
        prev = id;
        continue;
      }
      std::string_view piece = vocab_[id];
      if (prev == kBosId && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
      unsigned int byte = 0;
      char tail = 0;
      if (piece.size() == 6 && piece.substr(0, 3) == "<0x" && piece[5] == '>' &&
          std::sscanf(std::string(piece).c_str(), "<0x%02X%c", &byte, &tail) == 2 && tail == '>') {
        out.push_back(static_cast<char>(byte));
      } else {
        out.append(piece);
      }
      prev = id;
    }
    return out;
  }

  std::optional<int32_t> bos_id() const override { return kBosId; }
  std::optional<int32_t> eos_id() const override { return kEosId; }
  int64_t vocab_size() const override { return static_cast<int64_t>(vocab_.size()); }
  std::string kind() const override { return "llama2c"; }

 private:
  // run.c repeatedly scans for the adjacent pair whose concatenation is a token with the highest score
  // (strictly above -1e10, leftmost on ties) and merges it: O(n^2). This is the same choice sequence with
  // a heap over (score desc, left position asc) and a linked list, so long texts tokenize fast. Merged
  // nodes keep the left node's original index, which preserves the "leftmost" order.
  void merge_pairs(std::vector<int32_t>& tokens) const {
    const size_t n = tokens.size();
    if (n < 2) return;
    std::vector<int64_t> prev(n), next(n);
    std::vector<uint32_t> version(n, 0);
    for (size_t i = 0; i < n; ++i) {
      prev[i] = static_cast<int64_t>(i) - 1;
      next[i] = i + 1 < n ? static_cast<int64_t>(i) + 1 : -1;
    }
    struct Candidate {
      float score;
      int64_t left;
      int32_t id;
      uint32_t left_version, right_version;
      int64_t right;
    };
    auto worse = [](const Candidate& a, const Candidate& b) {
      if (a.score != b.score) return a.score < b.score;
      return a.left > b.left;
    };
    std::vector<Candidate> heap;
    std::string merged;
    auto push = [&](int64_t left) {
      if (left < 0) return;
      const int64_t right = next[left];
      if (right < 0) return;
      merged.assign(vocab_[tokens[left]]);
      merged.append(vocab_[tokens[right]]);
      const auto it = lookup_.find(merged);
      if (it == lookup_.end()) return;
      const float score = scores_[it->second];
      if (!(score > -1e10f)) return;  // run.c starts from best_score = -1e10 with a strict '>'
      heap.push_back({score, left, it->second, version[left], version[right], right});
      std::push_heap(heap.begin(), heap.end(), worse);
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int64_t>(i));
    std::vector<bool> alive(n, true);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), worse);
      const Candidate c = heap.back();
      heap.pop_back();
      if (!alive[c.left] || !alive[c.right] || next[c.left] != c.right || version[c.left] != c.left_version ||
          version[c.right] != c.right_version)
        continue;
      tokens[c.left] = c.id;
      ++version[c.left];
      alive[c.right] = false;
      next[c.left] = next[c.right];
      if (next[c.right] >= 0) prev[next[c.right]] = c.left;
      push(prev[c.left]);
      push(c.left);
    }
    size_t out = 0;
    for (int64_t i = 0; i >= 0; i = next[i]) tokens[out++] = tokens[i];
    tokens.resize(out);
  }

  std::filesystem::path path_;
  std::vector<std::string> vocab_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> lookup_;
  int32_t dummy_prefix_id_ = 0;
};

}  // namespace

Llama2cVocabulary parse_llama2c_vocabulary(std::string_view bytes, const std::filesystem::path& path,
                                           int64_t expected_vocab_size) {
  SYMPRUNE_CHECK(expected_vocab_size >= 0, "llama2.c tokenizer {}: vocab_size {} is negative", path.string(),
                 expected_vocab_size);
  Llama2cVocabulary out;
  size_t offset = 0;
  auto read_i32 = [&](const char* what, size_t token) -> int32_t {
    SYMPRUNE_CHECK(offset + 4 <= bytes.size(),
                   "llama2.c tokenizer {} is truncated: {} of token {} at byte {}", path.string(), what,
                   token, offset);
    int32_t v;
    std::memcpy(&v, bytes.data() + offset, 4);
    offset += 4;
    return v;
  };
  SYMPRUNE_CHECK(bytes.size() >= 4,
                 "llama2.c tokenizer {} is truncated: {} bytes, no max_token_length header", path.string(),
                 bytes.size());
  out.max_token_length = read_i32("header", 0);
  SYMPRUNE_CHECK(out.max_token_length > 0 && out.max_token_length <= kMaxTokenLengthLimit,
                 "llama2.c tokenizer {}: max_token_length {} is out of range (1..{}); not a tokenizer.bin?",
                 path.string(), out.max_token_length, kMaxTokenLengthLimit);
  // vocab_size 0: read tokens to the end of the file (tok512.bin carries no count).
  while (expected_vocab_size == 0 ? offset < bytes.size()
                                  : static_cast<int64_t>(out.pieces.size()) < expected_vocab_size) {
    const size_t i = out.pieces.size();
    const int32_t score_bits = read_i32("score", i);
    float score;
    std::memcpy(&score, &score_bits, 4);
    const int32_t len = read_i32("length", i);
    SYMPRUNE_CHECK(len >= 0, "llama2.c tokenizer {}: token {} has negative length {}", path.string(), i, len);
    SYMPRUNE_CHECK(len <= out.max_token_length,
                   "llama2.c tokenizer {}: token {} has length {} > max_token_length {}", path.string(), i,
                   len, out.max_token_length);
    SYMPRUNE_CHECK(offset + static_cast<size_t>(len) <= bytes.size(),
                   "llama2.c tokenizer {} is truncated: token {} needs {} bytes at byte {}, file has {}",
                   path.string(), i, len, offset, bytes.size());
    out.pieces.emplace_back(bytes.data() + offset, static_cast<size_t>(len));
    out.scores.push_back(score);
    offset += static_cast<size_t>(len);
  }
  SYMPRUNE_CHECK(
      offset == bytes.size(),
      "llama2.c tokenizer {}: {} trailing bytes after the {} tokens expected (vocab_size mismatch?)",
      path.string(), bytes.size() - offset, out.pieces.size());
  SYMPRUNE_CHECK(
      out.pieces.size() >= 256 + kByteFallbackOffset,
      "llama2.c tokenizer {} has only {} tokens; at least 259 (<unk>, <s>, </s>, 256 bytes) are needed",
      path.string(), out.pieces.size());
  return out;
}

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::filesystem::path& tokenizer_bin,
                                                  int64_t vocab_size) {
  return std::make_unique<Llama2cTokenizer>(tokenizer_bin, vocab_size);
}

}  // namespace symprune::io
