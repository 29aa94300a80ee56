// load_tokenizer: picks the tokenizer format from a file name or a model directory's contents.
#include "io/tokenizer.h"

#include <fmt/format.h>

#include "core/error.h"
#include "io/json_util.h"

namespace symprune::io {
namespace {

namespace fs = std::filesystem;

std::unique_ptr<Tokenizer> load_llama2c_in_dir(const fs::path& bin, const fs::path& dir) {
  int64_t vocab_size = 0;  // 0: read tokens to the end of the file
  const fs::path config_path = dir / "config.json";
  if (fs::is_regular_file(config_path)) {
    const auto config = read_json_file(config_path);
    if (config.is_object() && config.contains("vocab_size")) {
      const auto& v = config["vocab_size"];
      SYMPRUNE_CHECK(v.is_number_integer() && v.get<int64_t>() > 0,
                     "{}: vocab_size {} is not a positive integer", config_path.string(), v.dump());
      vocab_size = v.get<int64_t>();
    }
  }
  if (vocab_size == 0) return load_llama2c_tokenizer(bin, vocab_size);
  try {
    return load_llama2c_tokenizer(bin, vocab_size);
  } catch (const Error& e) {
    // The file has no token count of its own: when it reads whole to its end, the count from config.json is
    // what is wrong, not the file.
    std::unique_ptr<Tokenizer> whole;
    try {
      whole = load_llama2c_tokenizer(bin, 0);
    } catch (const Error&) {
      throw e;
    }
    fail("{}; the file holds {} tokens, so vocab_size {} in {} does not fit it", e.what(),
         whole->vocab_size(), vocab_size, config_path.string());
  }
}

bool has_extension(const fs::path& p, const char* ext) {
  return p.extension() == ext;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    // tokenizer.model first: LLaMA-2 directories also ship a SentencePiece-style tokenizer.json that this
    // project does not implement, and the .model is the exact reference.
    if (fs::is_regular_file(path / "tokenizer.model"))
      return load_sentencepiece_tokenizer(path / "tokenizer.model");
    // convert-llama2c writes tokenizer.bin and a tokenizer.json twin for Hugging Face tools (same ids); the
    // .bin is the reference, so a tokenizer.json beside a tokenizer.bin is left to those tools.
    const bool llama2c = fs::is_regular_file(path / "tokenizer.bin");
    if (!llama2c && fs::is_regular_file(path / "tokenizer.json"))
      return load_hf_tokenizer_json(path / "tokenizer.json");
    if (fs::is_regular_file(path / "vocab.json") && fs::is_regular_file(path / "merges.txt"))
      return load_gpt2_tokenizer(path / "vocab.json", path / "merges.txt");
    if (llama2c) return load_llama2c_in_dir(path / "tokenizer.bin", path);
    fail(
        "no tokenizer found in directory {}: looked for tokenizer.model, tokenizer.json, vocab.json + "
        "merges.txt, tokenizer.bin (--tokenizer names a tokenizer file or directory)",
        path.string());
  }
  SYMPRUNE_CHECK(fs::is_regular_file(path, ec), "tokenizer path {} does not exist", path.string());
  const fs::path dir = path.parent_path();
  const std::string name = path.filename().string();
  if (name == "vocab.json" || name == "merges.txt") {
    const fs::path vocab = dir / "vocab.json", merges = dir / "merges.txt";
    SYMPRUNE_CHECK(fs::is_regular_file(vocab) && fs::is_regular_file(merges),
                   "GPT-2 tokenizer {} needs both vocab.json and merges.txt in {}", path.string(),
                   dir.string());
    return load_gpt2_tokenizer(vocab, merges);
  }
  if (has_extension(path, ".model")) return load_sentencepiece_tokenizer(path);
  if (has_extension(path, ".json")) return load_hf_tokenizer_json(path);
  if (has_extension(path, ".bin")) return load_llama2c_tokenizer(path, 0);
  fail(
      "cannot tell the tokenizer format of {}: expected a SentencePiece *.model, a Hugging Face "
      "tokenizer.json, "
      "a GPT-2 vocab.json (with merges.txt beside it), a llama2.c *.bin, or a model directory",
      path.string());
}

std::string_view empty_text_note(std::string_view text) {
  return text.empty() ? " (the file is empty: the one token is the BOS)" : "";
}

}  // namespace symprune::io
