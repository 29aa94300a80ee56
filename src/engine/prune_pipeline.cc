#include "engine/prune_pipeline.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <memory>

#include "core/activation_stats.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/interrupt.h"
#include "core/log.h"
#include "dist/partition.h"
#include "engine/block_statistics.h"
#include "engine/collective_errors.h"
#include "engine/mask_stage.h"
#include "engine/pruned_model_writer.h"
#include "engine/run_plan.h"
#include "engine/weight_exchange.h"
#include "io/atomic_file.h"
#include "io/calibration.h"
#include "io/model_layout.h"
#include "io/synthetic_model.h"
#include "model/perplexity.h"

namespace symprune::engine {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string utc_timestamp() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

// Stands in for the tokenizer when calibrating from a token file (never asked to encode).
class NoTokenizer : public io::Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view, bool) const override {
    fail("internal: no tokenizer was loaded for token-file calibration");
  }
  std::string decode(const std::vector<int32_t>&) const override { return {}; }
  std::optional<int32_t> bos_id() const override { return std::nullopt; }
  std::optional<int32_t> eos_id() const override { return std::nullopt; }
  int64_t vocab_size() const override { return 0; }
  std::string kind() const override { return "none"; }
};

// NaN/Inf in a linear's dense-pass inputs poison every statistic and mask downstream: name the first one.
void check_finite_stats(const ActivationStats& stats, const std::string& linear, int64_t block) {
  for (size_t c = 0; c < stats.in_sumsq.size(); ++c) {
    SYMPRUNE_CHECK(
        std::isfinite(stats.in_sumsq[c]) && std::isfinite(stats.in_sum[c]),
        "non-finite activations (NaN or Inf) reach the input of {} (input channel {}) in the dense "
        "pass of block {}: the weights of the blocks before it or the calibration data make the "
        "fp32 forward overflow",
        linear, c, block);
  }
  for (size_t r = 0; r < stats.out_sumsq.size(); ++r)
    SYMPRUNE_CHECK(std::isfinite(stats.out_sumsq[r]),
                   "non-finite activations (NaN or Inf) in the output of {} (output channel {}) in the dense "
                   "pass of block {}",
                   linear, r, block);
}

std::string block_prefix(const io::ModelConfig& config, int64_t block) {
  return config.family == io::ModelFamily::kLlama ? "model.layers." + std::to_string(block) + "."
                                                  : "model.decoder.layers." + std::to_string(block) + ".";
}

// This rank's calibration windows, embedded: H [windows · T, d].
struct Calibration {
  Tensor hidden;
  int64_t windows = 0;  // this rank's
  std::string fingerprint;
  std::string format;
};

// Stage: draw the windows (every rank draws all of them: the sampler is cheap and exactly reproducible)
// and embed this rank's chunks.
Calibration calibrate(const PruneConfig& c, RunPlan& plan, dist::Communicator& comm) {
  Calibration out;
  io::CalibrationSet set;
  if (plan.calib_format == "synthetic") {
    set.tokens = io::synthetic_tokens(c.seed, c.nsamples, plan.seqlen, plan.model->vocab_size());
    set.nsamples = c.nsamples;
    set.seqlen = plan.seqlen;
    set.format = "synthetic";
    set.fingerprint = io::tokens_fingerprint(set.tokens);
  } else {
    io::CalibrationOptions co;
    co.file = c.calib;
    co.nsamples = c.nsamples;
    co.seqlen = plan.seqlen;
    co.seed = c.seed;
    co.format = c.calib_format;  // as given: a .bin chosen by name gets its content checked
    const NoTokenizer no_tokenizer;
    const io::Tokenizer& tokenizer =
        plan.tokenizer ? *plan.tokenizer : static_cast<const io::Tokenizer&>(no_tokenizer);
    set = io::load_calibration(co, tokenizer, plan.model->vocab_size());
  }
  out.fingerprint = set.fingerprint;
  out.format = set.format;
  const int64_t chunks = (set.nsamples + plan.micro_batch - 1) / plan.micro_batch;
  const dist::Range mine = dist::partition(chunks, comm.size(), comm.rank());
  const int64_t first = std::min(mine.begin * plan.micro_batch, set.nsamples);
  out.windows = std::min(mine.end * plan.micro_batch, set.nsamples) - first;
  if (out.windows > 0) {
    const auto tokens =
        std::span<const int32_t>(set.tokens)
            .subspan(static_cast<size_t>(first * set.seqlen), static_cast<size_t>(out.windows * set.seqlen));
    out.hidden = plan.model->embed(tokens, out.windows, set.seqlen);
  }
  log::info("calibration: {} windows of {} tokens from {} ({}), {} per forward pass{}", set.nsamples,
            set.seqlen, c.calib, set.format, plan.micro_batch,
            comm.size() > 1 ? fmt::format(", {} chunks over {} ranks", chunks, comm.size()) : std::string());
  return out;
}

// Stage: the dense block on this rank's windows, observed; then the statistics of all ranks combined.
std::unique_ptr<BlockStatistics> dense_pass(RunPlan& plan, dist::Communicator& comm, Calibration& calib,
                                            int64_t b) {
  auto stats = std::make_unique<BlockStatistics>(comm, *plan.model, b, plan.seqlen, plan.needs_output,
                                                 plan.collect_gram);
  if (calib.windows > 0) {
    Tensor dense = calib.hidden;
    plan.model->run_block(b, dense, calib.windows, plan.seqlen, stats.get());
  }
  return stats;
}

// Every rank's evaluation NLLs, gathered in chunk order.
model::PerplexityResult gather_perplexity(dist::Communicator& comm, model::PerplexityStream& stream,
                                          const std::vector<double>& local, int64_t* bytes) {
  std::vector<int64_t> counts(static_cast<size_t>(comm.size()), 0);
  counts[static_cast<size_t>(comm.rank())] = static_cast<int64_t>(local.size() * sizeof(double));
  comm.all_reduce_sum(counts);
  std::vector<double> all(static_cast<size_t>(stream.chunks()));
  comm.all_gather_v(std::as_bytes(std::span<const double>(local)), counts,
                    std::as_writable_bytes(std::span<double>(all)));
  if (comm.size() > 1) *bytes += static_cast<int64_t>(all.size() * sizeof(double));
  return model::perplexity_from_chunks(std::move(all), stream.tokens(), stream.seqlen());
}

// Logs the final evaluation's batches, at most every 2 s and at the end:
// "pruned perplexity: chunks 64/777 (5.1 s, ETA 57.0 s)".
model::PerplexityProgress eval_progress(const char* which, Clock::time_point start) {
  auto last = std::make_shared<Clock::time_point>(start);
  return [which, start, last](int64_t done, int64_t total) {
    if (done < total && seconds_since(*last) < 2.0) return;
    *last = Clock::now();
    const double elapsed = seconds_since(start);
    log::info("{} perplexity: chunks {}/{} ({:.1f} s, ETA {:.1f} s)", which, done, total, elapsed,
              elapsed / static_cast<double>(done) * static_cast<double>(total - done));
  };
}

// Stops every rank at the same point: a signal on any rank stops all (core/interrupt.h).
void stopping_point(dist::Communicator& comm) {
  agree_on_interrupts(comm);
}

}  // namespace

nlohmann::json PruneResult::report() const {
  nlohmann::json layer_list = nlohmann::json::array();
  for (const auto& l : layers) {
    layer_list.push_back(
        {{"name", l.name},
         {"shape", l.shape},
         {"sparsity", l.sparsity},
         {"pruned", l.pruned},
         {"recon_error", l.recon_error ? nlohmann::json(*l.recon_error) : nlohmann::json()}});
    if (l.refine) {
      layer_list.back()["refine"] = {
          {"swaps", l.refine->swaps},
          {"mean_abs_error_before", l.refine->mean_abs_error_before},
          {"mean_abs_error_after", l.refine->mean_abs_error_after},
          {"rows_reverted", l.refine->rows_reverted},
          {"recon_sq_change",
           l.refine->recon_sq_change ? nlohmann::json(*l.refine->recon_sq_change) : nlohmann::json()},
          {"recon_error_initial",
           l.recon_error_initial ? nlohmann::json(*l.recon_error_initial) : nlohmann::json()}};
    } else {
      layer_list.back()["refine"] = nullptr;
    }
  }
  nlohmann::json j = {
      {"command", "prune"},
      {"config", config},
      {"seed", config.value("seed", nlohmann::json(0))},
      {"fingerprints",
       {{"model", model_fingerprint},
        {"calibration",
         calibration_fingerprint.empty() ? nlohmann::json() : nlohmann::json(calibration_fingerprint)}}},
      {"model_dir", model_dir.string()},
      {"mask", mask_description},
      {"sparsity",
       {{"total", sparsity_total()},
        {"target", sparsity_target},
        {"pruned", pruned_total},
        {"params", params_total}}},
      {"layers", layer_list},
      {"timings",
       {{"calibration", timings.calibration},
        {"weights", timings.weights},
        {"blocks", timings.blocks},
        {"statistics", timings.statistics},
        {"scores_masks", timings.scores_masks},
        {"refine", timings.refine},
        {"write", timings.write},
        {"eval_dense", timings.eval_dense},
        {"eval_pruned", timings.eval_pruned},
        {"total", timings.total}}},
      {"communication_bytes",
       {{"weights", communication.weights},
        {"statistics", communication.statistics},
        {"grams", communication.grams},
        {"masks", communication.masks},
        {"eval", communication.eval}}},
      {"symprune", io::build_provenance()},
  };
  if (incomplete) j["incomplete"] = *incomplete;
  if (perplexity) {
    j["perplexity"] = {{"dense", perplexity->dense},
                       {"pruned", incomplete ? nlohmann::json() : nlohmann::json(perplexity->pruned)},
                       {"seqlen", perplexity->seqlen},
                       {"chunks", perplexity->chunks}};
  }
  return j;
}

PruneResult prune_model(const PruneConfig& c, const ProgressFn& progress) {
  const auto local = dist::make_local_communicator();
  return prune_model(c, *local, progress);
}

PruneResult prune_model(const PruneConfig& c, dist::Communicator& comm, const ProgressFn& progress) {
  const auto start = Clock::now();
  set_cpu_threads(c.threads);
  PruneResult result;

  // --- Validate and resolve (every rank; the output is locked by rank 0).
  RunPlan plan = plan_run(c, comm);
  model::DecoderModel& model = *plan.model;
  const io::ModelConfig& mc = model.config();
  result.model_dir = plan.resolved.is_synthetic() ? fs::path(plan.resolved.display()) : plan.resolved.dir;
  result.model_fingerprint = plan.model_fingerprint;
  result.mask_description = plan.mask_description;
  result.sparsity_target = plan.sparsity_target;
  result.config = plan.config;

  // --- Calibration and embeddings (activation-aware methods only).
  Calibration calib;
  if (plan.needs_stats) {
    const auto t = Clock::now();
    agree_on_errors(comm, [&] { calib = calibrate(c, plan, comm); });
    result.calibration_fingerprint = calib.fingerprint;
    result.config["calib_format"] = calib.format;
    result.timings.calibration = seconds_since(t);
  }

  // --- Evaluation streams: the dense and the pruned model, block by block beside the pruning.
  std::unique_ptr<model::PerplexityStream> dense_eval, pruned_eval;
  if (plan.evaluate) {
    dense_eval = std::make_unique<model::PerplexityStream>(model, plan.eval_tokens, plan.eval_options,
                                                           comm.size(), comm.rank());
    pruned_eval = std::make_unique<model::PerplexityStream>(model, plan.eval_tokens, plan.eval_options,
                                                            comm.size(), comm.rank());
  }

  // --- Block by block.
  std::map<std::string, PackedMask> masks;  // stored tensor name -> mask, one bit per weight
  BlockWeightExchange weights(comm, model);
  const auto blocks_start = Clock::now();
  for (int64_t b = 0; b < model.num_blocks(); ++b) {
    const auto block_start = Clock::now();
    stopping_point(comm);
    fault::at("block:" + std::to_string(b), comm.rank());
    {
      const auto t = Clock::now();
      weights.load(b, b + 1);
      result.timings.weights += seconds_since(t);
    }
    std::unique_ptr<BlockStatistics> stats;
    if (plan.needs_stats) {
      const auto t = Clock::now();
      stats = dense_pass(plan, comm, calib, b);
      result.timings.blocks += seconds_since(t);
      const auto tr = Clock::now();
      stats->reduce();
      result.timings.statistics += seconds_since(tr);
      result.communication.statistics += stats->stats_bytes();
      result.communication.grams += stats->gram_bytes();
    }
    if (dense_eval) {
      const auto t = Clock::now();
      dense_eval->run_block(b);
      result.timings.eval_dense += seconds_since(t);
    }

    // Scores, masks and refinement of every linear, all from the dense block; then the block is pruned.
    const auto ts = Clock::now();
    const model::BlockWeights& block = model.block_weights(b);
    std::vector<std::pair<model::LinearId, Tensor>> pruned_weights;
    double refine_seconds = 0.0;
    for (const auto& name : model.linear_names()) {
      const model::LinearId id{b, name};
      const Tensor& w = block.linears.at(name).weight;
      const ActivationStats* linear_stats = stats ? &stats->stats(name) : nullptr;
      if (linear_stats) check_finite_stats(*linear_stats, id.to_string(), b);
      LinearMask lm =
          prune_linear(comm, plan.mask, b, name, w, linear_stats, stats ? stats->gram(name) : nullptr);
      refine_seconds += lm.refine_seconds;
      result.communication.masks += comm.size() > 1 ? lm.mask_bytes : 0;
      LayerResult layer;
      layer.name = id.to_string();
      layer.shape = w.shape();
      layer.pruned = lm.pruned;
      layer.sparsity = lm.mask.sparsity();
      layer.recon_error = lm.recon_error;
      layer.recon_error_initial = lm.recon_error_initial;
      layer.refine = lm.refine;
      result.pruned_total += layer.pruned;
      result.params_total += w.numel();
      result.layers.push_back(layer);
      Tensor pruned = w;
      lm.mask.apply(pruned);
      pruned_weights.emplace_back(id, std::move(pruned));
      const std::string canonical = block_prefix(mc, b) + name + ".weight";
      const auto stored_name = io::stored_tensor_name(model.tensors(), canonical);
      SYMPRUNE_ASSERT(stored_name.has_value(), "tensor {} vanished from {}", canonical,
                      model.tensors().description());
      masks.emplace(*stored_name, PackedMask::of(lm.mask));
    }
    for (auto& [id, w] : pruned_weights) model.set_linear_weight(id, std::move(w));
    result.timings.refine += refine_seconds;
    result.timings.scores_masks += seconds_since(ts) - refine_seconds;

    if (plan.needs_stats && calib.windows > 0) {
      const auto t = Clock::now();
      stats.reset();
      model.run_block(b, calib.hidden, calib.windows, plan.seqlen);  // the next block's inputs
      result.timings.blocks += seconds_since(t);
    }
    if (pruned_eval) {
      const auto t = Clock::now();
      pruned_eval->run_block(b);
      result.timings.eval_pruned += seconds_since(t);
    }
    model.release_block(b);  // memory does not grow with depth: masks are kept as bits only

    BlockProgress p{b, model.num_blocks(), seconds_since(start), seconds_since(block_start), 0.0};
    p.eta_seconds =
        seconds_since(blocks_start) / static_cast<double>(b + 1) * static_cast<double>(p.blocks - b - 1);
    log::info("block {}/{} done in {:.1f} s ({:.1f} s elapsed, ETA {:.1f} s)", b + 1, p.blocks,
              p.block_seconds, p.seconds, p.eta_seconds);
    if (progress) progress(p);
  }
  calib.hidden = Tensor();
  result.communication.weights = weights.bytes_exchanged();
  stopping_point(comm);

  // --- Output: each rank writes its shards, rank 0 the rest.
  if (plan.writes_model) {
    const auto t = Clock::now();
    nlohmann::json provenance = io::build_provenance();
    provenance["command"] = "prune";
    provenance["created"] = utc_timestamp();
    provenance["config"] = result.config;
    provenance["fingerprints"] = {{"model", result.model_fingerprint},
                                  {"calibration", result.calibration_fingerprint.empty()
                                                      ? nlohmann::json()
                                                      : nlohmann::json(result.calibration_fingerprint)}};
    std::map<std::string, std::string> extra_files;
    if (plan.resolved.is_synthetic())
      extra_files["config.json"] = io::synthetic_config_json(*plan.resolved.synthetic).dump(2) + "\n";
    write_pruned_model(comm, model.tensors(), plan.resolved.dir, plan.out ? &*plan.out : nullptr, masks,
                       extra_files, provenance);
    result.timings.write = seconds_since(t);
    log::info("wrote {}", c.out.string());
  }

  // --- Evaluation: final norm, head and NLL of every rank's chunks, gathered in chunk order.
  std::optional<interrupt::Interrupted> interrupted;
  if (plan.evaluate) {
    const auto t = Clock::now();
    const auto dense_local = dense_eval->local_chunk_nll(eval_progress("dense", t));
    result.timings.eval_dense += seconds_since(t);
    stopping_point(comm);
    const auto dense = gather_perplexity(comm, *dense_eval, dense_local, &result.communication.eval);
    result.perplexity = PerplexityPair{dense.perplexity, 0.0, dense.seqlen, dense.chunks};
    try {
      log::info("scoring the pruned model's evaluation chunks");
      fault::at("pruned_eval", comm.rank());
      const auto tp = Clock::now();
      const auto pruned_local = pruned_eval->local_chunk_nll(eval_progress("pruned", tp));
      result.timings.eval_pruned += seconds_since(tp);
      stopping_point(comm);
      result.perplexity->pruned =
          gather_perplexity(comm, *pruned_eval, pruned_local, &result.communication.eval).perplexity;
      log::info("perplexity: dense {:.4f}, pruned {:.4f} ({} chunks of {})", result.perplexity->dense,
                result.perplexity->pruned, dense.chunks, dense.seqlen);
    } catch (const interrupt::Interrupted& e) {
      // The model is complete: keep it, and say in the report what is missing.
      interrupted = e;
      result.incomplete = "pruned evaluation interrupted by " + interrupt::signal_name(e.signal());
    }
  }
  result.timings.total = seconds_since(start);

  // --- Report (rank 0).
  agree_on_errors(comm, [&] {
    if (comm.rank() != 0 || c.report.empty()) return;
    try {
      io::write_file_atomically(c.report, result.report().dump(2) + "\n");
    } catch (const Error&) {
      // A run that asked for a report and did not get one has failed: leave no new model behind.
      std::error_code ignored;
      if (plan.out && !plan.out->existed()) fs::remove_all(plan.out->path(), ignored);
      throw;
    }
    log::info("wrote {}{}", c.report.string(), result.incomplete ? " (marked incomplete)" : "");
  });
  if (interrupted) {
    throw interrupt::Interrupted(
        interrupted->signal(),
        fmt::format("the pruned model {} is complete, but its evaluation was not finished{}", c.out.string(),
                    c.report.empty() ? "" : "; the report says so"));
  }
  return result;
}

}  // namespace symprune::engine
