// symprune logits: raw fp32 logits of one token sequence, for parity tests against transformers.
#include <unistd.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "core/backend.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/model_resolver.h"
#include "io/output_dir.h"
#include "model/decoder_model.h"
#include "prune_cli.h"

namespace symprune::app {
namespace {

struct LogitsOptions {
  std::string model;
  std::string ids;
  std::string out;
  int threads = 0;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    int32_t value = 0;
    const char* first = text.data() + pos;
    const char* last = text.data() + comma;
    const auto [ptr, ec] = std::from_chars(first, last, value);
    SYMPRUNE_CHECK(ec == std::errc() && ptr == last && first != last,
                   "--ids: '{}' is not a comma-separated list of token ids (bad item '{}')", text,
                   std::string(first, last));
    ids.push_back(value);
    pos = comma + 1;
  }
  return ids;
}

void run_logits(const LogitsOptions& o) {
  set_cpu_threads(o.threads);
  const std::vector<int32_t> ids = parse_ids(o.ids);
  const io::ResolvedModel resolved = io::resolve_model(o.model);
  io::InputFootprint inputs;
  if (!resolved.is_synthetic()) inputs.add_model_directory(resolved.dir);
  io::check_output_file(o.out, inputs, "--out");
  const auto out_lock = io::lock_output_file(o.out, "--out", inputs);
  model::DecoderModel model = model::DecoderModel::open(resolved);
  const int64_t T = static_cast<int64_t>(ids.size());
  const Tensor logits = model.forward(ids, 1, T);
  const std::filesystem::path out(o.out);
  // x86-64 and aarch64 hosts are little-endian, which is the documented file format.
  io::write_file_atomically(out, std::string_view(reinterpret_cast<const char*>(logits.data()),
                                                  static_cast<size_t>(logits.numel()) * 4));
  std::printf("wrote %s: %lld x %lld fp32 logits\n", out.string().c_str(), static_cast<long long>(T),
              static_cast<long long>(model.vocab_size()));
}

void add_logits(CLI::App& app) {
  auto options = std::make_shared<LogitsOptions>();
  CLI::App* sub =
      app.add_subcommand("logits", "Write the fp32 logits [T, vocab] of one token sequence (little-endian)");
  sub->add_option("--model", options->model, model_option_description())->required();
  sub->add_option("--ids", options->ids, "comma-separated token ids, e.g. 1,2,3")->required();
  sub->add_option("--out", options->out, "output file of raw little-endian float32")->required();
  sub->add_option("--threads", options->threads, "CPU threads (0 = default)");
  sub->callback([options] { run_logits(*options); });
}

}  // namespace
}  // namespace symprune::app

SYMPRUNE_REGISTER_COMMAND(logits, symprune::app::add_logits);
