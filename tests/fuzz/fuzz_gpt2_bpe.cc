// GPT-2 vocab.json + merges.txt (input split at the first NUL byte): load, then encode/decode a fixed text.
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return symprune::fuzz::run_expecting_only_errors([&] {
    const auto [vocab, merges] = symprune::fuzz::split_at_nul(symprune::fuzz::as_view(data, size));
    const auto dir = symprune::fuzz::fresh_dir();
    const auto vocab_path = symprune::fuzz::write_file(dir, "vocab.json", vocab);
    const auto merges_path = symprune::fuzz::write_file(dir, "merges.txt", merges);
    symprune::fuzz::exercise_tokenizer(*symprune::io::load_gpt2_tokenizer(vocab_path, merges_path));
  });
}
