#pragma once
// llama2.c checkpoint (+ tokenizer) -> Hugging Face LLaMA directory: config.json, model.safetensors
// (fp32, q/k rows permuted to rotate-half RoPE), the tokenizer file and tokenizer_config.json; for a
// llama2.c tokenizer.bin also its tokenizer.json equivalent (LlamaTokenizerFast, identical ids).
#include <cstdint>
#include <filesystem>
#include <string>

namespace symprune::io {

struct ConvertLlama2cSummary {
  int version = 0;
  int64_t dim = 0, hidden_dim = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, vocab_size = 0, seq_len = 0;
  bool tied = true;
  std::string tokenizer_file;      // "tokenizer.bin" or "tokenizer.model"
  bool hf_tokenizer_json = false;  // tokenizer.json written beside tokenizer.bin (same ids)
};

// Writes `out_dir` atomically (a temp directory beside it, renamed at the end); nothing is left
// behind on error. The output is checked and locked like every output directory (io/output_dir.h):
// an existing non-empty `out_dir` is replaced only with `force` and only if symprune wrote it, and
// never when it holds the inputs. It carries a provenance file like every symprune output. The tokenizer is
// either a llama2.c tokenizer.bin (validated to hold exactly vocab_size tokens) or a SentencePiece .model
// with vocab_size pieces.
ConvertLlama2cSummary convert_llama2c(const std::filesystem::path& checkpoint,
                                      const std::filesystem::path& tokenizer,
                                      const std::filesystem::path& out_dir, bool force);

}  // namespace symprune::io
