// SentencePiece tokenizer.model (LLaMA-2): load, then encode/decode a fixed text.
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return symprune::fuzz::run_expecting_only_errors([&] {
    const auto dir = symprune::fuzz::fresh_dir();
    const auto path = symprune::fuzz::write_file(dir, "tokenizer.model", symprune::fuzz::as_view(data, size));
    symprune::fuzz::exercise_tokenizer(*symprune::io::load_sentencepiece_tokenizer(path));
  });
}
