#pragma once
// Tokenizers of the supported model families, behind one interface:
//   SentencePiece .model (LLaMA-2, Mistral), Hugging Face tokenizer.json byte-level BPE (GPT-2/OPT, LLaMA-3,
//   Qwen2 with its NFC normalizer),
//   GPT-2 vocab.json + merges.txt, llama2.c tokenizer.bin (including tok512).
// Ids must equal those of the Python `sentencepiece` / `tokenizers` packages.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace symprune::io {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Encodes `text`; when add_bos, the tokenizer's BOS id is prepended (as HF/sentencepiece
  // encoders do by default for LLaMA, and as the pruning papers' loaders rely on).
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::string kind() const = 0;  // "sentencepiece", "bpe-tokenizer.json", "bpe-gpt2", "llama2c"
};

// Loads a tokenizer from a file (by its name: *.model, *.json, vocab.json/merges.txt, *.bin) or a
// model directory, looking in order for tokenizer.model (exact SentencePiece; LLaMA-2 directories
// also ship a non-byte-level tokenizer.json), tokenizer.json (unless a tokenizer.bin is beside it: the
// tokenizer.json twin convert-llama2c writes), vocab.json + merges.txt, tokenizer.bin (vocab size from
// config.json's vocab_size when present). A directory with none of them: error listing what was looked for.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& path);

// Why a text encoded with BOS has fewer tokens than one evaluation chunk, for the message that says so:
// " (the file is empty: the one token is the BOS)" for an empty text, else "".
std::string_view empty_text_note(std::string_view text);

// Whether tokenizer_config.json in `dir` sets "add_bos_token": false (transformers then prepends no BOS).
bool tokenizer_config_disables_bos(const std::filesystem::path& dir);

// BOS: the model's bos_id (LLaMA-2: 1), none when tokenizer_config.json beside the file sets
// add_bos_token false (as transformers' LlamaTokenizer).
std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::filesystem::path& model_file);
// Byte-level BPE only. BOS = the token the HF tokenizer prepends: a leading special token of a
// TemplateProcessing post-processor, else tokenizer_config.json's bos_token beside the file (unless
// add_bos_token is false), else none (GPT-2). See bpe_tokenizer.cc.
std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::filesystem::path& tokenizer_json);
// As transformers' GPT2TokenizerFast: <|endoftext|> (or tokenizer_config.json's special tokens) split
// off first; BOS only from a tokenizer_config.json beside (OPT: </s>), none for plain GPT-2.
std::unique_ptr<Tokenizer> load_gpt2_tokenizer(const std::filesystem::path& vocab_json,
                                               const std::filesystem::path& merges_txt);
// llama2.c tokenizer.bin; bos/eos ids are 1/2 as in llama2.c. vocab_size 0 reads tokens to the end
// of the file (tok512.bin has no count); otherwise the file must hold exactly that many tokens.
std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::filesystem::path& tokenizer_bin,
                                                  int64_t vocab_size);

}  // namespace symprune::io
