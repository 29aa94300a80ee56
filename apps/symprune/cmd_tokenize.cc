// symprune tokenize: token ids of a text with any supported tokenizer (for checks and scripting).
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "command.h"
#include "core/error.h"
#include "io/text_file.h"
#include "io/tokenizer.h"

namespace symprune::app {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string text;
  std::string text_file;
  std::string texts_json;
  bool no_bos = false;
  bool count = false;
  bool json = false;
};

void add_tokenize(CLI::App& app) {
  auto options = std::make_shared<TokenizeOptions>();
  CLI::App* sub = app.add_subcommand("tokenize", "Print the token ids of a text (comma-separated, one line)");
  sub->add_option(
         "--tokenizer", options->tokenizer,
         "tokenizer file (tokenizer.model, tokenizer.json, vocab.json, tokenizer.bin) or model directory")
      ->required();
  auto* text = sub->add_option("--text", options->text, "text to tokenize");
  auto* file = sub->add_option("--text-file", options->text_file, "file whose bytes are tokenized");
  auto* batch = sub->add_option("--texts-json", options->texts_json,
                                "JSON file holding an array of strings: prints one JSON array of id arrays "
                                "(one process for many texts, for tests and scripts)");
  text->excludes(file)->excludes(batch);
  file->excludes(text)->excludes(batch);
  batch->excludes(text)->excludes(file);
  sub->add_flag("--no-bos", options->no_bos, "do not prepend the tokenizer's BOS token");
  sub->add_flag("--count", options->count,
                "print only the number of tokens (with --texts-json: a JSON array of counts)");
  sub->add_flag("--json", options->json, "print the ids as a JSON array");
  sub->callback([options, text, file, batch] {
    SYMPRUNE_CHECK(text->count() + file->count() + batch->count() == 1,
                   "tokenize needs exactly one of --text, --text-file or --texts-json");
    const auto tokenizer = io::load_tokenizer(options->tokenizer);
    if (batch->count()) {
      nlohmann::json texts;
      try {
        texts = nlohmann::json::parse(io::read_text_file(options->texts_json, "JSON file (--texts-json)"));
      } catch (const nlohmann::json::exception& e) {
        fail("{} is not valid JSON: {}", options->texts_json, e.what());
      }
      SYMPRUNE_CHECK(texts.is_array(), "{} must hold a JSON array of strings", options->texts_json);
      nlohmann::json out = nlohmann::json::array();
      for (size_t i = 0; i < texts.size(); ++i) {
        const auto& t = texts[i];
        SYMPRUNE_CHECK(t.is_string(), "{} must hold a JSON array of strings; found {}", options->texts_json,
                       t.dump().substr(0, 40));
        // --text-file's rule for each text: no NUL (a JSON string may spell one, \u0000).
        const std::string& text = t.get_ref<const std::string&>();
        const size_t nul = text.find('\0');
        SYMPRUNE_CHECK(
            nul == std::string::npos,
            "{}: text {} (from 0) holds a NUL character (\\u0000) at byte {}: texts must not contain "
            "NUL",
            options->texts_json, i, nul);
        const auto ids = tokenizer->encode(text, !options->no_bos);
        if (options->count) {
          out.push_back(ids.size());
        } else {
          out.push_back(ids);
        }
      }
      std::printf("%s\n", out.dump().c_str());
      return;
    }
    const std::string input =
        file->count() ? io::read_text_file(options->text_file, "text file (--text-file)") : options->text;
    // --text-file's rule for --text too: bytes that are not UTF-8 are refused, not tokenized as bytes.
    if (!file->count())
      if (const auto bad = io::first_invalid_utf8(input))
        fail(
            "--text: not UTF-8: invalid byte 0x{:02X} at offset {}; pass UTF-8 text (or a file with "
            "--text-file)",
            static_cast<unsigned char>(input[*bad]), *bad);
    const auto ids = tokenizer->encode(input, !options->no_bos);
    if (options->count) {
      std::printf("%zu\n", ids.size());
      return;
    }
    std::string out = options->json ? "[" : "";
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out += options->json ? ", " : ",";
      out += std::to_string(ids[i]);
    }
    if (options->json) out += "]";
    std::printf("%s\n", out.c_str());
  });
}

}  // namespace
}  // namespace symprune::app

SYMPRUNE_REGISTER_COMMAND(tokenize, symprune::app::add_tokenize);
