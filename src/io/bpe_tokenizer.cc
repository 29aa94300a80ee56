// Byte-level BPE (GPT-2, OPT, LLaMA-3, Qwen2), written to give the same ids as the Hugging Face `tokenizers`
// package: added tokens are split off first, each remaining segment is normalized (NFC, where the file
// says so) and goes through the pre-tokenizer
// (regex splits, then the GPT-2 byte-to-unicode map), and every pre-token is merged with the same
// priority-queue procedure as tokenizers' BPE Word::merge_all.
//
// BOS convention (what encode(text, add_bos=true) prepends, i.e. bos_id()):
//   1. tokenizer.json post_processor TemplateProcessing whose single-sequence template starts with a
//      special token (LLaMA-3 >= the template fix: <|begin_of_text|>): that token; a template without a
//      leading special token means no BOS. RobertaProcessing/BertProcessing: their cls token.
//   2. Otherwise tokenizer_config.json beside the file: its bos_token, unless add_bos_token is false
//      (OPT: </s> = 2; original LLaMA-3 release: <|begin_of_text|>).
//   3. Otherwise none: plain GPT-2 (HF's GPT-2 tokenizer never prepends <|endoftext|>).
// EOS: tokenizer_config.json's eos_token, else <|endoftext|> when the vocabulary has it.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <deque>
#include <fstream>
#include <mutex>
#include <queue>
#include <unordered_map>

#include "core/error.h"
#include "io/json_util.h"
#include "io/tokenizer.h"
#include "io/unicode_nfc.h"

namespace symprune::io {
namespace {

using nlohmann::json;

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr size_t kMaxCachedWords = 1 << 18;

// ---- UTF-8 helpers -------------------------------------------------------------------------------

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Decodes the code point starting at `i` (input already validated); returns its length.
size_t decode_utf8(std::string_view s, size_t i, uint32_t& cp) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    cp = c;
    return 1;
  }
  const size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  cp = c & (n == 2 ? 0x1F : n == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < n && i + k < s.size(); ++k)
    cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return n;
}

// Index of the first byte that breaks UTF-8 validity, or npos.
size_t find_invalid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n;
    uint32_t min;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 2, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      n = 3, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      n = 4, min = 0x10000;
    } else {
      return i;
    }
    if (i + n > s.size()) return i;
    uint32_t cp = c & (0x7F >> n);
    for (size_t k = 1; k < n; ++k) {
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (d & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += n;
  }
  return std::string_view::npos;
}

// `s` in double quotes for error messages, as fmt's debug format would print it: valid UTF-8 is kept,
// quotes, backslashes and control characters are escaped, bytes that are not UTF-8 become \xNN. fmt's own
// debug format must not see untrusted bytes: Debian's libfmt 9 code inside libspdlog aborts on some invalid
// UTF-8 ("negative value"; found by fuzzing a merges.txt, tests/fuzz/regressions/gpt2_bpe/).
std::string quote_bytes(std::string_view s) {
  std::string out = "\"";
  auto escape_byte = [&out](unsigned char c) { out += fmt::format("\\x{:02x}", c); };
  while (!s.empty()) {
    const size_t bad = find_invalid_utf8(s);
    for (const char ch : s.substr(0, bad)) {
      const auto c = static_cast<unsigned char>(ch);
      if (c == '"' || c == '\\') {
        out += '\\';
        out += ch;
      } else if (c == '\n') {
        out += "\\n";
      } else if (c == '\r') {
        out += "\\r";
      } else if (c == '\t') {
        out += "\\t";
      } else if (c < 0x20 || c == 0x7F) {
        escape_byte(c);
      } else {
        out += ch;
      }
    }
    if (bad == std::string_view::npos) break;
    escape_byte(static_cast<unsigned char>(s[bad]));
    s.remove_prefix(bad + 1);
  }
  out += '"';
  return out;
}

// Rust's char::is_whitespace (Unicode White_Space), used by added tokens' lstrip/rstrip.
bool is_unicode_whitespace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

// GPT-2's bytes_to_unicode(): printable bytes map to themselves, the rest to U+0100 onwards.
std::array<std::string, 256> make_byte_to_unicode() {
  std::array<int, 256> cp{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  int n = 0;
  for (int b = 0; b < 256; ++b) cp[b] = direct[b] ? b : 256 + n++;
  std::array<std::string, 256> out;
  for (int b = 0; b < 256; ++b) append_utf8(out[b], static_cast<uint32_t>(cp[b]));
  return out;
}

const std::array<std::string, 256>& byte_to_unicode() {
  static const auto table = make_byte_to_unicode();
  return table;
}

const std::unordered_map<uint32_t, uint8_t>& unicode_to_byte() {
  static const auto table = [] {
    std::unordered_map<uint32_t, uint8_t> m;
    const auto& b2u = byte_to_unicode();
    for (int b = 0; b < 256; ++b) {
      uint32_t cp;
      decode_utf8(b2u[b], 0, cp);
      m[cp] = static_cast<uint8_t>(b);
    }
    return m;
  }();
  return table;
}

// ---- PCRE2 regex --------------------------------------------------------------------------------

// The pattern with \s and \S (outside a class) as Unicode's White_Space.
std::string with_unicode_white_space(const std::string& pattern) {
  // Unicode's White_Space property (PropList.txt), which Python's regex and Hugging Face's tokenizers read
  // \s as. PCRE2 with UCP also counts U+180E (Mongolian vowel separator, White_Space before Unicode 6.3).
  static const std::string kWhiteSpace =
      "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
      "\\x{205F}\\x{3000}";
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        out += in_class ? kWhiteSpace : "[" + kWhiteSpace + "]";
      } else if (next == 'S' && !in_class) {
        out += "[^" + kWhiteSpace + "]";
      } else {  // any other escape (\S inside a class, rare in tokenizers, keeps PCRE2's meaning)
        out += c;
        out += next;
      }
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      const size_t end = pattern.find(":]", i + 2);  // a POSIX class such as [:alpha:]
      if (end != std::string::npos) {
        out.append(pattern, i, end + 2 - i);
        i = end + 1;
        continue;
      }
    }
    out += c;
    if (!in_class && c == '[') {
      in_class = true;
      // A ']' first in the class (after an optional '^') is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
    } else if (in_class && c == ']') {
      in_class = false;
    }
  }
  return out;
}

class Regex {
 public:
  Regex(const std::string& given, bool literal, const std::string& source) {
    int error = 0;
    PCRE2_SIZE error_offset = 0;
    uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
    const std::string pattern = literal ? given : with_unicode_white_space(given);
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &error,
                          &error_offset, nullptr);
    if (!code_) {
      std::array<PCRE2_UCHAR, 256> message{};
      pcre2_get_error_message(error, message.data(), message.size());
      fail("{}: pre-tokenizer regex {} does not compile at offset {}: {}", source, quote_bytes(pattern),
           error_offset, reinterpret_cast<const char*>(message.data()));
    }
    jit_ = pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE) == 0;
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(start, end) for each non-empty match, left to right, non-overlapping.
  template <typename F>
  void for_each_match(std::string_view text, F&& on_match) const {
    // Per call: match data and JIT stack are not shareable across threads. Deep backtracking
    // (\s+(?!\S) over long whitespace runs) needs more than the default 32 KiB JIT stack.
    pcre2_match_data* data = pcre2_match_data_create_from_pattern(code_, nullptr);
    pcre2_match_context* context = pcre2_match_context_create(nullptr);
    pcre2_jit_stack* stack = jit_ ? pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr) : nullptr;
    if (stack) pcre2_jit_stack_assign(context, nullptr, stack);
    struct Cleanup {
      pcre2_match_data* d;
      pcre2_match_context* c;
      pcre2_jit_stack* s;
      ~Cleanup() {
        pcre2_match_data_free(d);
        pcre2_match_context_free(c);
        if (s) pcre2_jit_stack_free(s);
      }
    } cleanup{data, context, stack};
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t offset = 0;
    while (offset < text.size()) {
      const int rc = pcre2_match(code_, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, data, context);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        std::array<PCRE2_UCHAR, 256> message{};
        pcre2_get_error_message(rc, message.data(), message.size());
        fail("pre-tokenizer regex failed at byte {} of a {}-byte segment: {}", offset, text.size(),
             reinterpret_cast<const char*>(message.data()));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data);
      const size_t start = ov[0], end = ov[1];
      if (end == start) {  // empty match: step over one code point
        uint32_t cp;
        offset = start + (start < text.size() ? decode_utf8(text, start, cp) : 1);
        continue;
      }
      on_match(start, end);
      offset = end;
    }
  }

 private:
  pcre2_code* code_ = nullptr;
  bool jit_ = false;
};

// ---- Configuration ------------------------------------------------------------------------------

struct AddedToken {
  std::string content;
  int32_t id = 0;
  bool special = false;
  bool lstrip = false, rstrip = false, single_word = false, normalized = false;
};

struct PreTokenizerStep {
  enum class Kind { kSplitIsolated, kSplitRemoved, kByteLevel } kind;
  std::shared_ptr<Regex> regex;  // split pattern; for ByteLevel with use_regex, the GPT-2 pattern
  bool add_prefix_space = false;
};

struct BpeConfig {
  std::string source;  // file(s) named in errors
  std::string kind;
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::pair<std::string, std::string>> merges;
  std::vector<size_t> merge_lines;  // index (tokenizer.json) or line number (merges.txt) of each merge
  std::string merges_source;        // the file holding the merges
  std::string merge_label = "merge";
  std::vector<AddedToken> added;
  std::vector<PreTokenizerStep> pre_steps;
  bool ignore_merges = false;
  std::optional<std::string> unk_token;
  bool fuse_unk = false;
  bool nfc = false;  // normalizer {"type": "NFC"} (Qwen2)
  std::optional<int32_t> bos, eos;
};

// ---- The tokenizer ------------------------------------------------------------------------------

class BpeTokenizer final : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeConfig config) : config_(std::move(config)) {
    const auto& b2u = byte_to_unicode();
    int64_t max_id = -1;
    for (const auto& [token, id] : config_.vocab) max_id = std::max<int64_t>(max_id, id);
    for (const auto& t : config_.added) max_id = std::max<int64_t>(max_id, t.id);
    vocab_size_ = max_id + 1;
    for (int b = 0; b < 256; ++b) {
      const auto it = config_.vocab.find(b2u[b]);
      byte_ids_[b] = it == config_.vocab.end() ? -1 : it->second;
    }
    if (config_.unk_token) {
      const auto it = config_.vocab.find(*config_.unk_token);
      SYMPRUNE_CHECK(it != config_.vocab.end(), "{}: unk_token {} is not in the vocabulary", config_.source,
                     quote_bytes(*config_.unk_token));
      unk_id_ = it->second;
    }
    merges_.reserve(config_.merges.size() * 2);
    for (size_t rank = 0; rank < config_.merges.size(); ++rank) {
      const auto& [a, b] = config_.merges[rank];
      const auto ia = config_.vocab.find(a), ib = config_.vocab.find(b), iab = config_.vocab.find(a + b);
      const auto& missing = ia == config_.vocab.end() ? a : ib == config_.vocab.end() ? b : a + b;
      SYMPRUNE_CHECK(ia != config_.vocab.end() && ib != config_.vocab.end() && iab != config_.vocab.end(),
                     "{}: {} {} ({} {}) references token {}, which is not in the vocabulary",
                     config_.merges_source, config_.merge_label, config_.merge_lines[rank], quote_bytes(a),
                     quote_bytes(b), quote_bytes(missing));
      // Later duplicates win, as in tokenizers' HashMap collect.
      merges_[pair_key(ia->second, ib->second)] = {static_cast<uint32_t>(rank), iab->second};
    }
    // id -> bytes for decoding.
    id_bytes_.assign(static_cast<size_t>(vocab_size_), std::nullopt);
    const auto& u2b = unicode_to_byte();
    for (const auto& [token, id] : config_.vocab) {
      std::string bytes;
      for (size_t i = 0; i < token.size();) {
        uint32_t cp;
        const size_t n = decode_utf8(token, i, cp);
        const auto it = u2b.find(cp);
        if (it != u2b.end()) {
          bytes.push_back(static_cast<char>(it->second));
        } else {
          bytes.append(token, i, n);
        }
        i += n;
      }
      id_bytes_[id] = std::move(bytes);
    }
    for (const auto& t : config_.added) id_bytes_[t.id] = t.content;
    // tokenizers matches a normalized added token by its normalized content, in normalized text.
    if (config_.nfc)
      for (auto& t : config_.added)
        if (t.normalized) t.content = nfc_normalize(t.content);
    for (const auto& t : config_.added)
      if (!t.content.empty())
        (t.normalized ? normalized_added_ : raw_added_)[static_cast<unsigned char>(t.content[0])].push_back(
            &t);
  }

  std::vector<int32_t> encode(std::string_view text, bool add_bos) const override {
    const size_t bad = find_invalid_utf8(text);
    SYMPRUNE_CHECK(bad == std::string_view::npos, "{}: text is not valid UTF-8 (byte {} of {})",
                   config_.source, bad, text.size());
    std::vector<int32_t> ids;
    if (add_bos && config_.bos) ids.push_back(*config_.bos);
    // Added tokens, as tokenizers' AddedVocabulary: non-normalized ones are matched in the raw text first,
    // what is left between them is normalized, and normalized ones are matched in that.
    std::vector<Segment> segments = split_added({Segment{text, -1}}, raw_added_);
    std::deque<std::string> normalized;  // the normalized segments' storage (stable addresses)
    if (config_.nfc)
      for (auto& segment : segments)
        if (segment.id < 0) segment.text = normalized.emplace_back(nfc_normalize(segment.text));
    segments = split_added(std::move(segments), normalized_added_);
    std::vector<std::string> pieces;
    for (const auto& segment : segments) {
      if (segment.id >= 0) {
        ids.push_back(segment.id);
        continue;
      }
      if (segment.text.empty()) continue;  // tokenizers drops empty splits (so "" encodes to nothing)
      pieces.clear();
      pre_tokenize(segment.text, pieces);
      for (const auto& piece : pieces) encode_word(piece, ids);
    }
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (const int32_t id : ids) {
      SYMPRUNE_CHECK(id >= 0 && id < vocab_size_ && id_bytes_[id].has_value(),
                     "{}: token id {} is not in the vocabulary", config_.source, id);
      out += *id_bytes_[id];
    }
    return out;
  }

  std::optional<int32_t> bos_id() const override { return config_.bos; }
  std::optional<int32_t> eos_id() const override { return config_.eos; }
  int64_t vocab_size() const override { return vocab_size_; }
  std::string kind() const override { return config_.kind; }

 private:
  struct Segment {
    std::string_view text;
    int32_t id;  // >= 0: an added token
  };
  using AddedIndex = std::array<std::vector<const AddedToken*>, 256>;
  struct MergeTarget {
    uint32_t rank;
    int32_t id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  // tokenizers' AddedVocabulary::find_matches: leftmost-longest, non-overlapping matches; single_word
  // matches touching a word character are dropped; lstrip/rstrip absorb neighbouring whitespace.
  static std::vector<Segment> split_added(std::vector<Segment> in, const AddedIndex& index) {
    if (std::all_of(index.begin(), index.end(), [](const auto& v) { return v.empty(); })) return in;
    std::vector<Segment> out;
    for (const auto& seg : in) {
      if (seg.id >= 0) {
        out.push_back(seg);
        continue;
      }
      const std::string_view s = seg.text;
      size_t start_offset = 0;
      size_t i = 0;
      while (i < s.size()) {
        const AddedToken* best = nullptr;
        for (const AddedToken* t : index[static_cast<unsigned char>(s[i])]) {
          if (s.compare(i, t->content.size(), t->content) == 0 &&
              (!best || t->content.size() > best->content.size()))
            best = t;
        }
        if (!best) {
          ++i;
          continue;
        }
        size_t start = i, stop = i + best->content.size();
        i = stop;
        if (best->single_word && !(is_word_boundary_before(s, start) && is_word_boundary_after(s, stop)))
          continue;
        if (best->lstrip) {
          size_t j = start;
          while (j > start_offset) {
            size_t k = j - 1;
            while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
            uint32_t cp;
            decode_utf8(s, k, cp);
            if (!is_unicode_whitespace(cp)) break;
            j = k;
          }
          start = j;
        }
        if (best->rstrip) {
          while (stop < s.size()) {
            uint32_t cp;
            const size_t n = decode_utf8(s, stop, cp);
            if (!is_unicode_whitespace(cp)) break;
            stop += n;
          }
          i = stop;
        }
        if (start > start_offset) out.push_back({s.substr(start_offset, start - start_offset), -1});
        out.push_back({s.substr(start, stop - start), best->id});
        start_offset = stop;
      }
      if (start_offset < s.size()) out.push_back({s.substr(start_offset), -1});
    }
    return out;
  }

  static bool is_word_char(uint32_t cp) {
    // Approximation of Rust's char::is_alphanumeric for single_word added tokens.
    return (cp < 0x80 && (std::isalnum(static_cast<int>(cp)) != 0)) ||
           (cp >= 0x80 && !is_unicode_whitespace(cp));
  }
  static bool is_word_boundary_before(std::string_view s, size_t pos) {
    if (pos == 0) return true;
    size_t k = pos - 1;
    while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    uint32_t cp;
    decode_utf8(s, k, cp);
    return !is_word_char(cp);
  }
  static bool is_word_boundary_after(std::string_view s, size_t pos) {
    if (pos >= s.size()) return true;
    uint32_t cp;
    decode_utf8(s, pos, cp);
    return !is_word_char(cp);
  }

  // Applies the pre-tokenizer steps to one segment; pieces stay raw bytes (the byte-to-unicode map is
  // applied inside encode_word), which is equivalent because ByteLevel is the last step.
  void pre_tokenize(std::string_view segment, std::vector<std::string>& pieces) const {
    std::vector<std::string> current{std::string(segment)};
    std::vector<std::string> next;
    for (const auto& step : config_.pre_steps) {
      next.clear();
      for (auto& piece : current) {
        if (piece.empty()) continue;
        if (step.kind == PreTokenizerStep::Kind::kByteLevel && step.add_prefix_space && piece.front() != ' ')
          piece.insert(piece.begin(), ' ');
        if (!step.regex) {
          next.push_back(std::move(piece));
          continue;
        }
        const bool keep_matches = step.kind != PreTokenizerStep::Kind::kSplitRemoved;
        size_t last = 0;
        step.regex->for_each_match(piece, [&](size_t start, size_t end) {
          if (start > last) next.emplace_back(piece, last, start - last);
          if (keep_matches) next.emplace_back(piece, start, end - start);
          last = end;
        });
        if (last < piece.size()) next.emplace_back(piece, last, piece.size() - last);
      }
      current.swap(next);
    }
    for (auto& p : current)
      if (!p.empty()) pieces.push_back(std::move(p));
  }

  void encode_word(const std::string& piece, std::vector<int32_t>& ids) const {
    {
      std::lock_guard lock(cache_mutex_);
      const auto it = cache_.find(piece);
      if (it != cache_.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> word = merge_word(piece);
    ids.insert(ids.end(), word.begin(), word.end());
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() >= kMaxCachedWords) cache_.clear();
    cache_.emplace(piece, std::move(word));
  }

  std::vector<int32_t> merge_word(const std::string& piece) const {
    const auto& b2u = byte_to_unicode();
    if (config_.ignore_merges) {
      std::string mapped;
      for (const char c : piece) mapped += b2u[static_cast<unsigned char>(c)];
      const auto it = config_.vocab.find(mapped);
      if (it != config_.vocab.end()) return {it->second};
    }
    struct Symbol {
      int32_t id;
      int64_t prev, next;
      bool alive;
    };
    std::vector<Symbol> symbols;
    symbols.reserve(piece.size());
    auto add = [&](int32_t id) {
      const auto n = static_cast<int64_t>(symbols.size());
      if (n > 0) symbols.back().next = n;
      symbols.push_back({id, n - 1, -1, true});
    };
    // Unknown characters become unk (fused when fuse_unk) or are dropped, as in tokenizers' merge_word.
    bool pending_unk = false;
    for (const char c : piece) {
      const int32_t id = byte_ids_[static_cast<unsigned char>(c)];
      if (id >= 0) {
        if (pending_unk) add(*unk_id_), pending_unk = false;
        add(id);
      } else if (unk_id_) {
        if (pending_unk && !config_.fuse_unk) add(*unk_id_);
        pending_unk = true;
      }
    }
    if (pending_unk) add(*unk_id_);

    struct Merge {
      uint32_t rank;
      int64_t pos;
      int32_t id;
    };
    auto later = [](const Merge& a, const Merge& b) {
      return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
    };
    std::priority_queue<Merge, std::vector<Merge>, decltype(later)> queue(later);
    auto find_merge = [&](int32_t a, int32_t b) -> const MergeTarget* {
      const auto it = merges_.find(pair_key(a, b));
      return it == merges_.end() ? nullptr : &it->second;
    };
    for (size_t i = 0; i + 1 < symbols.size(); ++i)
      if (const auto* m = find_merge(symbols[i].id, symbols[i + 1].id))
        queue.push({m->rank, static_cast<int64_t>(i), m->id});
    while (!queue.empty()) {
      const Merge top = queue.top();
      queue.pop();
      Symbol& left = symbols[top.pos];
      if (!left.alive || left.next < 0) continue;
      const int64_t right_pos = left.next;
      const Symbol right = symbols[right_pos];
      // Expired entry: the pair at this position no longer produces this token.
      const auto* current = find_merge(left.id, right.id);
      if (!current || current->id != top.id) continue;
      left.id = top.id;
      left.next = right.next;
      symbols[right_pos].alive = false;
      if (right.next >= 0) symbols[right.next].prev = top.pos;
      if (left.prev >= 0)
        if (const auto* m = find_merge(symbols[left.prev].id, left.id))
          queue.push({m->rank, left.prev, m->id});
      if (left.next >= 0)
        if (const auto* m = find_merge(left.id, symbols[left.next].id)) queue.push({m->rank, top.pos, m->id});
    }
    std::vector<int32_t> out;
    for (const auto& s : symbols)
      if (s.alive) out.push_back(s.id);
    return out;
  }

  BpeConfig config_;
  int64_t vocab_size_ = 0;
  std::array<int32_t, 256> byte_ids_{};
  std::optional<int32_t> unk_id_;
  std::unordered_map<uint64_t, MergeTarget> merges_;
  std::vector<std::optional<std::string>> id_bytes_;
  AddedIndex raw_added_, normalized_added_;  // by first byte
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// ---- Loading ------------------------------------------------------------------------------------

// A special-token field of tokenizer_config.json: a string, an {"content": ...} object, or null.
std::optional<std::string> token_field(const json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return std::nullopt;
}

std::optional<json> read_tokenizer_config(const std::filesystem::path& dir) {
  const auto path = dir / "tokenizer_config.json";
  if (!std::filesystem::is_regular_file(path)) return std::nullopt;
  json config = read_json_file(path);
  SYMPRUNE_CHECK(config.is_object(), "{}: expected a JSON object", path.string());
  return config;
}

bool sets_add_bos_token_false(const json& tokenizer_config) {
  const auto add_bos = tokenizer_config.find("add_bos_token");
  return add_bos != tokenizer_config.end() && add_bos->is_boolean() && !add_bos->get<bool>();
}

std::optional<int32_t> lookup_token(const BpeConfig& config, const std::string& content) {
  for (const auto& t : config.added)
    if (t.content == content) return t.id;
  const auto it = config.vocab.find(content);
  if (it != config.vocab.end()) return it->second;
  return std::nullopt;
}

// Steps 2-3 of the BOS convention at the top of this file, and the EOS rule.
void apply_tokenizer_config(BpeConfig& config, const std::optional<json>& tokenizer_config,
                            bool bos_decided) {
  if (tokenizer_config) {
    if (!bos_decided && !sets_add_bos_token_false(*tokenizer_config))
      if (const auto bos = token_field(*tokenizer_config, "bos_token"))
        config.bos = lookup_token(config, *bos);
    if (const auto eos = token_field(*tokenizer_config, "eos_token")) config.eos = lookup_token(config, *eos);
  }
  if (!config.eos) config.eos = lookup_token(config, "<|endoftext|>");
}

std::string describe(const json& j) {
  if (j.is_object() && j.contains("type") && j["type"].is_string()) return j["type"].get<std::string>();
  return j.dump().substr(0, 80);
}

void parse_pre_tokenizer(const json& pre, BpeConfig& config, const std::string& path) {
  const std::string supported =
      "supported: ByteLevel, or a Sequence of Split (Regex/String pattern, behavior Isolated or Removed) "
      "steps ending in ByteLevel";
  std::vector<json> steps;
  if (pre.is_object() && pre.value("type", "") == "Sequence") {
    SYMPRUNE_CHECK(pre.contains("pretokenizers") && pre["pretokenizers"].is_array(),
                   "{}: pre_tokenizer Sequence has no pretokenizers array", path);
    for (const auto& s : pre["pretokenizers"]) steps.push_back(s);
  } else {
    steps.push_back(pre);
  }
  SYMPRUNE_CHECK(
      !steps.empty() && steps.back().is_object() && steps.back().value("type", "") == "ByteLevel",
      "{}: the tokenizer is BPE but not byte-level (pre_tokenizer {}); only byte-level BPE tokenizer.json "
      "files are supported (GPT-2, OPT, LLaMA-3, Qwen2); for SentencePiece-style models such as LLaMA-2 use "
      "tokenizer.model",
      path, describe(pre));
  for (size_t i = 0; i < steps.size(); ++i) {
    const json& s = steps[i];
    const std::string type = s.is_object() ? s.value("type", "") : "";
    PreTokenizerStep step{};
    if (type == "ByteLevel") {
      SYMPRUNE_CHECK(i + 1 == steps.size(), "{}: ByteLevel must be the last pre-tokenizer step; {}", path,
                     supported);
      step.kind = PreTokenizerStep::Kind::kByteLevel;
      step.add_prefix_space = s.value("add_prefix_space", false);
      if (s.value("use_regex", true)) step.regex = std::make_shared<Regex>(kGpt2Pattern, false, path);
    } else if (type == "Split") {
      const std::string behavior = s.value("behavior", "");
      SYMPRUNE_CHECK(behavior == "Isolated" || behavior == "Removed",
                     "{}: Split pre-tokenizer behavior {} is not supported; {}", path, quote_bytes(behavior),
                     supported);
      SYMPRUNE_CHECK(!s.value("invert", false), "{}: inverted Split pre-tokenizers are not supported; {}",
                     path, supported);
      step.kind = behavior == "Isolated" ? PreTokenizerStep::Kind::kSplitIsolated
                                         : PreTokenizerStep::Kind::kSplitRemoved;
      const json pattern = s.value("pattern", json());
      if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
        step.regex = std::make_shared<Regex>(pattern["Regex"].get<std::string>(), false, path);
      } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string()) {
        step.regex = std::make_shared<Regex>(pattern["String"].get<std::string>(), true, path);
      } else {
        fail("{}: Split pre-tokenizer has no Regex or String pattern", path);
      }
    } else {
      fail("{}: pre-tokenizer {} is not supported; {}", path, quote_bytes(type.empty() ? describe(s) : type),
           supported);
    }
    config.pre_steps.push_back(std::move(step));
  }
}

// The id -> token table is dense, so one huge id would allocate gigabytes; real vocabularies have at most
// a few hundred thousand ids (Gemma: 256,000).
constexpr int64_t kMaxTokenId = (int64_t{1} << 22) - 1;

int32_t checked_id(const json& value, const std::string& path, const std::string& what) {
  SYMPRUNE_CHECK(
      value.is_number_integer() && value.get<int64_t>() >= 0 && value.get<int64_t>() <= kMaxTokenId,
      "{}: {} has id {}, expected a non-negative integer (at most {})", path, what, value.dump(),
      kMaxTokenId);
  return static_cast<int32_t>(value.get<int64_t>());
}

void parse_vocab(const json& vocab, BpeConfig& config, const std::string& path) {
  SYMPRUNE_CHECK(vocab.is_object(), "{}: vocab must be a JSON object of token -> id", path);
  SYMPRUNE_CHECK(!vocab.empty(), "{}: vocab is empty", path);
  config.vocab.reserve(vocab.size() * 2);
  for (const auto& [token, id] : vocab.items())
    config.vocab.emplace(token, checked_id(id, path, fmt::format("vocab token {}", quote_bytes(token))));
}

void add_merge_line(std::string_view line, size_t number, BpeConfig& config) {
  const size_t space = line.find(' ');
  SYMPRUNE_CHECK(space != std::string_view::npos && line.find(' ', space + 1) == std::string_view::npos &&
                     space > 0 && space + 1 < line.size(),
                 "{}: {} {} {} is not two tokens separated by one space", config.merges_source,
                 config.merge_label, number, quote_bytes(line));
  config.merges.emplace_back(std::string(line.substr(0, space)), std::string(line.substr(space + 1)));
  config.merge_lines.push_back(number);
}

std::optional<int32_t> template_bos(const json& processor, const std::string& path, bool& decided) {
  const std::string type = processor.is_object() ? processor.value("type", "") : "";
  if (type == "Sequence" && processor.contains("processors") && processor["processors"].is_array()) {
    for (const auto& p : processor["processors"]) {
      const auto bos = template_bos(p, path, decided);
      if (decided) return bos;
    }
    return std::nullopt;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    decided = true;
    const json cls = processor.value("cls", json());
    SYMPRUNE_CHECK(cls.is_array() && cls.size() == 2, "{}: {} post_processor has no [token, id] cls", path,
                   type);
    return checked_id(cls[1], path, "post_processor cls");
  }
  if (type != "TemplateProcessing") return std::nullopt;
  decided = true;
  const json single = processor.value("single", json());
  SYMPRUNE_CHECK(single.is_array(), "{}: TemplateProcessing post_processor has no single template", path);
  if (single.empty() || !single[0].is_object() || !single[0].contains("SpecialToken")) return std::nullopt;
  const std::string name = single[0]["SpecialToken"].value("id", "");
  const json special = processor.value("special_tokens", json::object());
  SYMPRUNE_CHECK(special.contains(name) && special[name].contains("ids") && special[name]["ids"].is_array() &&
                     special[name]["ids"].size() == 1,
                 "{}: TemplateProcessing special token {} has no single id", path, quote_bytes(name));
  return checked_id(special[name]["ids"][0], path, fmt::format("special token {}", quote_bytes(name)));
}

std::unique_ptr<Tokenizer> load_hf_tokenizer_json_impl(const std::filesystem::path& tokenizer_json) {
  const std::string path = tokenizer_json.string();
  SYMPRUNE_CHECK(std::filesystem::is_regular_file(tokenizer_json), "tokenizer file {} does not exist", path);
  const json root = read_json_file(tokenizer_json, 1ull << 30);
  SYMPRUNE_CHECK(root.is_object() && root.contains("model") && root["model"].is_object(),
                 "{}: not a Hugging Face tokenizer.json (no \"model\" object)", path);
  const json& model = root["model"];
  const std::string type = model.value("type", "");
  SYMPRUNE_CHECK(
      type == "BPE",
      "{}: tokenizer model type {} is not supported; supported tokenizer.json files are byte-level BPE "
      "(GPT-2, OPT, LLaMA-3, Qwen2); use tokenizer.model for SentencePiece models",
      path, quote_bytes(type.empty() ? describe(model) : type));
  BpeConfig config;
  config.source = path;
  config.kind = "bpe-tokenizer.json";
  config.merges_source = path;
  const json normalizer = root.value("normalizer", json());
  config.nfc = normalizer.is_object() && normalizer.value("type", json()) == "NFC";
  SYMPRUNE_CHECK(
      normalizer.is_null() || config.nfc,
      "{}: normalizer {} is not supported (byte-level BPE tokenizers have none, or NFC as Qwen2's); only "
      "byte-level BPE tokenizer.json files are supported (GPT-2, OPT, LLaMA-3, Qwen2); use tokenizer.model "
      "for SentencePiece models",
      path, describe(normalizer));
  parse_pre_tokenizer(root.value("pre_tokenizer", json()), config, path);
  SYMPRUNE_CHECK(model.value("dropout", json()).is_null() || model["dropout"] == 0,
                 "{}: BPE dropout is not supported (tokenization would be random)", path);
  SYMPRUNE_CHECK(!model.value("byte_fallback", false),
                 "{}: byte_fallback BPE is not byte-level BPE; use tokenizer.model", path);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json v = model.value(key, json());
    SYMPRUNE_CHECK(v.is_null() || v == "", "{}: BPE {} {} is not supported", path, key, v.dump());
  }
  config.ignore_merges = model.value("ignore_merges", false);
  config.fuse_unk = model.value("fuse_unk", false);
  if (model.contains("unk_token") && model["unk_token"].is_string()) config.unk_token = model["unk_token"];
  SYMPRUNE_CHECK(model.contains("vocab"), "{}: BPE model has no vocab", path);
  parse_vocab(model["vocab"], config, path);
  const json merges = model.value("merges", json::array());
  SYMPRUNE_CHECK(merges.is_array(), "{}: BPE merges must be an array", path);
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {
      add_merge_line(m.get<std::string>(), i, config);
    } else {
      SYMPRUNE_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(),
                     "{}: merge {} is {}, expected \"a b\" or [\"a\", \"b\"]", path, i,
                     m.dump().substr(0, 80));
      config.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      config.merge_lines.push_back(i);
    }
  }
  const json added = root.value("added_tokens", json::array());
  SYMPRUNE_CHECK(added.is_array(), "{}: added_tokens must be an array", path);
  for (const auto& a : added) {
    SYMPRUNE_CHECK(a.is_object() && a.contains("content") && a["content"].is_string() && a.contains("id"),
                   "{}: added token {} has no content/id", path, a.dump().substr(0, 80));
    AddedToken t;
    t.content = a["content"];
    t.id = checked_id(a["id"], path, fmt::format("added token {}", quote_bytes(t.content)));
    t.special = a.value("special", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    t.single_word = a.value("single_word", false);
    t.normalized = a.value("normalized", !t.special);
    config.added.push_back(std::move(t));
  }
  bool decided = false;
  config.bos = template_bos(root.value("post_processor", json()), path, decided);
  apply_tokenizer_config(config, read_tokenizer_config(tokenizer_json.parent_path()), decided);
  return std::make_unique<BpeTokenizer>(std::move(config));
}

std::unique_ptr<Tokenizer> load_gpt2_tokenizer_impl(const std::filesystem::path& vocab_json,
                                                    const std::filesystem::path& merges_txt) {
  SYMPRUNE_CHECK(std::filesystem::is_regular_file(vocab_json), "GPT-2 vocab file {} does not exist",
                 vocab_json.string());
  SYMPRUNE_CHECK(std::filesystem::is_regular_file(merges_txt), "GPT-2 merges file {} does not exist",
                 merges_txt.string());
  BpeConfig config;
  config.source = vocab_json.string() + " + " + merges_txt.string();
  config.kind = "bpe-gpt2";
  config.merges_source = merges_txt.string();
  config.merge_label = "line";
  parse_vocab(read_json_file(vocab_json, 1ull << 30), config, vocab_json.string());
  {
    std::ifstream in(merges_txt, std::ios::binary);
    SYMPRUNE_CHECK(in.good(), "cannot open GPT-2 merges file {}", merges_txt.string());
    std::string line;
    size_t number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.empty() || line.starts_with("#version")) continue;
      add_merge_line(line, number, config);
    }
  }
  // Like transformers' GPT2TokenizerFast: the special tokens (by default <|endoftext|>, or those of a
  // tokenizer_config.json beside, e.g. OPT's <s> </s> <pad> <unk>) are split off before BPE.
  const auto tokenizer_config = read_tokenizer_config(vocab_json.parent_path());
  bool add_prefix_space = false;
  std::vector<std::string> specials;
  int32_t next_id = 0;
  for (const auto& [token, id] : config.vocab) next_id = std::max(next_id, id + 1);
  if (tokenizer_config) {
    add_prefix_space = tokenizer_config->value("add_prefix_space", false);
    const json decoder = tokenizer_config->value("added_tokens_decoder", json::object());
    if (decoder.is_object()) {
      for (const auto& [id_text, entry] : decoder.items()) {
        if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string()) continue;
        AddedToken t;
        t.content = entry["content"];
        t.id = static_cast<int32_t>(std::stol(id_text));
        t.special = entry.value("special", true);
        t.lstrip = entry.value("lstrip", false);
        t.rstrip = entry.value("rstrip", false);
        t.single_word = entry.value("single_word", false);
        t.normalized = entry.value("normalized", !t.special);
        next_id = std::max(next_id, t.id + 1);
        config.added.push_back(std::move(t));
      }
    }
    for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"})
      if (const auto token = token_field(*tokenizer_config, key)) specials.push_back(*token);
  } else {
    specials.push_back("<|endoftext|>");
  }
  for (const auto& content : specials) {
    if (lookup_token(config, content) &&
        std::any_of(config.added.begin(), config.added.end(),
                    [&](const AddedToken& t) { return t.content == content; }))
      continue;
    AddedToken t;
    t.content = content;
    const auto it = config.vocab.find(content);
    t.id = it != config.vocab.end() ? it->second : next_id++;
    t.special = true;
    config.added.push_back(std::move(t));
  }
  PreTokenizerStep step{};
  step.kind = PreTokenizerStep::Kind::kByteLevel;
  step.add_prefix_space = add_prefix_space;
  step.regex = std::make_shared<Regex>(kGpt2Pattern, false, config.source);
  config.pre_steps.push_back(std::move(step));
  apply_tokenizer_config(config, tokenizer_config, false);
  return std::make_unique<BpeTokenizer>(std::move(config));
}

}  // namespace

// Wrong JSON types inside otherwise valid JSON surface as nlohmann/std exceptions; report them with the file.
bool tokenizer_config_disables_bos(const std::filesystem::path& dir) {
  const auto config = read_tokenizer_config(dir);
  return config && sets_add_bos_token_false(*config);
}

std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::filesystem::path& tokenizer_json) {
  try {
    return load_hf_tokenizer_json_impl(tokenizer_json);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed tokenizer.json: {}", tokenizer_json.string(), e.what());
  }
}

std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::filesystem::path& vocab_json,
                                               const std::filesystem::path& merges_txt) {
  try {
    return load_gpt2_tokenizer_impl(vocab_json, merges_txt);
  } catch (const nlohmann::json::exception& e) {
    fail("{} / {}: malformed GPT-2 tokenizer files: {}", vocab_json.string(), merges_txt.string(), e.what());
  } catch (const std::logic_error& e) {  // std::stol on a non-numeric added_tokens_decoder key
    fail("{}: malformed tokenizer_config.json beside it: {}", vocab_json.string(), e.what());
  }
}

}  // namespace symprune::io
