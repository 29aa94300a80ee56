// llama2.c checkpoint (.bin, v0 and v1): header, all tensors, RoPE table check, q/k row permutation.
#include "fuzz_support.h"
#include "io/llama2c_checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return symprune::fuzz::run_expecting_only_errors([&] {
    const auto dir = symprune::fuzz::fresh_dir();
    const auto path = symprune::fuzz::write_file(dir, "model.bin", symprune::fuzz::as_view(data, size));
    const auto header = symprune::io::read_llama2c_header(path);
    if (header.expected_file_bytes() != size) symprune::fuzz::violated("accepted a file of the wrong size");
    const auto checkpoint = symprune::io::load_llama2c_checkpoint(path);
    symprune::io::check_llama2c_rope_tables(checkpoint, path);
    for (const auto& w : checkpoint.wq) (void)symprune::io::permute_rope_rows_to_hf(w, header.n_heads);
    for (const auto& w : checkpoint.wk) (void)symprune::io::permute_rope_rows_to_hf(w, header.n_kv_heads);
  });
}
