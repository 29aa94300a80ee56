#pragma once
// Unicode Normalization Form C (UAX #15), for tokenizer.json files whose normalizer is {"type": "NFC"}
// (Qwen2), as the Hugging Face tokenizers package computes it: Unicode 14.0 data restricted to what its
// older tables know (scripts/gen_unicode_nfc.py). It differs from Unicode 14.0's NFC (Python's
// unicodedata) only where tokenizers does: 98 marks assigned in Unicode 10 and later count as starters, so
// they are never reordered, and U+11938 is neither decomposed nor composed.
#include <string>
#include <string_view>

namespace symprune::io {

// The NFC form of well-formed UTF-8 text (callers check it: find_invalid_utf8). ASCII comes back as is.
std::string nfc_normalize(std::string_view utf8);

// The Unicode version of the data the tables were taken from (before the restriction).
const char* nfc_unicode_version();

}  // namespace symprune::io
