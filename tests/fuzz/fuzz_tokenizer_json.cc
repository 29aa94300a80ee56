// Hugging Face tokenizer.json (byte-level BPE: GPT-2/OPT, LLaMA-3): load, then encode/decode a fixed text.
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return symprune::fuzz::run_expecting_only_errors([&] {
    const auto dir = symprune::fuzz::fresh_dir();
    const auto path = symprune::fuzz::write_file(dir, "tokenizer.json", symprune::fuzz::as_view(data, size));
    symprune::fuzz::exercise_tokenizer(*symprune::io::load_hf_tokenizer_json(path));
  });
}
