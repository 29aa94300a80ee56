// symprune convert-llama2c: llama2.c checkpoint + tokenizer -> Hugging Face LLaMA directory.
#include <cstdio>
#include <memory>
#include <string>

#include "command.h"
#include "io/convert_llama2c.h"

namespace symprune::app {
namespace {

struct ConvertLlama2cOptions {
  std::string checkpoint;
  std::string tokenizer;
  std::string out;
  bool force = false;
};

void add_convert_llama2c(CLI::App& app) {
  auto options = std::make_shared<ConvertLlama2cOptions>();
  CLI::App* sub = app.add_subcommand(
      "convert-llama2c",
      "Convert a llama2.c checkpoint (v0 legacy or v1) into a Hugging Face LLaMA directory");
  sub->add_option("--checkpoint", options->checkpoint, "llama2.c model .bin (e.g. stories260K.bin)")
      ->required();
  sub->add_option("--tokenizer", options->tokenizer,
                  "llama2.c tokenizer.bin or SentencePiece tokenizer.model")
      ->required();
  sub->add_option("--out", options->out, "output model directory (must not exist or be empty)")->required();
  sub->add_flag(
      "--force", options->force,
      "replace a non-empty output directory that symprune wrote (one with symprune_provenance.json)");
  sub->callback([options] {
    const auto s = io::convert_llama2c(options->checkpoint, options->tokenizer, options->out, options->force);
    std::printf(
        "wrote %s: llama2.c v%d, dim %lld, hidden %lld, %lld layers, %lld heads (%lld kv), vocab %lld, seq "
        "%lld, "
        "%s embeddings, %s%s\n",
        options->out.c_str(), s.version, static_cast<long long>(s.dim), static_cast<long long>(s.hidden_dim),
        static_cast<long long>(s.n_layers), static_cast<long long>(s.n_heads),
        static_cast<long long>(s.n_kv_heads), static_cast<long long>(s.vocab_size),
        static_cast<long long>(s.seq_len), s.tied ? "tied" : "untied", s.tokenizer_file.c_str(),
        s.hf_tokenizer_json ? " + tokenizer.json" : "");
  });
}

}  // namespace
}  // namespace symprune::app

SYMPRUNE_REGISTER_COMMAND(convert_llama2c, symprune::app::add_convert_llama2c);
