#include "engine/prune_pipeline.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <memory>
#include <numeric>
#include <random>

#include "core/activation_stats.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/interrupt.h"
#include "core/log.h"
#include "core/scores.h"
#include "core/system_memory.h"
#include "dist/partition.h"
#include "engine/block_statistics.h"
#include "engine/checkpoint.h"
#include "engine/collective_errors.h"
#include "engine/mask_stage.h"
#include "engine/pruned_model_writer.h"
#include "engine/run_plan.h"
#include "engine/weight_exchange.h"
#include "io/atomic_file.h"
#include "io/calibration.h"
#include "io/model_layout.h"
#include "io/synthetic_model.h"
#include "io/text_file.h"
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
        "pass of block {}: the weights of this block or of the blocks before it, or the calibration data, "
        "make the fp32 forward overflow",
        linear, c, block);
  }
  for (size_t r = 0; r < stats.out_sumsq.size(); ++r)
    SYMPRUNE_CHECK(std::isfinite(stats.out_sumsq[r]),
                   "non-finite activations (NaN or Inf) in the output of {} (output channel {}) in the dense "
                   "pass of block {}",
                   linear, r, block);
}

// NaN/Inf in a block's tensors or in its linears' reduced statistics, named before any linear is scored and
// under the ranks' agreement: every rank holds the same weights and statistics and finds the same first one,
// and would otherwise throw alone inside the scores (each rank ending the job through MPI_Abort). The norms
// and biases too: a method without a forward pass (magnitude) would copy a NaN norm into the pruned model.
void check_block_is_finite(dist::Communicator& comm, model::DecoderModel& model,
                           const model::BlockWeights& block, const BlockStatistics* stats, int64_t b) {
  agree_on_errors(comm, [&] {
    const std::string prefix = model::block_tensor_prefix(model.config(), b);
    const auto check_tensor = [&](const Tensor& t, const std::string& name) {
      if (t.numel() == 0) return;
      if (const auto bad = model.backend().first_non_finite(t))
        model::fail_non_finite_tensor(prefix + name, t.shape(), bad->index, bad->value);
    };
    for (const auto& [name, tensor] : block.norm_tensors(model.config())) check_tensor(*tensor, name);
    for (const auto& name : model.linear_names()) check_tensor(block.linears.at(name).bias, name + ".bias");
    for (const auto& name : model.linear_names()) {
      const std::string linear = model::LinearId{b, name}.to_string();
      if (stats) check_finite_stats(stats->stats(name), linear, b);
      const Tensor& weight = block.linears.at(name).weight;
      if (const auto bad = model.backend().first_non_finite(weight))
        fail_non_finite_weight(linear, bad->index, weight.dim(1), bad->value);
    }
  });
}

// The written model's zeros per layer ("3.mlp.up_proj" -> its stored tensor's count) and in total.
void record_written_zeros(const model::DecoderModel& model, const WrittenModel& written,
                          PruneResult& result) {
  int64_t total = 0;
  for (LayerResult& layer : result.layers) {
    const size_t dot = layer.name.find('.');
    const std::string stored =
        model.stored_weight_name({std::stoll(layer.name.substr(0, dot)), layer.name.substr(dot + 1)});
    SYMPRUNE_ASSERT(written.zeros.contains(stored), "no zero count for {}", stored);
    layer.zeros = written.zeros.at(stored);
    total += *layer.zeros;
  }
  result.zeros_total = total;
}

// This rank's calibration windows, embedded: H [windows · T, d] (rows first_window.. of the global N).
struct Calibration {
  Tensor hidden;
  int64_t windows = 0;  // this rank's
  int64_t first_window = 0;
  int64_t total_windows = 0;
  std::string fingerprint;
  std::string format;
  std::vector<int32_t> tokens;  // this rank's windows' tokens, until embedded
};

// Stage: draw the windows (every rank draws all of them: the sampler is cheap and exactly reproducible) and
// keep this rank's chunks' tokens.
Calibration load_calibration_windows(const PruneConfig& c, RunPlan& plan, dist::Communicator& comm) {
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
  out.total_windows = set.nsamples;
  const int64_t chunks = (set.nsamples + plan.micro_batch - 1) / plan.micro_batch;
  const dist::Range mine = dist::partition(chunks, comm.size(), comm.rank());
  out.first_window = std::min(mine.begin * plan.micro_batch, set.nsamples);
  out.windows = std::min(mine.end * plan.micro_batch, set.nsamples) - out.first_window;
  out.tokens.assign(set.tokens.begin() + out.first_window * set.seqlen,
                    set.tokens.begin() + (out.first_window + out.windows) * set.seqlen);
  log::info("calibration: {} windows of {} tokens from {} ({}), {} per forward pass{}", set.nsamples,
            set.seqlen, c.calib, set.format, std::min(plan.micro_batch, set.nsamples),
            comm.size() > 1 ? fmt::format(", {} chunks over {} ranks", chunks, comm.size()) : std::string());
  return out;
}

// Stage: embed this rank's windows into H.
void embed_calibration(RunPlan& plan, Calibration& calib) {
  if (calib.windows > 0) calib.hidden = plan.model->embed(calib.tokens, calib.windows, plan.seqlen);
  calib.tokens = {};
}

// Stage: the dense block on this rank's windows, observed; then the statistics of all ranks combined.
std::unique_ptr<BlockStatistics> dense_pass(RunPlan& plan, dist::Communicator& comm, Calibration& calib,
                                            int64_t b) {
  auto stats =
      std::make_unique<BlockStatistics>(comm, *plan.model, b, plan.seqlen, plan.needs_output,
                                        plan.collect_gram, plan.recon_sample_positions, calib.windows);
  if (calib.windows > 0) {
    Tensor dense = plan.model->backend().duplicate(calib.hidden);
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
  return [which, start, pacer = log::ProgressPacer(2.0, start)](int64_t done, int64_t total) mutable {
    if (done < total && !pacer.due(Clock::now())) return;
    const double elapsed = seconds_since(start);
    log::info("{} perplexity: chunks {}/{} ({:.1f} s, ETA {:.1f} s)", which, done, total, elapsed,
              elapsed / static_cast<double>(done) * static_cast<double>(total - done));
  };
}

// Shows a pass through one block as it goes (through the model's micro-batch callback, while it lives): every
// micro-batch at debug level, and at info every log::kProgressLineSeconds ("block 3/32: dense pass: windows
// 48/128 (62.0 s, ETA 103.3 s)"), so that a pass of minutes (7B on CPUs) does not look stalled. The counts
// are this rank's (the log's is rank 0). A device backend's micro-batches are queued, not done, when the
// model calls back: before a line the heartbeat waits for them (Backend::synchronize), so that the count and
// the ETA are of finished work; at info that is once per line, at debug once per micro-batch.
class PassHeartbeat {
 public:
  PassHeartbeat(model::DecoderModel& model, std::string what, const char* unit, int64_t total)
      : model_(model) {
    const auto start = Clock::now();
    model_.set_pass_progress(
        [&backend = model_.backend(), what = std::move(what), unit, total, start, done = int64_t{0},
         pacer = log::ProgressPacer(log::kProgressLineSeconds, start)](int64_t seqs) mutable {
          done += seqs;
          const bool info_due = log::is_root() && done > 0 && done < total && pacer.due(Clock::now());
          if (!info_due && !log::debug_enabled()) return;
          backend.synchronize();
          const double elapsed = seconds_since(start);
          if (info_due)
            log::info("{}: {} {}/{} ({:.1f} s, ETA {:.1f} s)", what, unit, done, total, elapsed,
                      elapsed / static_cast<double>(done) * static_cast<double>(total - done));
          else
            log::debug("{}: {} {}/{} ({:.1f} s)", what, unit, done, total, elapsed);
        });
  }
  ~PassHeartbeat() { model_.set_pass_progress({}); }
  PassHeartbeat(const PassHeartbeat&) = delete;
  PassHeartbeat& operator=(const PassHeartbeat&) = delete;

 private:
  model::DecoderModel& model_;
};

// Every rank must run one command on the same inputs: ranks started with other options (an MPMD launch, a
// per-node recipe) or finding other data (node-local copies) would otherwise mix their rows silently, or
// wait forever in collectives that only some of them call. Collective: rank 0's identity against each
// rank's, an Error on every rank naming the lowest differing rank and each differing field.
void check_every_rank_runs_the_same(dist::Communicator& comm, const nlohmann::json& identity) {
  if (comm.size() == 1) return;
  std::string root = identity.dump();
  int64_t length = static_cast<int64_t>(root.size());
  comm.broadcast(std::as_writable_bytes(std::span<int64_t>(&length, 1)), 0);
  root.resize(static_cast<size_t>(length));
  comm.broadcast(std::as_writable_bytes(std::span<char>(root.data(), root.size())), 0);
  agree_on_errors(comm, [&] {
    const auto diff = identity_difference(nlohmann::json::parse(root), identity, "rank 0",
                                          fmt::format("rank {}", comm.rank()));
    if (diff)
      fail(
          "the ranks were not started with the same options and inputs ({}): every rank must run the same "
          "command on the same model and data",
          *diff);
  });
}

// What check_every_rank_runs_the_same compares: the resolved configuration, the report's path (only rank 0
// writes it: another on a rank would be ignored without a word) and the inputs' fingerprints, but not what
// may differ per node (CPU threads; where the model and data were found, as the fingerprints compare their
// contents).
nlohmann::json rank_identity(const RunPlan& plan, const fs::path& report,
                             const nlohmann::json& fingerprints) {
  nlohmann::json config = plan.config;
  for (const char* key : {"threads", "model", "model_dir", "model_source", "calib", "eval", "tokenizer"})
    config.erase(key);
  config["report"] = report.empty() ? nlohmann::json() : nlohmann::json(report.string());
  return {{"config", config}, {"fingerprints", fingerprints}};
}

// Stops every rank at the same point: a signal on any rank stops all (core/interrupt.h).
void stopping_point(dist::Communicator& comm) {
  agree_on_interrupts(comm);
}

template <typename T>
nlohmann::json optional_json(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
}

template <typename T>
std::optional<T> json_optional(const nlohmann::json& j, const char* key) {
  return j.contains(key) && !j.at(key).is_null() ? std::optional<T>(j.at(key).get<T>()) : std::nullopt;
}

// A layer's report entry (also how a checkpoint keeps it, read back by layer_from_json).
nlohmann::json layer_json(const LayerResult& l) {
  nlohmann::json j = {{"name", l.name},
                      {"shape", l.shape},
                      {"sparsity", l.sparsity},
                      {"pruned", l.pruned},
                      {"recon_error", optional_json(l.recon_error)},
                      {"zeros", optional_json(l.zeros)},
                      {"refine", nullptr}};
  if (l.refine)
    j["refine"] = {{"swaps", l.refine->swaps},
                   {"mean_abs_error_before", l.refine->mean_abs_error_before},
                   {"mean_abs_error_after", l.refine->mean_abs_error_after},
                   {"rows_reverted", l.refine->rows_reverted},
                   {"recon_sq_change", optional_json(l.refine->recon_sq_change)},
                   {"recon_error_initial", optional_json(l.recon_error_initial)}};
  return j;
}

LayerResult layer_from_json(const nlohmann::json& j) {
  LayerResult l;
  l.name = j.at("name").get<std::string>();
  l.shape = j.at("shape").get<std::vector<int64_t>>();
  l.sparsity = j.at("sparsity").get<double>();
  l.pruned = j.at("pruned").get<int64_t>();
  l.recon_error = json_optional<double>(j, "recon_error");
  l.zeros = json_optional<int64_t>(j, "zeros");
  if (const auto& r = j.at("refine"); !r.is_null()) {
    RefineStats stats;
    stats.swaps = r.at("swaps").get<int64_t>();
    stats.mean_abs_error_before = r.at("mean_abs_error_before").get<double>();
    stats.mean_abs_error_after = r.at("mean_abs_error_after").get<double>();
    stats.rows_reverted = r.at("rows_reverted").get<int64_t>();
    stats.recon_sq_change = json_optional<double>(r, "recon_sq_change");
    l.refine = stats;
    l.recon_error_initial = json_optional<double>(r, "recon_error_initial");
  }
  return l;
}

// The report's timing and traffic fields. `resumed_adds`: a resumed run adds the earlier attempts' value
// (total is summed on its own; the output is written once, by the last attempt). `per_block`: a block's
// timings (BlockTimings) hold it too; not the checkpoint, whose snapshot of a block is taken after the
// block's timings are recorded, so that the checkpoint holds them.
struct TimingField {
  double PruneTimings::*member;
  const char* key;
  bool resumed_adds;
  bool per_block;
};
constexpr std::array<TimingField, 14> kTimingFields{
    {{&PruneTimings::calibration, "calibration", true, false},
     {&PruneTimings::weights, "weights", true, true},
     {&PruneTimings::blocks, "blocks", true, true},
     {&PruneTimings::dense_pass, "dense_pass", true, true},
     {&PruneTimings::pruned_pass, "pruned_pass", true, true},
     {&PruneTimings::statistics, "statistics", true, true},
     {&PruneTimings::scores_masks, "scores_masks", true, true},
     {&PruneTimings::refine, "refine", true, true},
     {&PruneTimings::write, "write", false, false},
     {&PruneTimings::eval_dense, "eval_dense", true, true},
     {&PruneTimings::eval_pruned, "eval_pruned", true, true},
     {&PruneTimings::checkpoint, "checkpoint", true, false},
     {&PruneTimings::checkpoint_background, "checkpoint_background", true, false},
     {&PruneTimings::total, "total", false, false}}};
struct CommunicationField {
  int64_t CommunicationVolume::*member;
  const char* key;
};
constexpr std::array<CommunicationField, 5> kCommunicationFields{
    {{&CommunicationVolume::weights, "weights"},
     {&CommunicationVolume::statistics, "statistics"},
     {&CommunicationVolume::grams, "grams"},
     {&CommunicationVolume::masks, "masks"},
     {&CommunicationVolume::eval, "eval"}}};

nlohmann::json timings_json(const PruneTimings& t) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : kTimingFields) j[f.key] = t.*f.member;
  return j;
}

nlohmann::json block_timings_json(const std::vector<BlockTimings>& blocks) {
  nlohmann::json list = nlohmann::json::array();
  for (const BlockTimings& b : blocks) {
    nlohmann::json j = {{"block", b.block}, {"seconds", b.seconds}};
    for (const auto& f : kTimingFields)
      if (f.per_block) j[f.key] = b.stages.*f.member;
    list.push_back(std::move(j));
  }
  return list;
}

std::vector<BlockTimings> block_timings_from_json(const nlohmann::json& list) {
  std::vector<BlockTimings> blocks;
  for (const auto& j : list) {
    BlockTimings b{j.at("block").get<int64_t>(), j.at("seconds").get<double>(), {}};
    for (const auto& f : kTimingFields)
      if (f.per_block) b.stages.*f.member = j.value(f.key, 0.0);
    blocks.push_back(b);
  }
  return blocks;
}

nlohmann::json communication_json(const CommunicationVolume& c) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : kCommunicationFields) j[f.key] = c.*f.member;
  return j;
}

// The report's "device_memory" (collective: every rank calls it, with a device plan or not): the largest plan
// and peaks and the smallest free and available memory (what the plan was checked against) over the ranks,
// the device's size and rank 0's plan by term; null when no rank planned device memory. The peaks count the
// backend's own allocations, not the libraries' (DeviceMemory).
nlohmann::json device_memory_json(dist::Communicator& comm, const RunPlan& plan, Backend& backend) {
  struct RankMemory {  // bytes; -1 on a rank without a device plan
    int64_t planned = -1, available = -1, free_at_start = -1, peak_used = -1, peak_reserved = -1, total = -1;
  };
  RankMemory local;
  const bool planned = plan.device_plan && plan.device_at_start;
  std::optional<DeviceMemory> now;
  if (planned) {
    now = backend.device_memory();
    local = {static_cast<int64_t>(plan.device_plan->total()),
             static_cast<int64_t>(plan.device_available),
             plan.device_at_start->free,
             now ? now->peak_used : -1,
             now ? now->peak_reserved : -1,
             plan.device_at_start->total};
  }
  std::vector<RankMemory> ranks(static_cast<size_t>(comm.size()));
  comm.all_gather(std::as_bytes(std::span<const RankMemory>(&local, 1)),
                  std::as_writable_bytes(std::span<RankMemory>(ranks)));
  if (!planned) return nullptr;
  RankMemory worst = local;
  for (const RankMemory& r : ranks) {
    worst.planned = std::max(worst.planned, r.planned);
    worst.available = std::min(worst.available, r.available);
    worst.free_at_start = std::min(worst.free_at_start, r.free_at_start);
    worst.peak_used = std::max(worst.peak_used, r.peak_used);
    worst.peak_reserved = std::max(worst.peak_reserved, r.peak_reserved);
  }
  return {
      {"planned", worst.planned},
      {"available_at_start", worst.available},
      {"free_at_start", worst.free_at_start},
      {"peak_used", worst.peak_used},
      {"peak_reserved", worst.peak_reserved},
      {"total", local.total},
      {"allocator", now && !now->pooled ? "cudaMalloc/cudaFree (no memory pools)" : "stream-ordered pool"},
      {"plan", memory_plan_json(*plan.device_plan)}};
}

// The report's "host_memory" (collective): the largest plan over the ranks (its total and its terms), the
// largest resident size at the plan's check and peak resident size (VmHWM: the whole process, its libraries
// included), and the smallest available memory a plan was checked against (null when none could be read).
nlohmann::json host_memory_json(dist::Communicator& comm, const RunPlan& plan) {
  struct RankMemory {  // bytes; available -1 when unknown
    MemoryPlan terms;
    int64_t available = -1, resident_at_plan = 0, peak_resident = 0;
  };
  RankMemory local{plan.host_plan, plan.host_available ? static_cast<int64_t>(*plan.host_available) : -1,
                   static_cast<int64_t>(plan.host_resident_at_plan),
                   static_cast<int64_t>(peak_resident_bytes().value_or(0))};
  std::vector<RankMemory> ranks(static_cast<size_t>(comm.size()));
  comm.all_gather(std::as_bytes(std::span<const RankMemory>(&local, 1)),
                  std::as_writable_bytes(std::span<RankMemory>(ranks)));
  const auto total = [](const RankMemory& r) { return r.terms.total(); };
  RankMemory worst = local;
  for (const RankMemory& r : ranks) {
    if (total(r) > total(worst)) worst.terms = r.terms;
    if (r.available >= 0 && (worst.available < 0 || r.available < worst.available))
      worst.available = r.available;
    worst.resident_at_plan = std::max(worst.resident_at_plan, r.resident_at_plan);
    worst.peak_resident = std::max(worst.peak_resident, r.peak_resident);
  }
  return {{"planned", total(worst)},
          {"available_at_start", worst.available >= 0 ? nlohmann::json(worst.available) : nlohmann::json()},
          {"resident_at_plan", worst.resident_at_plan},
          {"peak_resident", worst.peak_resident},
          {"plan", memory_plan_json(worst.terms)}};
}

// What a checkpoint saves besides the masks and hidden states: the identity and the report so far.
nlohmann::json checkpoint_state(const nlohmann::json& identity, const PruneResult& result) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : result.layers) layers.push_back(layer_json(l));
  return {{"identity", identity},
          {"layers", layers},
          {"timings", timings_json(result.timings)},
          {"block_timings", block_timings_json(result.block_timings)},
          {"communication", communication_json(result.communication)}};
}

// The report so far, from a checkpoint's state: layers, and the earlier attempts' timings and traffic.
void restore_progress(const nlohmann::json& state, PruneResult& result) {
  try {
    for (const auto& l : state.at("layers")) {
      result.layers.push_back(layer_from_json(l));
      result.pruned_total += result.layers.back().pruned;
      result.params_total += result.layers.back().shape.at(0) * result.layers.back().shape.at(1);
    }
    const auto& t = state.at("timings");
    for (const auto& f : kTimingFields) {
      if (f.resumed_adds) result.timings.*f.member += t.value(f.key, 0.0);
    }
    // Absent in the checkpoints of versions before per-block timings.
    result.block_timings = block_timings_from_json(state.value("block_timings", nlohmann::json::array()));
    const auto& c = state.at("communication");
    for (const auto& f : kCommunicationFields) result.communication.*f.member += c.value(f.key, int64_t{0});
  } catch (const nlohmann::json::exception& e) {
    fail("the checkpoint's report entries are malformed: {}", e.what());
  }
}

// A run id: 16 hex digits drawn on rank 0, the same on every rank.
std::string new_run_id(dist::Communicator& comm) {
  uint64_t id = 0;
  if (comm.rank() == 0) {
    std::random_device device;
    id = (static_cast<uint64_t>(device()) << 32) ^ device() ^
         static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  }
  comm.broadcast(std::as_writable_bytes(std::span<uint64_t>(&id, 1)), 0);
  return fmt::format("{:016x}", id);
}

// Local interrupt checks off for the block loop when checkpointing on one rank: a stop then happens at a
// block boundary, where the state is whole and can be saved (with several ranks they are off anyway).
class BlockBoundaryStops {
 public:
  explicit BlockBoundaryStops(bool active) : active_(active) {
    if (active_) interrupt::set_local_checks(false);
  }
  ~BlockBoundaryStops() {
    if (active_) interrupt::set_local_checks(true);
  }
  BlockBoundaryStops(const BlockBoundaryStops&) = delete;
  BlockBoundaryStops& operator=(const BlockBoundaryStops&) = delete;

 private:
  bool active_;
};

}  // namespace

nlohmann::json PruneResult::fingerprints() const {
  const auto or_null = [](const std::string& f) { return f.empty() ? nlohmann::json() : nlohmann::json(f); };
  return {{"model", model_fingerprint},
          {"calibration", or_null(calibration_fingerprint)},
          {"eval", or_null(eval_fingerprint)}};
}

nlohmann::json PruneResult::report() const {
  nlohmann::json layer_list = nlohmann::json::array();
  for (const auto& l : layers) layer_list.push_back(layer_json(l));
  nlohmann::json j = {
      {"command", "prune"},
      {"config", config},
      {"seed", config.value("seed", nlohmann::json(0))},
      {"fingerprints", fingerprints()},
      {"model_dir", model_dir.string()},
      {"mask", mask_description},
      {"sparsity",
       {{"total", sparsity_total()},
        {"target", sparsity_target},
        {"pruned", pruned_total},
        {"params", params_total},
        {"zeros", optional_json(zeros_total)},
        {"written", zeros_total && params_total > 0 ? nlohmann::json(static_cast<double>(*zeros_total) /
                                                                     static_cast<double>(params_total))
                                                    : nlohmann::json()}}},
      {"layers", layer_list},
      {"timings", timings_json(timings)},
      {"block_timings", block_timings_json(block_timings)},
      {"communication_bytes", communication_json(communication)},
      {"device_memory", device_memory},
      {"host_memory", host_memory},
      {"symprune", io::build_provenance()},
  };
  if (incomplete) j["incomplete"] = *incomplete;
  j["resumed"] = resumed_from
                     ? nlohmann::json{{"checkpoint", resumed_from->string()}, {"block", resumed_block}}
                     : nlohmann::json();
  if (perplexity) {
    // A perplexity beyond a double's range (inf) is null, as in `symprune eval`'s report; its mean NLL says
    // so.
    j["perplexity"] = {
        {"dense", perplexity->dense},
        {"pruned", incomplete ? nlohmann::json() : nlohmann::json(perplexity->pruned)},
        {"dense_mean_nll", perplexity->dense_mean_nll},
        {"pruned_mean_nll", incomplete ? nlohmann::json() : nlohmann::json(perplexity->pruned_mean_nll)},
        {"seqlen", perplexity->seqlen},
        {"chunks", perplexity->chunks}};
  }
  return j;
}

PruneResult prune_model(const PruneConfig& c, const ProgressFn& progress) {
  const auto local = dist::make_local_communicator();
  return prune_model(c, *local, progress);
}

PruneResult prune_model(const PruneConfig& config, dist::Communicator& comm, const ProgressFn& progress) {
  const auto start = Clock::now();
  // --checkpoint through a symbolic link to an existing file is that file: FILE.tmp, FILE.prev and FILE.done
  // go beside it, and installing a checkpoint replaces it, not the link (its target was left behind).
  PruneConfig c = config;
  if (!c.checkpoint.empty()) c.checkpoint = io::output_file_target(c.checkpoint);
  agree_on_errors(comm, [&] { set_cpu_threads(c.threads); });  // one message, not one abort per rank
  PruneResult result;

  // --- Validate and resolve (every rank; the output is locked by rank 0).
  RunPlan plan = plan_run(c, comm);
  check_every_rank_runs_the_same(
      comm, rank_identity(plan, c.report, plan.identity_without_calibration.at("fingerprints")));
  model::DecoderModel& model = *plan.model;
  result.model_dir = plan.resolved.is_synthetic() ? fs::path(plan.resolved.display()) : plan.resolved.dir;
  result.model_fingerprint = plan.model_fingerprint;
  result.eval_fingerprint = plan.eval_fingerprint;
  result.mask_description = plan.mask_description;
  result.sparsity_target = plan.sparsity_target;
  result.config = plan.config;

  if (plan.already_complete) {
    log::info("--resume: {} marks this run as finished: nothing to do",
              checkpoint_marker(c.resume == "auto" ? c.checkpoint : fs::path(c.resume)).string());
    result.already_complete = true;
    return result;
  }

  // --- Calibration windows (activation-aware methods only).
  Calibration calib;
  if (plan.needs_stats) {
    const auto t = Clock::now();
    agree_on_errors(comm, [&] { calib = load_calibration_windows(c, plan, comm); });
    check_every_rank_runs_the_same(comm, {{"calibration", calib.fingerprint}});
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
  const int64_t d = model.hidden_size();
  const std::vector<int64_t> calib_shape = {calib.total_windows, plan.seqlen, d};
  const std::vector<int64_t> eval_shape =
      plan.evaluate ? std::vector<int64_t>{dense_eval->chunks(), dense_eval->seqlen(), d}
                    : std::vector<int64_t>{};

  // --- Resume: the state entering the checkpoint's next block, from a checkpoint of this very run.
  nlohmann::json identity = plan.identity_without_calibration;
  identity["fingerprints"]["calibration"] =
      calib.fingerprint.empty() ? nlohmann::json() : nlohmann::json(calib.fingerprint);
  // Stored tensor name -> mask, one bit per weight, the bits on the rank that writes the tensor.
  ModelMasks masks(model.tensors(), comm.rank(), comm.size());
  int64_t first_block = 0;
  double earlier_total = 0.0;  // seconds of the attempts before a resume
  std::string run_id;
  if (!c.resume.empty()) {
    const auto t = Clock::now();
    auto restore = [&](const io::CheckpointReader& reader) {
      const int64_t next = reader.header().next_block;
      SYMPRUNE_CHECK(reader.header().blocks == model.num_blocks() && next >= 1 && next <= model.num_blocks(),
                     "checkpoint {}: block {} of {} does not fit this model's {} blocks",
                     reader.path().string(), next, reader.header().blocks, model.num_blocks());
      if (plan.needs_stats) {
        auto rows =
            read_checkpoint_rows(reader, "calib_hidden", calib_shape, calib.first_window, calib.windows);
        calib.hidden = calib.windows > 0 ? model.backend().to_backend(
                                               Tensor({calib.windows * plan.seqlen, d}, std::move(rows)),
                                               model.storage_dtype())
                                         : Tensor();
      }
      if (plan.evaluate) {
        dense_eval->restore_hidden(read_checkpoint_rows(
            reader, "eval_dense_hidden", eval_shape, dense_eval->first_chunk(), dense_eval->local_chunks()));
        pruned_eval->restore_hidden(read_checkpoint_rows(reader, "eval_pruned_hidden", eval_shape,
                                                         pruned_eval->first_chunk(),
                                                         pruned_eval->local_chunks()));
      }
    };
    if (auto point = load_resume_point(comm, c.resume, c.checkpoint, identity, masks, restore)) {
      first_block = point->header.next_block;
      run_id = point->header.run_id;
      restore_progress(point->state, result);
      earlier_total = point->state.at("timings").value("total", 0.0);
      result.resumed_from = point->file;
      result.resumed_block = first_block;
    }
    result.timings.checkpoint += seconds_since(t);
  }
  if (run_id.empty()) run_id = new_run_id(comm);
  if (plan.needs_stats && !result.resumed_from) {
    const auto t = Clock::now();
    embed_calibration(plan, calib);
    result.timings.calibration += seconds_since(t);
  }
  calib.tokens = {};

  // --- Checkpoints of the state between blocks.
  std::unique_ptr<Checkpointer> checkpointer;
  if (!c.checkpoint.empty())
    checkpointer =
        std::make_unique<Checkpointer>(comm, c.checkpoint, c.checkpoint_every, model.num_blocks(), run_id);
  const BlockBoundaryStops boundary_stops(checkpointer != nullptr && comm.size() == 1);
  // Starts saving the state entering `next_block` (this rank's rows copied now, written in the background).
  auto save_state = [&](int64_t next_block) {
    const auto t = Clock::now();
    std::vector<CheckpointSlab> slabs;
    if (plan.needs_stats) {
      CheckpointSlab slab{"calib_hidden", calib_shape, calib.first_window, {}};
      if (calib.windows > 0) {
        Tensor copy;
        const Tensor& host = model.backend().host_view(calib.hidden, copy);
        slab.data.assign(host.data(), host.data() + host.numel());
      }
      slabs.push_back(std::move(slab));
    }
    if (plan.evaluate) {
      slabs.push_back(
          {"eval_dense_hidden", eval_shape, dense_eval->first_chunk(), dense_eval->local_hidden()});
      slabs.push_back(
          {"eval_pruned_hidden", eval_shape, pruned_eval->first_chunk(), pruned_eval->local_hidden()});
    }
    result.timings.total = earlier_total + seconds_since(start);
    checkpointer->start(next_block, checkpoint_state(identity, result), masks, std::move(slabs));
    result.timings.checkpoint += seconds_since(t);
  };
  // A stop at the boundary before `next_block`: with checkpoints, the state there is saved first and the
  // run ends with kCheckpointedExitCode.
  auto stop_at_boundary = [&](int64_t next_block) {
    try {
      stopping_point(comm);
    } catch (const interrupt::Interrupted& e) {
      if (!checkpointer) throw;
      result.timings.checkpoint += checkpointer->finish();
      if (next_block > first_block && checkpointer->latest() != next_block) {
        save_state(next_block);
        result.timings.checkpoint += checkpointer->finish();
      }
      const bool saved = next_block > 0;
      throw interrupt::Interrupted(
          e.signal(),
          saved ? fmt::format("blocks 1..{} of {} are saved in checkpoint {}; continue with --resume auto",
                              next_block, model.num_blocks(), c.checkpoint.string())
                : std::string("stopped before the first block; nothing to save"),
          kCheckpointedExitCode);
    }
  };

  // --- Block by block.
  BlockWeightExchange weights(comm, model);
  const auto blocks_start = Clock::now();
  for (int64_t b = first_block; b < model.num_blocks(); ++b) {
    const auto block_start = Clock::now();
    const PruneTimings before_block = result.timings;
    // A stage of a long block (minutes for 7B on CPUs) is logged as it ends, so the log does not look
    // stalled until "block done"; short blocks stay at one line (their stages at debug level).
    const auto stage_done = [&, b](const char* stage, Clock::time_point stage_start) {
      const double seconds = seconds_since(stage_start);
      if (seconds >= 5.0)
        log::info("block {}/{}: {} done in {:.1f} s", b + 1, model.num_blocks(), stage, seconds);
      else
        log::debug("block {}/{}: {} done in {:.1f} s", b + 1, model.num_blocks(), stage, seconds);
    };
    const auto heartbeat = [&, b](const char* pass, const char* unit, int64_t total) {
      return PassHeartbeat(model, fmt::format("block {}/{}: {}", b + 1, model.num_blocks(), pass), unit,
                           total);
    };
    // The checkpoint of the state entering this block, written in the background, becomes FILE once every
    // rank's part is written: asked after each pass and after the masks, so that a kill during this block
    // does not lose it. A collective: every rank asks at the same points, whatever its share of the work.
    const auto install_written_checkpoint = [&] {
      if (checkpointer) result.timings.checkpoint += checkpointer->install_if_written();
    };
    stop_at_boundary(b);
    fault::at("block:" + std::to_string(b), comm.rank());
    {
      const auto t = Clock::now();
      const int64_t exchanged_before = weights.bytes_exchanged();
      weights.load(b, b + 1);
      result.timings.weights += seconds_since(t);
      // Counted block by block, so that a checkpoint's state holds them and a resumed run's report counts
      // every attempt's, like the other volumes.
      result.communication.weights += weights.bytes_exchanged() - exchanged_before;
    }
    std::unique_ptr<BlockStatistics> stats;
    if (plan.needs_stats) {
      const auto t = Clock::now();
      {
        const auto shown = heartbeat("dense pass", "windows", calib.windows);
        stats = dense_pass(plan, comm, calib, b);
        model.backend().synchronize();  // a device's queued kernels are the pass's time, not the next stage's
      }
      const double seconds = seconds_since(t);
      result.timings.dense_pass += seconds;
      result.timings.blocks += seconds;
      const auto tr = Clock::now();
      stats->reduce();
      result.timings.statistics += seconds_since(tr);
      result.communication.statistics += stats->stats_bytes();
      result.communication.grams += stats->gram_bytes();
      stage_done("dense pass and statistics", t);
      install_written_checkpoint();
    }
    if (dense_eval) {
      const auto t = Clock::now();
      {
        const auto shown = heartbeat("dense evaluation pass", "sequences", dense_eval->local_chunks());
        dense_eval->run_block(b);
      }
      result.timings.eval_dense += seconds_since(t);
      stage_done("dense evaluation pass", t);
      install_written_checkpoint();
    }

    // Scores, masks and refinement of every linear, each from its dense weight and the dense pass's
    // statistics. A linear's pruned weight replaces its dense one at once (no other linear's mask reads it),
    // so the block is held once, not dense and pruned side by side (the host memory plan counts it so).
    const auto ts = Clock::now();
    const model::BlockWeights& block = model.block_weights(b);
    check_block_is_finite(comm, model, block, stats.get(), b);
    double refine_seconds = 0.0;
    for (const auto& name : model.linear_names()) {
      const model::LinearId id{b, name};
      const Tensor& w = block.linears.at(name).weight;
      const ActivationStats* linear_stats = stats ? &stats->stats(name) : nullptr;
      LinearMask lm =
          prune_linear(comm, plan.mask, b, name, w, linear_stats, stats ? stats->gram(name) : nullptr,
                       stats ? stats->samples(name) : nullptr);
      refine_seconds += lm.refine_seconds;
      result.communication.masks += comm.size() > 1 ? lm.mask_bytes : 0;
      LayerResult layer;
      layer.name = id.to_string();
      layer.shape = w.shape();
      layer.pruned = lm.pruned;
      layer.sparsity =
          lm.mask.size() == 0 ? 0.0 : static_cast<double>(lm.pruned) / static_cast<double>(lm.mask.size());
      layer.recon_error = lm.recon_error;
      layer.recon_error_initial = lm.recon_error_initial;
      layer.refine = lm.refine;
      result.pruned_total += layer.pruned;
      result.params_total += w.numel();
      result.layers.push_back(layer);
      model.set_linear_weight(id, model.backend().mask_weight(w, lm.mask, MaskedPart::kKept));  // w is gone
      masks.add(model.stored_weight_name(id), PackedMask::of(std::move(lm.mask)));
    }
    result.timings.refine += refine_seconds;
    result.timings.scores_masks += seconds_since(ts) - refine_seconds;
    stage_done(refine_seconds > 0 ? "scores, masks and refinement" : "scores and masks", ts);
    install_written_checkpoint();
    fault::at("masks_done:" + std::to_string(b), comm.rank());

    if (plan.needs_stats && calib.windows > 0) {
      const auto t = Clock::now();
      stats.reset();
      {
        const auto shown = heartbeat("pruned pass", "windows", calib.windows);
        model.run_block(b, calib.hidden, calib.windows, plan.seqlen);  // the next block's inputs
        model.backend().synchronize();
      }
      const double seconds = seconds_since(t);
      result.timings.pruned_pass += seconds;
      result.timings.blocks += seconds;
      stage_done("pruned pass", t);
    }
    // Collective: on every rank, also one that holds no calibration windows (fewer windows than ranks).
    if (plan.needs_stats) install_written_checkpoint();
    if (pruned_eval) {
      const auto t = Clock::now();
      {
        const auto shown = heartbeat("pruned evaluation pass", "sequences", pruned_eval->local_chunks());
        pruned_eval->run_block(b);
      }
      result.timings.eval_pruned += seconds_since(t);
      stage_done("pruned evaluation pass", t);
    }
    model.release_block(b);  // memory does not grow with depth: masks are kept as bits, by their writer

    BlockTimings block_timings{b, seconds_since(block_start), {}};
    for (const auto& f : kTimingFields)
      if (f.per_block) block_timings.stages.*f.member = result.timings.*f.member - before_block.*f.member;
    result.block_timings.push_back(block_timings);
    if (checkpointer && checkpointer->due(b + 1)) save_state(b + 1);

    BlockProgress p{b, model.num_blocks(), seconds_since(start), seconds_since(block_start), 0.0};
    p.eta_seconds = seconds_since(blocks_start) / static_cast<double>(b + 1 - first_block) *
                    static_cast<double>(p.blocks - b - 1);
    log::info("block {}/{} done in {:.1f} s ({:.1f} s elapsed, ETA {:.1f} s)", b + 1, p.blocks,
              p.block_seconds, p.seconds, p.eta_seconds);
    if (progress) progress(p);
  }
  calib.hidden = Tensor();
  stop_at_boundary(model.num_blocks());
  if (checkpointer) {
    result.timings.checkpoint += checkpointer->finish();
    result.timings.checkpoint_background += checkpointer->write_seconds();
  }
  // From here the checkpoint holds every block: a stop while writing or evaluating ends with
  // kCheckpointedExitCode too, so that a requeued job resumes (and writes and evaluates again).
  // A run resumed after its last block saves nothing new: its own checkpoint (FILE, or FILE.prev when FILE
  // was unusable; --resume auto finds either again) already holds every block.
  const auto is_own_checkpoint = [&](const fs::path& file) {
    return file == c.checkpoint || file == previous_checkpoint(c.checkpoint);
  };
  const bool every_block_saved =
      checkpointer && (checkpointer->latest() == model.num_blocks() ||
                       (first_block == model.num_blocks() && is_own_checkpoint(*result.resumed_from)));
  const std::string every_block_saved_note =
      fmt::format("blocks 1..{0} of {0} are saved in checkpoint {1}; continue with --resume auto",
                  model.num_blocks(), c.checkpoint.string());

  // --- Output: each rank writes its shards, rank 0 the rest.
  if (plan.writes_model) {
    const auto t = Clock::now();
    nlohmann::json provenance = io::build_provenance();
    provenance["command"] = "prune";
    provenance["created"] = utc_timestamp();
    provenance["config"] = result.config;
    provenance["run_id"] = run_id;
    provenance["fingerprints"] = result.fingerprints();
    std::map<std::string, std::string> extra_files;
    if (plan.resolved.is_synthetic())
      extra_files["config.json"] = io::synthetic_config_json(*plan.resolved.synthetic).dump(2) + "\n";
    try {
      const WrittenModel written =
          write_pruned_model(comm, model.tensors(), plan.resolved.dir, plan.out ? &*plan.out : nullptr, masks,
                             extra_files, provenance);
      record_written_zeros(model, written, result);
    } catch (const interrupt::Interrupted& e) {
      if (!every_block_saved) throw;
      throw interrupt::Interrupted(e.signal(), every_block_saved_note, kCheckpointedExitCode);
    }
    result.timings.write = seconds_since(t);
    log::info("wrote {}", c.out.string());
  }

  // A run that fails after writing its model (its evaluation or its report) leaves no new model behind: the
  // output is removed, or emptied when it was an empty directory before the run. One that replaced an earlier
  // output (--force, or this run's own from an earlier attempt) is kept, since the earlier one is gone.
  // Returns what became of it, for the error message.
  const auto discard_new_output = [&]() -> std::string {
    if (!plan.out) return {};
    if (plan.out->had_content())
      return fmt::format("; the pruned model {} was kept (it replaced an earlier output)", c.out.string());
    std::error_code ignored;
    if (!plan.out->existed()) {
      fs::remove_all(plan.out->path(), ignored);
    } else {
      for (const auto& entry : fs::directory_iterator(plan.out->path(), ignored))
        fs::remove_all(entry.path(), ignored);
    }
    return fmt::format("; the run failed, so its pruned model {} was removed", c.out.string());
  };

  // --- Evaluation: final norm, head and NLL of every rank's chunks, gathered in chunk order. A chunk's
  // non-finite loss is an error that every rank agrees on (its rank may be any), not one rank's abort.
  // Before each batch the ranks agree whether to stop (a signal on any rank, received even where local
  // checks are off: under a checkpoint every block is saved by now), so a long evaluation stops within one
  // batch with any number of ranks, as in one process.
  std::optional<interrupt::Interrupted> interrupted;
  const auto agreed_batch = [&comm](std::string fault_point) {
    return [&comm, fault_point = std::move(fault_point)](const std::function<void()>& batch) {
      agree_on_errors(comm, [&] {
        if (const int s = interrupt::received(); s != 0) throw interrupt::Interrupted(s);
        fault::at(fault_point, comm.rank());  // tests: a long batch, to be signalled in
        batch();
      });
    };
  };
  if (plan.evaluate) {
    try {
      const auto t = Clock::now();
      std::vector<double> dense_local, pruned_local;
      dense_local = dense_eval->local_chunk_nll(eval_progress("dense", t), agreed_batch("eval_batch:dense"));
      // tests: a signal while the last batch is scored
      agree_on_errors(comm, [&] { fault::at("eval_scored:dense", comm.rank()); });
      result.timings.eval_dense += seconds_since(t);
      // Kept before the stopping point: a signal that arrived while the last batch was scored stops the run
      // after the dense perplexity, not in place of it.
      const auto dense = gather_perplexity(comm, *dense_eval, dense_local, &result.communication.eval);
      result.perplexity = PerplexityPair{.dense = dense.perplexity,
                                         .seqlen = dense.seqlen,
                                         .chunks = dense.chunks,
                                         .dense_mean_nll = dense.mean_nll};
      stopping_point(comm);
      log::info("scoring the pruned model's evaluation chunks");
      const auto tp = Clock::now();
      // tests: an error in one rank's chunks, agreed on by all
      agree_on_errors(comm, [&] { fault::at("pruned_eval", comm.rank()); });
      pruned_local =
          pruned_eval->local_chunk_nll(eval_progress("pruned", tp), agreed_batch("eval_batch:pruned"));
      agree_on_errors(comm, [&] { fault::at("eval_scored:pruned", comm.rank()); });
      result.timings.eval_pruned += seconds_since(tp);
      // No stopping point after it: what is left (the report) is written either way, and a signal that
      // arrived while the last batch was scored stopped nothing (said at the end).
      const auto pruned = gather_perplexity(comm, *pruned_eval, pruned_local, &result.communication.eval);
      result.perplexity->pruned = pruned.perplexity;
      result.perplexity->pruned_mean_nll = pruned.mean_nll;
      log::info("perplexity: dense {:.4f}, pruned {:.4f} ({} chunks of {})", result.perplexity->dense,
                result.perplexity->pruned, dense.chunks, dense.seqlen);
    } catch (const interrupt::Interrupted& e) {
      // The model is complete: keep it, and say in the report what is missing.
      interrupted = e;
      result.incomplete = std::string(result.perplexity ? "pruned" : "dense and pruned") +
                          " evaluation interrupted by " + interrupt::signal_name(e.signal());
    } catch (const Error& e) {
      const std::string outcome = discard_new_output();
      if (outcome.empty()) throw;
      const std::string message = e.what() + outcome;
      if (dynamic_cast<const CollectiveError*>(&e) != nullptr) throw CollectiveError(message);
      throw Error(message);
    }
  }
  result.timings.total = earlier_total + seconds_since(start);  // all attempts, like the other timings
  result.device_memory = device_memory_json(comm, plan, model.backend());
  result.host_memory = host_memory_json(comm, plan);

  // --- Report (rank 0).
  agree_on_errors(comm, [&] {
    if (comm.rank() != 0 || c.report.empty()) return;
    try {
      fault::at("report");
      io::write_file_atomically(c.report, io::with_utf8_strings(result.report()).dump(2) + "\n");
    } catch (const Error& e) {
      // A run that asked for a report and did not get one has failed: its model goes, and the message says
      // so.
      const std::string outcome = discard_new_output();
      if (outcome.empty()) throw;
      throw Error(e.what() + outcome);
    }
    log::info("wrote {}{}", c.report.string(), result.incomplete ? " (marked incomplete)" : "");
  });
  // A finished run leaves a marker, so that running the same command again does nothing.
  if (checkpointer && !interrupted)
    agree_on_errors(comm, [&] {
      checkpointer->mark_complete(
          {{"identity", identity},
           {"run_id", run_id},
           {"out", c.out.empty() ? nlohmann::json() : nlohmann::json(c.out.string())},
           {"report", c.report.empty() ? nlohmann::json() : nlohmann::json(c.report.string())},
           {"finished", utc_timestamp()},
           {"symprune", io::build_provenance()}});
    });
  if (interrupted) {
    throw interrupt::Interrupted(
        interrupted->signal(),
        fmt::format("the pruned model {} is complete, but its evaluation was not finished{}{}",
                    c.out.string(), c.report.empty() ? "" : "; the report says so",
                    every_block_saved ? "; " + every_block_saved_note : std::string()),
        every_block_saved ? kCheckpointedExitCode : 0);
  }
  // A signal that came after the last point where the run could stop (while its report or marker was
  // written) stopped nothing: its notice promised a stop, so say how it ended.
  if (const int s = interrupt::received(); s != 0)
    log::warn("{} arrived after the run's last safe point: the run finished, and its outputs are complete",
              interrupt::signal_name(s));
  return result;
}

}  // namespace symprune::engine
