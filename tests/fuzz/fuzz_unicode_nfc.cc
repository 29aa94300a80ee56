// io::nfc_normalize (Qwen2's tokenizer.json normalizer) on any well-formed UTF-8: its output is well-formed
// UTF-8 in NFC (normalizing it again changes nothing), and ASCII comes back as it is.
#include <algorithm>

#include "fuzz_support.h"
#include "io/text_file.h"
#include "io/unicode_nfc.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = symprune::fuzz::as_view(data, size);
  if (!symprune::io::is_valid_utf8(text)) return 0;  // the tokenizer checks this before normalizing
  const std::string once = symprune::io::nfc_normalize(text);
  if (!symprune::io::is_valid_utf8(once)) symprune::fuzz::violated("NFC output is not well-formed UTF-8");
  if (symprune::io::nfc_normalize(once) != once) symprune::fuzz::violated("NFC of an NFC text changed it");
  const bool ascii = std::all_of(text.begin(), text.end(), [](char c) { return (c & 0x80) == 0; });
  if (ascii && once != text) symprune::fuzz::violated("NFC changed ASCII text");
  return 0;
}
