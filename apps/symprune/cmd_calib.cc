// symprune calib: draw calibration windows exactly as `symprune prune` will, and show or save them
// (for checks against the reference Python samplers and for scripting).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <system_error>

#include "cli_checks.h"
#include "command.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/calibration.h"
#include "io/output_dir.h"
#include "io/tokenizer.h"

namespace symprune::app {
namespace {

struct CalibCommandOptions {
  std::string tokenizer;
  io::CalibrationOptions calib;
  std::string calib_file;
  int64_t vocab_size = 0;
  bool json = false;
  std::string out;
};

// All-or-nothing (io::write_file_atomically): a failed write (disk full, file too large) names the file
// and its cause and leaves nothing behind.
void write_tokens_u32(const std::filesystem::path& out, const std::vector<int32_t>& tokens) {
  std::string bytes(tokens.size() * 4, '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto v = static_cast<uint32_t>(tokens[i]);
    for (int b = 0; b < 4; ++b) bytes[4 * i + b] = static_cast<char>((v >> (8 * b)) & 0xffu);
  }
  io::write_file_atomically(out, bytes);
}

void add_calib(CLI::App& app) {
  auto options = std::make_shared<CalibCommandOptions>();
  CLI::App* sub = app.add_subcommand(
      "calib",
      "Draw calibration windows (reference C4 sampler for JSONL; random windows of a text or token file)");
  sub->add_option(
         "--tokenizer", options->tokenizer,
         "tokenizer file (tokenizer.model, tokenizer.json, vocab.json, tokenizer.bin) or model directory")
      ->required();
  sub->add_option(
         "--calib", options->calib_file,
         "calibration data: C4-style JSONL (.jsonl/.json, optionally .gz; field \"text\"), plain text, "
         "or a token file (.bin)")
      ->required();
  sub->add_option("--nsamples", options->calib.nsamples, "number of windows N")->capture_default_str();
  sub->add_option("--seqlen", options->calib.seqlen, "tokens per window T")->capture_default_str();
  add_python_seed_option(sub, "--seed", options->calib.seed,
                         "seed of the Python-compatible generator, random.seed(S) semantics (default 0)");
  sub->add_option("--calib-format", options->calib.format,
                  "auto (by file name), jsonl, text, tokens-u16 or tokens-u32")
      ->capture_default_str();
  sub->add_option("--vocab-size", options->vocab_size,
                  "vocabulary size ids are checked against (default: the tokenizer's)");
  sub->add_flag("--json", options->json, "print the windows and the token fingerprint as JSON");
  sub->add_option("--out", options->out, "write the N×T token ids as little-endian uint32 to this file");
  sub->callback([options] {
    SYMPRUNE_CHECK(options->vocab_size >= 0, "--vocab-size must be >= 0 (0: the tokenizer's), got {}",
                   options->vocab_size);
    options->calib.file = options->calib_file;
    std::unique_ptr<io::PathLock> out_lock;
    if (!options->out.empty()) {
      io::InputFootprint inputs;
      inputs.add_file(options->calib_file);
      inputs.add_file(options->tokenizer);
      io::check_output_file(options->out, inputs, "--out");
      out_lock = io::lock_output_file(options->out, "--out", inputs);
    }
    const auto tokenizer = io::load_tokenizer(options->tokenizer);
    const io::CalibrationSet set = io::load_calibration(options->calib, *tokenizer, options->vocab_size);
    if (!options->out.empty()) write_tokens_u32(options->out, set.tokens);
    if (options->json) {
      nlohmann::json windows = nlohmann::json::array();
      for (const auto& w : set.windows) windows.push_back({{"doc", w.doc}, {"start", w.start}});
      const nlohmann::json out = {{"file", options->calib_file},        {"format", set.format},
                                  {"nsamples", set.nsamples},           {"seqlen", set.seqlen},
                                  {"seed", options->calib.seed},        {"documents", set.documents},
                                  {"stream_tokens", set.stream_tokens}, {"windows", windows},
                                  {"fingerprint", set.fingerprint}};
      std::printf("%s\n", out.dump().c_str());
      return;
    }
    std::printf("%s: %s, %lld windows of %lld tokens, seed %llu, fingerprint %s\n",
                options->calib_file.c_str(), set.format.c_str(), static_cast<long long>(set.nsamples),
                static_cast<long long>(set.seqlen), static_cast<unsigned long long>(options->calib.seed),
                set.fingerprint.c_str());
    for (size_t i = 0; i < set.windows.size(); ++i)
      std::printf("  window %zu: doc %lld, start %lld\n", i, static_cast<long long>(set.windows[i].doc),
                  static_cast<long long>(set.windows[i].start));
  });
}

}  // namespace
}  // namespace symprune::app

SYMPRUNE_REGISTER_COMMAND(calib, symprune::app::add_calib);
