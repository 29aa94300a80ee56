#pragma once
// llama2.c tokenizer.bin contents, and the Hugging Face tokenizer.json that encodes exactly like it, so a
// converted llama2.c model loads with AutoTokenizer (and lm-eval, vLLM, pipeline()).
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace symprune::io {

struct Llama2cVocabulary {
  int32_t max_token_length = 0;
  std::vector<std::string> pieces;  // raw bytes; ' ' where SentencePiece writes '▁'
  std::vector<float> scores;
};

// Parses tokenizer.bin bytes (int32 max_token_length, then per token {f32 score, i32 length, bytes});
// errors name `path`. vocab_size 0 reads tokens to the end of the data; otherwise exactly that many.
Llama2cVocabulary parse_llama2c_vocabulary(std::string_view bytes, const std::filesystem::path& path,
                                           int64_t vocab_size);

// A tokenizer.json for the `tokenizers` library whose ids equal llama2.c run.c's encode() (with BOS): a
// SentencePiece-style BPE ('▁' for spaces, one '▁' prepended, byte fallback <0xNN>) whose merges are every
// pair of pieces that concatenates to a piece, ranked by that piece's score as run.c picks them. Special
// tokens <unk>, <s>, </s> are ids 0, 1, 2; as in every Hugging Face LLaMA tokenizer, a literal "<s>" in
// the text becomes the special token, and a literal '▁' reads as a space. Throws symprune::Error saying
// why when the vocabulary cannot be expressed so (byte pieces not at ids 3..258, duplicate pieces, ...).
std::string llama2c_hf_tokenizer_json(const Llama2cVocabulary& vocabulary);

}  // namespace symprune::io
