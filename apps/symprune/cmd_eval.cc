// symprune eval: perplexity of a model on a text file with the pruning papers' protocol
// (one BOS at the start of the text, non-overlapping chunks of --seqlen tokens, tail dropped,
// PPL = exp(mean chunk loss); reference-implementations.md §1.3).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "command.h"
#include "core/accel.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/log.h"
#include "core/system_memory.h"
#include "engine/run_plan.h"
#include "io/atomic_file.h"
#include "io/model_resolver.h"
#include "io/output_dir.h"
#include "io/text_file.h"
#include "io/tokenizer.h"
#include "model/decoder_model.h"
#include "model/fingerprint.h"
#include "model/perplexity.h"
#include "prune_cli.h"

namespace symprune::app {
namespace {

struct EvalOptions {
  std::string model;
  std::string text;
  std::string tokenizer;
  std::string report;
  int64_t seqlen = 2048;      // the reference tools' window, as prune's --seqlen
  bool seqlen_given = false;  // --seqlen on the command line (else the default, which may not fit)
  int64_t max_chunks = 0;
  int64_t batch = 0;
  int threads = 0;
  std::string device = "auto";
  std::string dtype = "auto";
};

// Before any block is read, on the CPU: the host memory plan of the evaluation (the globals, one block at a
// time, every chunk's hidden states, a pass's activations, the logits), so that a text too long for the
// memory is a message with the options that lower it, not the kernel killing the run midway.
// Returns the report's "host_memory" without its peak (null on a device).
nlohmann::json check_eval_host_memory(const EvalOptions& o, const model::DecoderModel& model,
                                      int64_t total_chunks) {
  if (model.backend().device_resident()) return nullptr;  // the states and weights are in the device's memory
  const int64_t chunks = o.max_chunks > 0 ? std::min(o.max_chunks, total_chunks) : total_chunks;
  const int64_t batch = o.batch > 0 ? o.batch : model::default_batch_sequences(o.seqlen);
  engine::HostMemoryShape shape;
  shape.prunes = false;
  shape.eval_streams = 1;
  shape.threads = cpu_threads();
  shape.eval_tokens = chunks * o.seqlen;
  shape.eval_batch_tokens = std::min(batch, chunks) * o.seqlen;
  shape.tokens_per_pass =
      std::min({batch, std::max<int64_t>(1, model.max_tokens_per_pass() / o.seqlen), chunks}) * o.seqlen;
  shape.attention_length = o.seqlen;
  const engine::MemoryPlan plan =
      engine::plan_host_memory(model.config(), model.stored_weight_dtype(), shape);
  const auto resident = resident_bytes();
  const auto available = engine::check_host_memory(
      plan, plan.globals, engine::kHostMemoryMargin, 1,
      {fmt::format("--max-chunks {} (evaluation {})", chunks, format_bytes(plan.evaluation)),
       fmt::format("--batch {} (activations {})", batch, format_bytes(plan.activations))});
  return {
      {"planned", plan.total()},
      // Bytes as an integer, as in the prune report.
      {"available_at_start", available ? nlohmann::json(static_cast<int64_t>(*available)) : nlohmann::json()},
      {"resident_at_plan", resident ? nlohmann::json(*resident) : nlohmann::json()},
      {"plan", engine::memory_plan_json(plan)}};
}

void run_eval(const EvalOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  set_cpu_threads(o.threads);
  const io::ResolvedModel resolved = io::resolve_model(o.model);
  // The report is written last: a path that cannot work fails now, not after the whole evaluation.
  const bool synthetic = resolved.is_synthetic();
  SYMPRUNE_CHECK(!synthetic || !o.tokenizer.empty(),
                 "{} has no tokenizer: give one with --tokenizer (its vocabulary must fit the model's)",
                 o.model);
  std::unique_ptr<io::PathLock> report_lock;
  if (!o.report.empty()) {
    io::InputFootprint inputs;
    if (!synthetic) inputs.add_model_directory(resolved.dir);
    inputs.add_file(o.text);
    inputs.add_file(o.tokenizer);
    io::check_output_file(o.report, inputs, "--report");
    report_lock = io::lock_output_file(o.report, "--report", inputs);
  }
  SYMPRUNE_CHECK(o.seqlen >= 2, "--seqlen must be at least 2, got {}", o.seqlen);
  SYMPRUNE_CHECK(o.max_chunks >= 0, "--max-chunks must be >= 0 (0 = all), got {}", o.max_chunks);
  SYMPRUNE_CHECK(o.batch >= 0, "--batch must be >= 0 (0 = automatic), got {}", o.batch);
  // Cheap checks before loading weights: tokenizer, text, sequence length.
  const auto tokenizer =
      io::load_tokenizer(o.tokenizer.empty() ? resolved.dir : std::filesystem::path(o.tokenizer));
  Backend& backend = accel::backend_for_device(o.device);
  model::DecoderModel model = model::DecoderModel::open(resolved, backend);
  model.set_storage_dtype(model::resolve_storage_dtype(o.dtype, backend, model.stored_weight_dtype()));
  SYMPRUNE_CHECK(o.seqlen_given || o.seqlen <= model.max_seq_len(),
                 "--seqlen defaults to {}, which exceeds {} of {}: pass --seqlen {} (the model's maximum) or "
                 "less",
                 o.seqlen, model.max_seq_len_limit(), model.config_file(), model.max_seq_len());
  SYMPRUNE_CHECK(o.seqlen <= model.max_seq_len(), "--seqlen {} exceeds {} of {}", o.seqlen,
                 model.max_seq_len_limit(), model.config_file());
  const std::string text = io::read_evaluation_text(o.text, "text file (--text)");
  if (!tokenizer->bos_id())
    log::warn("tokenizer ({}) has no BOS token; the text is evaluated without one", tokenizer->kind());
  const std::vector<int32_t> tokens = tokenizer->encode(text, /*add_bos=*/true);
  SYMPRUNE_CHECK(static_cast<int64_t>(tokens.size()) >= o.seqlen,
                 "{}: {} tokens, fewer than one chunk of {}{}", o.text, tokens.size(), o.seqlen,
                 io::empty_text_note(text));
  for (size_t i = 0; i < tokens.size(); ++i)
    SYMPRUNE_CHECK(
        tokens[i] >= 0 && tokens[i] < model.vocab_size(),
        "{}: token id {} at position {} from tokenizer {} is outside the model vocabulary of {} ({})", o.text,
        tokens[i], i, tokenizer->kind(), model.vocab_size(), resolved.display());
  const int64_t total_chunks = static_cast<int64_t>(tokens.size()) / o.seqlen;
  log::info("{}: {} tokens, {} chunks of {} (evaluating {})", o.text, tokens.size(), total_chunks, o.seqlen,
            o.max_chunks > 0 ? std::min(o.max_chunks, total_chunks) : total_chunks);

  nlohmann::json host_memory = check_eval_host_memory(o, model, total_chunks);

  model::PerplexityOptions options;
  options.seqlen = o.seqlen;
  options.max_chunks = o.max_chunks;
  options.batch_sequences = o.batch;
  const auto eval_start = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - eval_start).count();
  };
  // The model is read once, block by block, through all chunks; then the head scores them.
  const auto result = model::evaluate_perplexity(
      model, tokens, options,
      [&](int64_t done, int64_t total) {
        if (done == total)
          log::info("chunks {}/{} scored ({:.1f} s, {:.0f} tokens/s)", done, total, seconds(),
                    static_cast<double>(done * o.seqlen) / std::max(seconds(), 1e-9));
      },
      [&](int64_t done, int64_t total) {
        const double elapsed = seconds();
        log::info("block {}/{} ({:.1f} s, ETA {:.1f} s)", done, total, elapsed,
                  elapsed / static_cast<double>(done) * static_cast<double>(total - done));
      });
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("perplexity: %.6f\n", result.perplexity);
  std::printf("mean nll: %.6f over %lld chunks of %lld tokens (%lld text tokens), %.2f s\n", result.mean_nll,
              static_cast<long long>(result.chunks), static_cast<long long>(result.seqlen),
              static_cast<long long>(result.tokens), wall);
  if (!o.report.empty()) {
    if (host_memory.is_object()) host_memory["peak_resident"] = peak_resident_bytes().value_or(0);
    nlohmann::json report = {
        {"command", "eval"},
        {"perplexity", result.perplexity},
        {"mean_nll", result.mean_nll},
        {"chunks", result.chunks},
        {"tokens", result.tokens},
        {"evaluated_tokens", result.evaluated_tokens},
        {"seqlen", result.seqlen},
        {"chunk_nll", result.chunk_nll},
        {"model", resolved.display()},
        {"model_source", resolved.source},
        {"model_type", model.config().model_type},
        {"model_fingerprint", model::model_fingerprint(resolved)},
        {"text", o.text},
        {"tokenizer", tokenizer->kind()},
        {"bos_id", tokenizer->bos_id() ? nlohmann::json(*tokenizer->bos_id()) : nlohmann::json(nullptr)},
        {"protocol",
         "one BOS at text start; non-overlapping chunks of seqlen; tail dropped; ppl = exp(mean chunk loss)"},
        {"threads", cpu_threads()},
        {"device", std::string(backend.name())},
        {"dtype", std::string(model::dtype_option_name(model.storage_dtype()))},
        {"host_memory", host_memory},
        {"eval_seconds", result.wall_seconds},
        {"wall_seconds", wall},
        {"symprune", io::build_provenance()},
    };
    io::write_file_atomically(o.report, io::with_utf8_strings(report).dump(2) + "\n");
    log::info("wrote {}", o.report);
  }
}

void add_eval(CLI::App& app) {
  auto options = std::make_shared<EvalOptions>();
  CLI::App* sub =
      app.add_subcommand("eval", "Perplexity on a text file (chunks of --seqlen tokens, one BOS at start)");
  sub->add_option("--model", options->model, model_option_description())->required();
  sub->add_option("--text", options->text, "UTF-8 text file (e.g. wiki.test.hf_rows_joined_nn.txt)")
      ->required();
  CLI::Option* seqlen = sub->add_option("--seqlen", options->seqlen, "tokens per chunk (default 2048)");
  sub->add_option("--report", options->report, "write a JSON report here");
  sub->add_option("--max-chunks", options->max_chunks, "evaluate only the first K chunks (0 = all)");
  sub->add_option("--batch", options->batch, "chunks per forward pass (0 = auto)");
  sub->add_option("--threads", options->threads, "CPU threads (0 = default)");
  sub->add_option("--device", options->device,
                  "auto (a CUDA GPU when one is present, else the CPU; the default), cuda or cpu");
  sub->add_option("--dtype", options->dtype,
                  "what the linear weights and hidden states are kept in: auto (the model's dtype on a GPU, "
                  "fp32 on the CPU; the default), bf16, fp16 (GPU only) or fp32");
  sub->add_option("--tokenizer", options->tokenizer,
                  "tokenizer file or directory (default: the model directory)");
  sub->callback([options, seqlen] {
    options->seqlen_given = seqlen->count() > 0;
    run_eval(*options);
  });
}

}  // namespace
}  // namespace symprune::app

SYMPRUNE_REGISTER_COMMAND(eval, symprune::app::add_eval);
