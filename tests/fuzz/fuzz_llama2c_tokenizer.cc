// llama2.c tokenizer.bin (vocab size read to the end of the file): load, then encode/decode a fixed text.
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return symprune::fuzz::run_expecting_only_errors([&] {
    const auto dir = symprune::fuzz::fresh_dir();
    const auto path = symprune::fuzz::write_file(dir, "tokenizer.bin", symprune::fuzz::as_view(data, size));
    symprune::fuzz::exercise_tokenizer(*symprune::io::load_llama2c_tokenizer(path, 0));
  });
}
