// config.json (Hugging Face LLaMA / OPT): parsing and validation.
#include "fuzz_support.h"
#include "io/hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return symprune::fuzz::run_expecting_only_errors([&] {
    const auto dir = symprune::fuzz::fresh_dir();
    const auto path = symprune::fuzz::write_file(dir, "config.json", symprune::fuzz::as_view(data, size));
    const auto config = symprune::io::load_config(path);
    if (config.hidden_size <= 0 || config.num_heads <= 0 || config.num_layers <= 0 || config.vocab_size <= 0)
      symprune::fuzz::violated("a validated config has a non-positive size");
    if (config.num_kv_heads <= 0 || config.num_heads % config.num_kv_heads != 0)
      symprune::fuzz::violated("a validated config has kv heads that do not divide the heads");
    (void)config.has_project_in_out();
  });
}
