#include "io/unicode_nfc.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <vector>

#include "core/error.h"

namespace symprune::io {
namespace {

struct CombiningClassRange {
  char32_t first, last;
  uint8_t ccc;
};
struct Decomposition {
  char32_t code_point;
  uint16_t offset, length;
};
struct Composition {
  char32_t first, second, composite;
};

#include "io/unicode_nfc_tables.inc"

// Hangul syllables decompose and compose by arithmetic (Unicode 14.0 §3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr char32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

uint8_t combining_class(char32_t c) {
  if (c < 0x300) return 0;  // the first non-zero class is U+0300's
  const auto* end = std::end(kCombiningClasses);
  const auto* it = std::upper_bound(std::begin(kCombiningClasses), end, c,
                                    [](char32_t v, const CombiningClassRange& r) { return v < r.first; });
  if (it == std::begin(kCombiningClasses)) return 0;
  --it;
  return c <= it->last ? it->ccc : 0;
}

void decompose(char32_t c, std::vector<char32_t>& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const char32_t s = c - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
    return;
  }
  if (c >= 0xC0) {
    const auto* end = std::end(kDecompositions);
    const auto* it = std::lower_bound(std::begin(kDecompositions), end, c,
                                      [](const Decomposition& d, char32_t v) { return d.code_point < v; });
    if (it != end && it->code_point == c) {
      out.insert(out.end(), kDecompositionPool + it->offset, kDecompositionPool + it->offset + it->length);
      return;
    }
  }
  out.push_back(c);
}

// The primary composite of a starter and a following character, or 0.
char32_t compose(char32_t first, char32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase && second < kVBase + kVCount)
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 && second > kTBase &&
      second < kTBase + kTCount)
    return first + (second - kTBase);
  const auto* end = std::end(kCompositions);
  const auto* it = std::lower_bound(std::begin(kCompositions), end, std::pair(first, second),
                                    [](const Composition& c, const std::pair<char32_t, char32_t>& v) {
                                      return std::pair(c.first, c.second) < v;
                                    });
  return it != end && it->first == first && it->second == second ? it->composite : 0;
}

char32_t next_code_point(std::string_view s, size_t& i) {
  const auto byte = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(s[k])); };
  const char32_t b0 = byte(i);
  if (b0 < 0x80) {
    ++i;
    return b0;
  }
  const size_t length = b0 >= 0xF0 ? 4 : b0 >= 0xE0 ? 3 : 2;
  SYMPRUNE_CHECK(i + length <= s.size(), "NFC normalization: truncated UTF-8 at byte {}", i);
  char32_t c = b0 & (0x7F >> length);
  for (size_t k = 1; k < length; ++k) c = (c << 6) | (byte(i + k) & 0x3F);
  i += length;
  return c;
}

void append_utf8(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// UAX #15's canonical composition of a canonically ordered, fully decomposed sequence, in place (the
// standard's sample algorithm). A character composes with the last starter unless a character between
// them has a class of 0 or at least its own (it is blocked).
void compose_in_place(std::vector<char32_t>& cps) {
  if (cps.empty()) return;
  size_t starter = 0;
  int last_class = combining_class(cps[0]) == 0 ? 0 : 256;  // 256: a leading non-starter composes nothing
  size_t out = 1;
  for (size_t i = 1; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    const int cc = combining_class(c);
    const char32_t composite = last_class < cc || last_class == 0 ? compose(cps[starter], c) : 0;
    if (composite != 0) {
      cps[starter] = composite;
      continue;
    }
    if (cc == 0) starter = out;
    last_class = cc;
    cps[out++] = c;
  }
  cps.resize(out);
}

}  // namespace

std::string nfc_normalize(std::string_view utf8) {
  if (std::all_of(utf8.begin(), utf8.end(), [](char b) { return static_cast<unsigned char>(b) < 0x80; }))
    return std::string(utf8);
  std::vector<char32_t> cps;
  cps.reserve(utf8.size());
  for (size_t i = 0; i < utf8.size();) decompose(next_code_point(utf8, i), cps);
  // Canonical ordering: each run of non-starters sorted stably by combining class.
  for (size_t i = 0; i < cps.size();) {
    if (combining_class(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && combining_class(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i),
                     cps.begin() + static_cast<std::ptrdiff_t>(j),
                     [](char32_t a, char32_t b) { return combining_class(a) < combining_class(b); });
    i = j;
  }
  compose_in_place(cps);
  std::string out;
  out.reserve(utf8.size());
  for (const char32_t c : cps) append_utf8(c, out);
  return out;
}

const char* nfc_unicode_version() {
  return kUnicodeVersion;
}

}  // namespace symprune::io
