#include "engine/run_plan.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/backend.h"
#include "core/error.h"
#include "core/log.h"
#include "core/system_memory.h"
#include "dist/partition.h"
#include "engine/checkpoint.h"
#include "engine/collective_errors.h"
#include "io/atomic_file.h"
#include "io/calibration.h"
#include "io/checkpoint_file.h"
#include "io/text_file.h"
#include "model/fingerprint.h"

namespace symprune::engine {
namespace fs = std::filesystem;

namespace {

// What the report's reconstruction error is computed from (the report says which).
std::string recon_error_description(const PruneConfig& c, const RunPlan& r) {
  if (!c.recon_error) return "off (--no-recon-error)";
  if (r.recon_sample_positions.empty()) return "none (no calibration forward pass)";
  const auto per_window = static_cast<int64_t>(r.recon_sample_positions.size());
  const std::string what = "||(W-W~)X||_F/||WX||_F on the dense-pass inputs of each block";
  if (per_window == r.seqlen) return what + ", exact: every calibration token";
  return fmt::format(
      "{}, sampled: {} of {} positions of every window (evenly spaced, {} tokens; "
      "--recon-tokens {})",
      what, per_window, r.seqlen, per_window * c.nsamples, c.recon_tokens);
}

constexpr int64_t kDefaultSeqlen = 2048;
// Resident memory per CPU thread beyond the plan's data: the part of OpenBLAS's 128 MiB buffer a product
// touches, the thread's heap arena and stack.
constexpr double kHostThreadBytes = 64.0 * (1 << 20);
// Query rows per attention work item of the CPU backend, each thread with a score buffer of them by the
// sequence's length (cpu_backend.cc).
constexpr double kCpuAttentionQueryRows = 128.0;
constexpr int64_t kDefaultTokensPerPass = 16384;  // calibration tokens per forward pass by default

struct ResolvedMask {
  MaskSpec spec;
  bool compat_ria_fp16 = false;
  std::string group;  // resolved group name for the report: row, layer or N:M
};

ResolvedMask resolve_mask(const PruneConfig& c, ScoreMethod method) {
  ResolvedMask r;
  SYMPRUNE_CHECK(c.compat == "none" || c.compat == "wanda" || c.compat == "ria" || c.compat == "dsnot",
                 "--compat must be none, wanda, ria or dsnot, got '{}'", c.compat);
  SYMPRUNE_CHECK(c.group.empty() || c.group == "row" || c.group == "layer",
                 "--group must be row or layer, got '{}'", c.group);
  SYMPRUNE_CHECK(c.sparsity.has_value() != !c.nm.empty(),
                 "give exactly one of --sparsity R (unstructured) or --nm N:M (semi-structured)");
  r.compat_ria_fp16 = c.compat == "ria";
  if (!c.nm.empty()) {
    SYMPRUNE_CHECK(c.group.empty(), "--group applies to --sparsity only, not to --nm {}", c.nm);
    const NmPattern p = parse_nm(c.nm);
    r.spec = MaskSpec::nm(p);
    r.group = c.nm;
    return r;
  }
  const double rho = *c.sparsity;
  SYMPRUNE_CHECK(rho >= 0.0 && rho < 1.0, "--sparsity {} is outside [0, 1)", rho);
  bool layer = c.group == "layer";
  bool le = false;
  if (c.compat != "none") {
    // DSnoT refines an initial mask chosen per row for every --initial_method, magnitude too
    // (reference-implementations.md §5.2 step 1); its plain magnitude method is Wanda's code (§4.2).
    const bool dsnot_initial = c.compat == "dsnot" && (c.refine == "dsnot" || c.refine == "r2dsnot");
    if (method == ScoreMethod::kMagnitude && dsnot_initial) {
      layer = c.group == "layer";
    } else if (method == ScoreMethod::kMagnitude) {
      layer = true;  // magnitude is per-layer "≤ θ" in every reference repo (§4.2)
      if (c.group == "row")
        log::warn_on_root(
            "--group row is not used: under --compat {} magnitude selects per layer, as every reference "
            "repository does (leave out --compat for per-row magnitude)",
            c.compat);
    } else if (c.compat == "ria" && c.group.empty()) {
      layer = true;  // RIA's default (no --per_outneuron) is per-layer for every method
    }
    le = layer;
  }
  r.spec = layer ? MaskSpec::layer(rho, le) : MaskSpec::row(rho);
  r.group = layer ? "layer" : "row";
  return r;
}

// The options that lower a plan's large terms, for its error message.
// The values of the options that size a prune's plan, for its messages.
struct PlanOptions {
  int64_t nsamples = 0, seqlen = 0;
  int64_t pass_windows = 0;      // calibration windows in a pass (the micro-batch, or the windows there are)
  int64_t eval_pass_seqlen = 0;  // the evaluation sequence's length when an evaluation pass is the largest
  int64_t eval_chunks = 0;
  int64_t recon_tokens = 0;
};

// The options that lower a prune plan's large terms, with their values, for its error message.
std::vector<std::string> plan_remedies(const MemoryPlan& p, const PlanOptions& o) {
  std::vector<std::string> lower;
  if (p.calibration > 0)
    lower.push_back(fmt::format("--nsamples {} or --seqlen {} (calibration states {})", o.nsamples, o.seqlen,
                                format_bytes(p.calibration)));
  if (p.activations > 0)
    lower.push_back(
        o.eval_pass_seqlen > 0
            ? fmt::format("--eval-seqlen {} (activations {}: an evaluation pass)", o.eval_pass_seqlen,
                          format_bytes(p.activations))
            : fmt::format("--micro-batch {} (activations {})", o.pass_windows, format_bytes(p.activations)));
  if (p.evaluation > 0)
    lower.push_back(
        fmt::format("--eval-max-chunks {} (evaluation {})", o.eval_chunks, format_bytes(p.evaluation)));
  if (p.gram > 0)
    lower.push_back(fmt::format("--refine dsnot or r2dsnot without --refine-guard (Gram matrix {})",
                                format_bytes(p.gram)));
  if (p.samples > 0)
    lower.push_back(
        o.recon_tokens == 0
            ? fmt::format("the tokens the reconstruction error reads (--recon-tokens 0 reads every one: give "
                          "1024, or --no-recon-error; reconstruction samples {})",
                          format_bytes(p.samples))
            : fmt::format("--recon-tokens {} or --no-recon-error (reconstruction samples {})", o.recon_tokens,
                          format_bytes(p.samples)));
  return lower;
}

std::string plan_terms(const MemoryPlan& p) {  // "weights and head 1.0 GiB, ..." (the terms not 0)
  std::vector<std::string> terms;
  for (const MemoryTerm& term : kMemoryTerms)
    if (p.*term.bytes > 0) terms.push_back(fmt::format("{} {}", term.label, format_bytes(p.*term.bytes)));
  return fmt::format("{}", fmt::join(terms, ", "));
}

}  // namespace

nlohmann::json memory_plan_json(const MemoryPlan& plan) {
  nlohmann::json terms = nlohmann::json::object();
  for (const MemoryTerm& term : kMemoryTerms) terms[term.key] = plan.*term.bytes;
  return terms;
}

std::optional<double> check_host_memory(const MemoryPlan& p, double held, double margin, int ranks_per_node,
                                        const std::vector<std::string>& lower) {
  const auto free = available_memory_bytes();
  if (!free) return std::nullopt;
  const int ranks = std::max(ranks_per_node, 1);
  const double available = static_cast<double>(*free) / ranks + held - margin;
  log::debug("host memory plan: {} of {} available ({})", format_bytes(p.total()), format_bytes(available),
             plan_terms(p));
  if (p.total() <= available) return available;
  std::vector<std::string> options = lower;
  if (ranks > 1) options.push_back("the ranks per node");
  fail(
      "the run needs about {} of host memory ({}), but only {} are available to it ({} kept free{}): lower "
      "{}",
      format_bytes(p.total()), plan_terms(p), format_bytes(std::max(available, 0.0)), format_bytes(margin),
      ranks > 1 ? fmt::format("; {} ranks of this node share its memory", ranks) : std::string(),
      fmt::join(options, ", or "));
}

namespace {

// A prune's host plan: under `ulimit -v` mappings count, and OpenBLAS maps a 128 MiB buffer per thread at
// its first product and, when that fails, retries forever at full CPU, so that limit is checked first, with
// room for the buffers; then the plan against the memory available (check_host_memory).
std::optional<double> check_prune_host_memory(const MemoryPlan& p, double held, double margin,
                                              const PruneConfig& c, const PlanOptions& options) {
  if (const auto left = address_space_left_bytes()) {
    // Measured on stories260K: a run maps about 160 MiB (1 thread) and 430 MiB (2 threads) after this point:
    // buffers of the threads calling BLAS, heaps of the threads allocating, and the helper threads'. They
    // replace the plan's resident allowance for them (its buffers).
    const int threads = cpu_threads();
    const double blas = blas_address_space_bytes(threads);
    const double data = std::max(p.total() - held - p.buffers, 0.0);
    if (data + blas > static_cast<double>(*left))
      fail(
          "the address-space limit (ulimit -v) leaves {} to this run, but it needs about {}: {} of data "
          "still to allocate ({}) and {} of BLAS buffers and heaps for its {} threads: raise or remove "
          "ulimit -v (it limits mappings, not memory in use), or lower --threads, --nsamples or --seqlen",
          format_bytes(static_cast<double>(*left)), format_bytes(data + blas), format_bytes(data),
          plan_terms(p), format_bytes(blas), threads);
  }
  return check_host_memory(p, held, margin, c.ranks_per_node, plan_remedies(p, options));
}

// What the plan is checked against: this rank's share of the device's free memory (ranks_per_device ranks
// use the device) and what the backend's allocator holds already (the weights loaded so far, which the plan
// counts, and freed memory kept for reuse), less a margin for what no term counts (kernels loaded on first
// use, the pool's fragmentation): 2 % of the device, at least 256 MiB.
double device_memory_margin(const DeviceMemory& memory) {
  return std::max(static_cast<double>(int64_t{256} << 20), 0.02 * static_cast<double>(memory.total));
}
double device_memory_available(const DeviceMemory& memory, int ranks_per_device) {
  return static_cast<double>(memory.free) / std::max(ranks_per_device, 1) + static_cast<double>(memory.held) -
         device_memory_margin(memory);
}

// Before any work on a device: the plan against the memory available to it, with the option that lowers
// each large term. Returns the device's memory as read for the check.
std::optional<DeviceMemory> check_device_memory(Backend& backend, const MemoryPlan& p,
                                                const PlanOptions& options, int ranks_per_device) {
  const auto memory = backend.device_memory();
  if (!memory) return memory;
  const double available = device_memory_available(*memory, ranks_per_device);
  log::info("device memory plan: {} of {} available ({})", format_bytes(p.total()), format_bytes(available),
            plan_terms(p));
  if (p.total() <= available) return memory;
  std::vector<std::string> lower = plan_remedies(p, options);
  if (ranks_per_device > 1) lower.push_back("the ranks per node (or give each its own device)");
  lower.push_back("--device cpu");
  fail(
      "the run needs about {} of {} memory ({}), but only {} of its {} are free for it ({} kept free{}): "
      "lower {}",
      format_bytes(p.total()), backend.name(), plan_terms(p), format_bytes(std::max(available, 0.0)),
      format_bytes(static_cast<double>(memory->total)), format_bytes(device_memory_margin(*memory)),
      ranks_per_device > 1 ? fmt::format("; {} ranks of this node share the device", ranks_per_device)
                           : std::string(),
      fmt::join(lower, ", or "));
}

// The files a checkpoint FILE keeps beside it: each is written, renamed or removed during the run.
std::vector<io::CompanionFile> checkpoint_companions(const fs::path& file) {
  return {{checkpoint_staging(file), "staging file"},
          {previous_checkpoint(file), "previous checkpoint"},
          {checkpoint_marker(file), "completion marker"},
          {io::lock_file_of(file), "lock file"}};
}

// --report must not be one of the checkpoint's files, which the run renames and removes (the report
// would be lost after the work, or replaced by the completion marker).
void check_report_beside_checkpoints(const PruneConfig& c) {
  const fs::path newest = c.resume.empty() || c.resume == "auto" ? c.checkpoint : fs::path(c.resume);
  if (c.report.empty() || newest.empty()) return;
  const auto resolved = [](const fs::path& p) {
    std::error_code ec;
    const fs::path abs = fs::weakly_canonical(fs::absolute(p), ec);
    return ec ? fs::absolute(p).lexically_normal() : abs;
  };
  const fs::path report = resolved(c.report);
  std::vector<io::CompanionFile> files = checkpoint_companions(newest);
  files.push_back({newest, "checkpoint"});
  for (const auto& f : files)
    SYMPRUNE_CHECK(resolved(f.path) != report,
                   "--report {} is the checkpoint's file {}, which the run replaces or removes; write the "
                   "report elsewhere",
                   c.report.string(), f.path.string());
}

// The checkpoint's options, before anything is read.
void check_checkpoint_options(const PruneConfig& c) {
  SYMPRUNE_CHECK(c.checkpoint_every >= 1, "--checkpoint-every must be at least 1, got {}",
                 c.checkpoint_every);
  SYMPRUNE_CHECK(c.resume != "auto" || !c.checkpoint.empty(),
                 "--resume auto continues the checkpoint named by --checkpoint FILE: give --checkpoint too");
  check_report_beside_checkpoints(c);
}

// A fresh start must not overwrite an input or another run's checkpoints. A directory there is no checkpoint
// (not "an earlier run"), and an input is named as one first: "remove it to start over" would be bad advice.
void check_fresh_checkpoint(const PruneConfig& c, const io::InputFootprint& inputs) {
  if (c.checkpoint.empty() || !c.resume.empty()) return;
  std::error_code ec;
  SYMPRUNE_CHECK(!fs::is_directory(c.checkpoint, ec), "--checkpoint {} is a directory; give a file name",
                 c.checkpoint.string());
  io::check_not_input(c.checkpoint, inputs, "--checkpoint", checkpoint_companions(c.checkpoint));
  for (const auto& f : {c.checkpoint, previous_checkpoint(c.checkpoint), checkpoint_marker(c.checkpoint)})
    SYMPRUNE_CHECK(
        !fs::exists(fs::symlink_status(f, ec)),
        "--checkpoint {}: {} exists, from an earlier run: continue that run with --resume auto, or "
        "remove {}, {} and {} to start over",
        c.checkpoint.string(), f.string(), c.checkpoint.string(), previous_checkpoint(c.checkpoint).string(),
        checkpoint_marker(c.checkpoint).string());
}

// The run id in the provenance file of the output directory `out`; empty when there is none (no such file,
// not JSON, written before run ids).
std::string output_run_id(const fs::path& out) {
  std::error_code ec;
  if (!fs::exists(out / io::kProvenanceFile, ec)) return {};
  try {
    return nlohmann::json::parse(io::read_text_file(out / io::kProvenanceFile, "provenance"))
        .value("run_id", std::string());
  } catch (const std::exception&) {
    return {};
  }
}

// Whether --resume finds the completion marker of this very run (then there is nothing to do); a marker of
// another run is an error.
// `weight_files`: the files the pruned model's weights are written to (the input's shards, by name).
bool completed_before(const PruneConfig& c, RunPlan& r, bool root, const io::InputFootprint& inputs,
                      const std::vector<std::string>& weight_files) {
  if (c.resume.empty()) return false;
  const fs::path marker = checkpoint_marker(c.resume == "auto" ? c.checkpoint : fs::path(c.resume));
  std::error_code ec;
  if (!fs::exists(marker, ec)) return false;
  nlohmann::json saved;
  try {
    saved = nlohmann::json::parse(io::read_text_file(marker, "checkpoint marker"));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: the marker of a finished run is not valid JSON ({}): remove it to run again", marker.string(),
         e.what());
  }
  nlohmann::json identity = saved.value("identity", nlohmann::json::object());
  if (identity.contains("fingerprints")) identity["fingerprints"].erase("calibration");
  if (const auto diff = identity_difference(identity, r.identity_without_calibration))
    fail(
        "{} marks a finished run with a different configuration or inputs: {}; remove it (or choose another "
        "--checkpoint) to run this one",
        marker.string(), *diff);
  // "Nothing to do" only while --out still holds the finished run's model (it may have been moved, or
  // --out may name a new directory).
  if (!c.out.empty()) {
    const std::string run_id = output_run_id(c.out);
    SYMPRUNE_CHECK(!run_id.empty() && run_id == saved.value("run_id", std::string()),
                   "{} marks this run as finished, but --out {} does not hold its pruned model (no {} with "
                   "its run id {}): remove the marker to run again",
                   marker.string(), c.out.string(), io::kProvenanceFile,
                   saved.value("run_id", std::string("?")));
    for (const std::string& file : weight_files)
      SYMPRUNE_CHECK(fs::is_regular_file(c.out / file, ec),
                     "{} marks this run as finished, but --out {} does not hold its pruned model ({} is "
                     "missing): remove the marker to run again",
                     marker.string(), c.out.string(), file);
  }
  // Likewise its report: one asked for elsewhere (or removed since) would not be written by doing nothing.
  // Rank 0 wrote it, and only rank 0 may see it (node-local disk): rank 0 checks, and the ranks agree.
  if (root && !c.report.empty()) {
    const nlohmann::json saved_report = saved.value("report", nlohmann::json());
    const std::string written = saved_report.is_string() ? saved_report.get<std::string>() : std::string();
    const bool same =
        !written.empty() &&
        (written == c.report.string() || (fs::exists(written, ec) && fs::equivalent(written, c.report, ec)));
    SYMPRUNE_CHECK(
        same && fs::is_regular_file(c.report, ec),
        "{} marks this run as finished, but --report {} is not its report ({}): remove the marker to "
        "run again",
        marker.string(), c.report.string(),
        written.empty() ? std::string("it wrote none")
        : same          ? std::string("the file is missing")
                        : fmt::format("that is {}", written));
  }
  r.already_complete = true;
  // A run killed between writing the marker and removing its checkpoints left them behind: remove them now
  // (only this run's: their header names the marker's run id).
  if (root && c.resume == "auto") {
    // Under the checkpoint's lock (no other run is using these files); a killed run's lock files go too,
    // unless an input carries one of their names.
    io::check_not_input(c.checkpoint, inputs, "--checkpoint", checkpoint_companions(c.checkpoint));
    if (!c.out.empty()) io::check_output_directory_not_input(c.out, inputs, "--out");
    const io::PathLock checkpoint_lock(c.checkpoint, "--checkpoint");
    if (!c.out.empty()) io::release_stale_output_lock(c.out, "--out");
    if (!c.report.empty()) (void)io::lock_output_file(c.report, "--report", inputs);  // taken and released
    const std::string finished = saved.value("run_id", std::string());
    for (const auto& f :
         {c.checkpoint, previous_checkpoint(c.checkpoint), checkpoint_staging(c.checkpoint)}) {
      if (const auto header = io::peek_checkpoint_header(f); header && header->run_id == finished) {
        fs::remove(f, ec);
        if (!ec) log::info("removed {}, left by this run after it had finished", f.string());
      }
    }
  }
  return true;
}

// With --resume: whether --out holds the output of the run being resumed (its provenance file names a
// run id of the checkpoints), which then may be replaced as with --force (the run was stopped after
// installing it, before finishing).
bool written_by_this_run(const PruneConfig& c) {
  if (c.resume.empty() || c.out.empty()) return false;
  const fs::path newest = c.resume == "auto" ? c.checkpoint : fs::path(c.resume);
  const std::string run_id = output_run_id(c.out);
  if (run_id.empty()) return false;
  for (const auto& f : {newest, previous_checkpoint(newest)})
    if (const auto header = io::peek_checkpoint_header(f); header && header->run_id == run_id) return true;
  return false;
}

// The checkpoint's directory must take files, and hold the new checkpoint beside the previous one.
void check_checkpoint_space(const fs::path& file, int64_t checkpoint_bytes) {
  // A probe of its own name: FILE.tmp may be another run's checkpoint in the making.
  const fs::path dir = file.parent_path().empty() ? fs::path(".") : file.parent_path();
  std::string probe = (dir / io::hidden_name(file.filename().string(), ".probe-XXXXXX")).string();
  const int fd = ::mkstemp(probe.data());
  SYMPRUNE_CHECK(fd >= 0, "--checkpoint {}: cannot write checkpoints there ({}: {})", file.string(),
                 dir.string(), std::strerror(errno));
  ::close(fd);
  std::error_code ec;
  fs::remove(probe, ec);
  // FILE.tmp is replaced by each checkpoint (a killed run's is harmless), and FILE.prev by FILE, but only if
  // they are files: found now, not after the first block.
  const fs::path staging = checkpoint_staging(file);
  const auto staging_status = fs::symlink_status(staging, ec);
  for (const fs::path& kept : {staging, previous_checkpoint(file)}) {
    const auto status = fs::symlink_status(kept, ec);
    SYMPRUNE_CHECK(!fs::exists(status) || fs::is_regular_file(status),
                   "--checkpoint {}: cannot write checkpoints there ({}: {})", file.string(), kept.string(),
                   fs::is_directory(status) ? "Is a directory" : "not a regular file");
  }
  std::optional<uint64_t> available;
  if (const char* forced = std::getenv("SYMPRUNE_DISK_AVAILABLE")) {
    available = std::strtoull(forced, nullptr, 10);
  } else if (struct statvfs st{}; ::statvfs(dir.c_str(), &st) == 0) {
    available = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  }
  // A killed run's FILE.tmp (killed while writing a checkpoint) is replaced by the next one: its space is
  // this run's to use, or a run killed while writing could never resume on a disk sized for it.
  if (struct stat st{}; available && fs::is_regular_file(staging_status) &&
                        ::lstat(staging.c_str(), &st) == 0 && st.st_nlink == 1)
    *available += static_cast<uint64_t>(st.st_blocks) * 512;  // (another link to it would keep its blocks)
  // Peak: the newest, the previous and the one being written; existing ones are among them.
  int existing = 0;
  for (const auto& f : {file, previous_checkpoint(file)}) existing += fs::exists(f, ec) ? 1 : 0;
  // HDF5's metadata and the state add a little to the hidden states and masks.
  const double one = static_cast<double>(checkpoint_bytes) * 1.02 + 256.0 * 1024;
  const double needed = one * (3 - existing);
  if (!available || needed <= static_cast<double>(*available)) return;
  fail(
      "--checkpoint {}: a checkpoint takes up to about {} (hidden states and masks), and the previous one is "
      "kept while the next is written, so {} needs {} free, but has {}: free space, choose another "
      "directory, "
      "write fewer (--checkpoint-every) or lower --nsamples",
      file.string(), format_bytes(one), dir.string(), format_bytes(needed),
      format_bytes(static_cast<double>(*available)));
}

void plan(const PruneConfig& c, dist::Communicator& comm, RunPlan& r) {
  // --- Everything cheap is checked before any weight is read.
  const ScoreMethod method = parse_score_method(c.method);
  ScoreOptions base;
  base.alpha = c.alpha ? *c.alpha : std::numeric_limits<double>::quiet_NaN();
  base.p = c.p;
  base.strategy = c.strategy;
  base.beta = c.beta;
  base.seed = c.method_seed;
  base.matrix_name = "--method " + std::string(score_method_name(method));
  validate_score_options(method, base);
  const ResolvedMask mask = resolve_mask(c, method);
  base.compat_ria_fp16 = mask.compat_ria_fp16;
  base.matrix_name.clear();
  RefineSettings refine = resolve_refine_settings(c);
  if (method == ScoreMethod::kMagnitude) refine.nm_prune_alpha = 0.0;
  if (method == ScoreMethod::kWanda) refine.nm_prune_alpha = std::isnan(base.alpha) ? 1.0 : base.alpha;
  const bool refining = refine.enabled();
  const bool scores_need_stats = score_method_needs_stats(method, base);
  SYMPRUNE_CHECK(!scores_need_stats || !c.calib.empty(),
                 "method {} is activation-aware and needs calibration data: give --calib FILE",
                 score_method_name(method));
  SYMPRUNE_CHECK(!refining || !c.calib.empty(),
                 "--refine {} reads activation statistics and needs calibration data: give --calib FILE",
                 c.refine);
  r.needs_stats = scores_need_stats || refining;
  r.needs_output = score_method_uses_output_stats(method) && r.needs_stats;
  const bool refine_reads_gram = refine.method == "recon" || refine.guard;
  r.collect_gram = r.needs_stats && refine_reads_gram;
  r.mask.report_recon_error = c.recon_error;
  SYMPRUNE_CHECK(c.recon_tokens >= 0, "--recon-tokens must be 0 (all tokens) or positive, got {}",
                 c.recon_tokens);
  SYMPRUNE_CHECK(c.nsamples >= 1, "--nsamples must be at least 1, got {}", c.nsamples);
  SYMPRUNE_CHECK(c.seqlen >= 0, "--seqlen must be at least 1, got {}", c.seqlen);
  SYMPRUNE_CHECK(c.micro_batch >= 0,
                 "--micro-batch must be at least 1 (or 0, the default: 16384 / seqlen), got {}",
                 c.micro_batch);
  SYMPRUNE_CHECK(c.eval_seqlen >= 0, "--eval-seqlen must be at least 2, got {}", c.eval_seqlen);
  SYMPRUNE_CHECK(c.eval_max_chunks >= 0, "--eval-max-chunks must be >= 0, got {}", c.eval_max_chunks);
  check_checkpoint_options(c);

  r.resolved = io::resolve_model(c.model);
  const bool synthetic = r.resolved.is_synthetic();
  SYMPRUNE_CHECK(!c.out.empty() || synthetic,
                 "--out: no output directory given (it may be left out only for a synthetic model)");
  r.writes_model = !c.out.empty();
  io::InputFootprint inputs;
  if (!synthetic) inputs.add_model_directory(r.resolved.dir);
  for (const auto& file : {fs::path(c.calib), fs::path(c.eval), fs::path(c.tokenizer)}) inputs.add_file(file);
  for (const auto& file : c.input_files) inputs.add_file(file);
  if (comm.rank() == 0)
    check_fresh_checkpoint(c, inputs);  // where rank 0 writes it (other nodes may not see it)
  const std::string eval_text =
      c.eval.empty() ? std::string() : io::read_evaluation_text(c.eval, "evaluation text (--eval)");
  if (!r.needs_stats && !c.calib.empty())
    log::info("method {} reads no activations: --calib {} is not used", score_method_name(method), c.calib);

  Backend& backend = c.backend ? *c.backend : cpu_backend();
  r.model = std::make_unique<model::DecoderModel>(model::DecoderModel::open(r.resolved, backend));
  model::DecoderModel& model = *r.model;
  const std::string config_json = model.config_file();
  model.set_storage_dtype(model::resolve_storage_dtype(c.dtype, backend, model.stored_weight_dtype()));
  // T: --seqlen, else 2048; under --compat wanda the Wanda repo's rule, T = max_position_embeddings (the
  // sliding window where that is shorter: longer sequences are refused, ModelConfig::sliding_window).
  r.seqlen = c.seqlen > 0 ? c.seqlen : c.compat == "wanda" ? model.max_seq_len() : kDefaultSeqlen;
  if (r.needs_stats && c.recon_error)
    r.recon_sample_positions = recon_sample_positions(c.recon_tokens, c.nsamples, r.seqlen);
  const int64_t eval_seqlen = c.eval_seqlen > 0 ? c.eval_seqlen : r.seqlen;
  SYMPRUNE_CHECK(c.eval.empty() || eval_seqlen >= 2, "--eval-seqlen must be at least 2, got {}{}",
                 eval_seqlen,
                 c.eval_seqlen > 0 ? "" : " (its default is --seqlen): give --eval-seqlen 2 or more");
  r.model_fingerprint = model::model_fingerprint(r.resolved);
  if (r.needs_stats && c.seqlen == 0)
    SYMPRUNE_CHECK(
        r.seqlen <= model.max_seq_len(),
        "--seqlen defaults to {}, which exceeds {} of {}: pass --seqlen {} (the model's maximum) or less",
        r.seqlen, model.max_seq_len_limit(), config_json, model.max_seq_len());
  if (r.needs_stats)
    SYMPRUNE_CHECK(r.seqlen <= model.max_seq_len(), "--seqlen {} exceeds {} of {}", r.seqlen,
                   model.max_seq_len_limit(), config_json);
  // The evaluation chunk defaults to --seqlen, which itself defaults to 2048: say which value was not given.
  if (!c.eval.empty())
    SYMPRUNE_CHECK(eval_seqlen <= model.max_seq_len(),
                   "--eval-seqlen {} exceeds {} of {}: pass --eval-seqlen {} (the model's maximum) or less",
                   c.eval_seqlen > 0 ? std::to_string(eval_seqlen)
                   : c.seqlen > 0
                       ? fmt::format("defaults to --seqlen, {}, which", eval_seqlen)
                       : fmt::format("defaults to --seqlen, whose default is {}, which", eval_seqlen),
                   model.max_seq_len_limit(), config_json, model.max_seq_len());
  // The chunk of windows per forward pass: fixed by the options, never by the number of ranks, because
  // the statistics are summed chunk by chunk (engine/ordered_reduce.h).
  r.micro_batch = c.micro_batch > 0 ? c.micro_batch : std::max<int64_t>(1, kDefaultTokensPerPass / r.seqlen);
  model.set_max_tokens_per_pass(r.micro_batch * r.seqlen);
  // Every linear shape is the same in each block: check the mask spec against them once, up front.
  for (const auto& shape : model.linear_shapes())
    validate_mask_spec(mask.spec, shape.out, shape.in, "0." + shape.name);

  // Token files need no tokenizer: a model directory without one can still be pruned from them.
  if (r.needs_stats)
    r.calib_format = c.calib == "synthetic"
                         ? "synthetic"
                         : io::resolve_calibration_format(c.calib, c.calib_format, model.vocab_size());
  if (r.needs_stats && r.calib_format == "synthetic") {
    // "synthetic" is a value, not a file name: say so where it could be taken for one.
    if (std::filesystem::exists("synthetic"))
      log::warn(
          "--calib synthetic: uniformly random token ids; the file ./synthetic is not read (name it "
          "./synthetic to calibrate on it)");
    else if (!synthetic)
      log::warn("--calib synthetic: calibrating {} on uniformly random token ids, not on text",
                r.resolved.display());
  }
  const bool token_input =
      r.calib_format == "tokens-u16" || r.calib_format == "tokens-u32" || r.calib_format == "synthetic";
  if ((r.needs_stats && !token_input) || !c.eval.empty()) {
    SYMPRUNE_CHECK(!synthetic || !c.tokenizer.empty(),
                   "{} has no tokenizer: give one with --tokenizer (its vocabulary must fit the model's), or "
                   "calibrate it with --calib synthetic or a token file (.bin)",
                   r.resolved.display());
    r.tokenizer = io::load_tokenizer(c.tokenizer.empty() ? r.resolved.dir : fs::path(c.tokenizer));
  } else if (!c.tokenizer.empty() && log::is_root()) {
    log::warn("--tokenizer {} is not used: only a text --calib and --eval read it", c.tokenizer);
  }
  if (!c.eval.empty()) {
    r.evaluate = true;
    r.eval_tokens = r.tokenizer->encode(eval_text, /*add_bos=*/true);
    SYMPRUNE_CHECK(static_cast<int64_t>(r.eval_tokens.size()) >= eval_seqlen,
                   "--eval {}: {} tokens, fewer than one chunk of {}{}", c.eval, r.eval_tokens.size(),
                   eval_seqlen, io::empty_text_note(eval_text));
    for (size_t i = 0; i < r.eval_tokens.size(); ++i)
      SYMPRUNE_CHECK(r.eval_tokens[i] >= 0 && r.eval_tokens[i] < model.vocab_size(),
                     "--eval {}: token id {} at position {} is outside the model vocabulary of {}", c.eval,
                     r.eval_tokens[i], i, model.vocab_size());
    r.eval_options.seqlen = eval_seqlen;
    r.eval_options.max_chunks = c.eval_max_chunks;
  }
  // Memory per rank: its share of the calibration chunks and of the evaluation chunks.
  const int64_t chunks = (c.nsamples + r.micro_batch - 1) / r.micro_batch;
  const dist::Range mine = dist::partition(chunks, comm.size(), comm.rank());
  const int64_t local_windows =
      std::min(mine.end * r.micro_batch, c.nsamples) - std::min(mine.begin * r.micro_batch, c.nsamples);
  // This rank's evaluation chunks: whole batches of them are split over the ranks (PerplexityStream).
  int64_t eval_tokens = 0, eval_batch = 0;
  if (r.evaluate) {
    int64_t eval_chunks = static_cast<int64_t>(r.eval_tokens.size()) / eval_seqlen;
    if (c.eval_max_chunks > 0) eval_chunks = std::min(eval_chunks, c.eval_max_chunks);
    eval_batch = model::default_batch_sequences(eval_seqlen);
    const dist::Range batches =
        dist::partition((eval_chunks + eval_batch - 1) / eval_batch, comm.size(), comm.rank());
    eval_tokens = (std::min(batches.end * eval_batch, eval_chunks) -
                   std::min(batches.begin * eval_batch, eval_chunks)) *
                  eval_seqlen;
  }
  const int64_t calib_tokens = r.needs_stats ? local_windows * r.seqlen : 0;
  // The reconstruction error's samples: every window's (gathered from all ranks), kept for the block. The
  // host holds those of every input group and this rank's own on either backend (a device run checks only
  // them on the host: its hidden states are on the device); a device one group's at a time.
  const auto per_window = static_cast<int64_t>(r.recon_sample_positions.size());
  const int64_t sample_rows = c.nsamples * per_window;
  const io::ModelConfig& mc = model.config();
  const double sampled_widths =
      static_cast<double>(2 * mc.hidden_size + mc.num_heads * mc.head_dim + mc.intermediate_size);
  const double host_sample_bytes =
      static_cast<double>(sample_rows + local_windows * per_window) * sampled_widths * sizeof(float);
  // A pass runs a micro-batch of this rank's windows, or an evaluation batch's sequences (a micro-batch's
  // tokens at most, one sequence at least); methods without activations and without --eval run none.
  const int64_t calib_pass = r.needs_stats ? std::min(r.micro_batch, local_windows) * r.seqlen : 0;
  const int64_t eval_pass = eval_tokens > 0
                                ? std::min({std::max<int64_t>(1, r.micro_batch * r.seqlen / eval_seqlen),
                                            eval_batch, eval_tokens / eval_seqlen}) *
                                      eval_seqlen
                                : 0;
  const int64_t tokens_per_pass = std::max(calib_pass, eval_pass);
  PlanOptions options;  // for the messages
  options.nsamples = c.nsamples;
  options.seqlen = r.seqlen;
  options.pass_windows = std::max<int64_t>(1, std::min(r.micro_batch, local_windows));
  options.eval_pass_seqlen = eval_pass > calib_pass ? eval_seqlen : 0;
  options.eval_chunks = eval_tokens / std::max<int64_t>(eval_seqlen, 1);
  options.recon_tokens = c.recon_tokens;
  // The host memory plan, checked on every backend (a device run's host keeps its samples, the mask bits
  // and a checkpoint writer's copies).
  HostMemoryShape host;
  host.device_resident = backend.device_resident();
  host.ranks = comm.size();
  host.threads = cpu_threads();
  host.calib_tokens = calib_tokens;
  host.tokens_per_pass = tokens_per_pass;
  host.attention_length = std::max(r.seqlen, r.evaluate ? eval_seqlen : int64_t{0});
  host.eval_tokens = eval_tokens;
  host.eval_batch_tokens = std::min(eval_batch * eval_seqlen, eval_tokens);
  if (r.needs_stats) {
    host.calib_chunks = chunks;
    host.local_chunks = mine.end - mine.begin;
  }
  if (r.collect_gram) {
    const auto shapes = model.linear_shapes();
    for (const auto& group : model.linear_input_groups())
      for (const auto& shape : shapes)
        if (shape.name == group.front()) host.gram_widths.push_back(shape.in);
  }
  host.sample_rows = sample_rows;
  host.sample_bytes = host_sample_bytes;
  host.recon_error = per_window > 0;
  host.refine = refining;
  host.compat_ria = mask.compat_ria_fp16;
  host.checkpoint = !c.checkpoint.empty();
  std::vector<std::pair<std::string, ModelMasks::Shape>> masked;  // every block's linears
  for (int64_t b = 0; b < model.num_blocks(); ++b)
    for (const auto& shape : model.linear_shapes())
      masked.push_back({model.stored_weight_name({b, shape.name}), {shape.out, shape.in}});
  host.kept_mask_bytes =
      static_cast<double>(ModelMasks(model.tensors(), comm.rank(), comm.size()).kept_bytes(masked));
  r.host_plan = plan_host_memory(mc, model.stored_weight_dtype(), host);
  r.host_resident_at_plan = static_cast<double>(resident_bytes().value_or(0));
  // The globals are loaded with the model: the memory available now no longer counts them. A device run's
  // host plan keeps no margin for what the terms leave out.
  r.host_available = check_prune_host_memory(r.host_plan, r.host_plan.globals,
                                             host.device_resident ? 0.0 : kHostMemoryMargin, c, options);
  if (backend.device_resident()) {
    r.device_plan =
        plan_device_memory(mc, model.storage_dtype(), calib_tokens, tokens_per_pass, eval_tokens,
                           comm.size() == 1 ? std::optional(model.stored_weight_dtype()) : std::nullopt,
                           r.collect_gram, sample_rows);
    r.device_at_start = check_device_memory(backend, *r.device_plan, options, c.ranks_per_device);
    if (r.device_at_start)
      r.device_available = device_memory_available(*r.device_at_start, c.ranks_per_device);
    backend.reset_device_memory_peak();  // the report's peak is this run's
  }

  // The mask stage's settings.
  r.mask.backend = &model.backend();
  r.mask.method = method;
  r.mask.score = base;
  r.mask.scores_need_stats = scores_need_stats;
  r.mask.spec = mask.spec;
  r.mask.refine = refine;
  r.mask_description = describe(mask.spec);
  r.sparsity_target = mask.spec.kind == MaskSpec::kNM
                          ? static_cast<double>(mask.spec.n) / static_cast<double>(mask.spec.m)
                          : mask.spec.sparsity;

  // The resolved configuration, recorded in the report (paths as valid UTF-8: see with_utf8_strings).
  const double alpha = resolved_alpha(method, base);
  r.config = io::with_utf8_strings({
      {"model", c.model},
      {"model_dir", r.resolved.display()},
      {"model_source", r.resolved.source},
      {"method", std::string(score_method_name(method))},
      {"alpha", std::isnan(alpha) ? nlohmann::json() : nlohmann::json(alpha)},
      {"p", std::isinf(c.p) ? nlohmann::json("inf") : nlohmann::json(c.p)},  // JSON has no infinity
      {"strategy", c.strategy},
      {"beta", c.beta},
      {"method_seed", c.method_seed},
      {"sparsity", c.sparsity ? nlohmann::json(*c.sparsity) : nlohmann::json()},
      {"group", mask.group},
      {"nm", c.nm.empty() ? nlohmann::json() : nlohmann::json(c.nm)},
      {"mask", r.mask_description},
      {"compat", c.compat},
      {"compat_ria_fp16", mask.compat_ria_fp16},
      {"refine", refine_config_json(refine, !c.nm.empty())},
      {"calib", c.calib.empty() ? nlohmann::json() : nlohmann::json(c.calib)},
      {"calib_used", r.needs_stats},
      {"calib_format", c.calib_format},
      {"tokenizer", c.tokenizer.empty() ? nlohmann::json() : nlohmann::json(c.tokenizer)},
      {"nsamples", c.nsamples},
      {"seqlen", r.seqlen},
      {"seed", c.seed},
      {"micro_batch", r.micro_batch},
      {"out", c.out.empty() ? nlohmann::json() : nlohmann::json(c.out.string())},
      {"force", c.force},
      {"eval", c.eval.empty() ? nlohmann::json() : nlohmann::json(c.eval)},
      {"eval_seqlen", eval_seqlen},
      {"eval_max_chunks", c.eval_max_chunks},
      {"threads", cpu_threads()},
      {"device", std::string(backend.name())},
      {"dtype", std::string(model::dtype_option_name(model.storage_dtype()))},
      {"ranks", comm.size()},
      {"communicator", comm.name()},
      {"checkpoint", c.checkpoint.empty() ? nlohmann::json() : nlohmann::json(c.checkpoint.string())},
      {"checkpoint_every", c.checkpoint_every},
      {"resume", c.resume.empty() ? nlohmann::json() : nlohmann::json(c.resume)},
      {"recon_error", recon_error_description(c, r)},
      {"recon_tokens", c.recon_tokens},
  });
  if (r.evaluate) r.eval_fingerprint = io::tokens_fingerprint(r.eval_tokens);
  r.identity_without_calibration = run_identity(
      r.config,
      {{"model", r.model_fingerprint},
       {"eval", r.eval_fingerprint.empty() ? nlohmann::json() : nlohmann::json(r.eval_fingerprint)}});

  // Outputs are checked (and --out locked, by rank 0) before any block is read: no input may be
  // overwritten, and a path that cannot work must not fail after hours of pruning.
  const std::vector<io::TensorSource::Shard> shards = model.tensors().shards();
  std::vector<std::string> weight_files;
  for (const auto& shard : shards) weight_files.push_back(shard.file);
  if (completed_before(c, r, comm.rank() == 0, inputs, weight_files)) return;
  const int64_t eval_chunks_total =
      r.evaluate ? (c.eval_max_chunks > 0
                        ? std::min<int64_t>(static_cast<int64_t>(r.eval_tokens.size()) / eval_seqlen,
                                            c.eval_max_chunks)
                        : static_cast<int64_t>(r.eval_tokens.size()) / eval_seqlen)
                 : 0;
  if (comm.rank() == 0) {
    if (r.writes_model) r.out.emplace(c.out, inputs, c.force || written_by_this_run(c));
    if (!c.report.empty()) {
      io::check_output_file(c.report, inputs, "--report", r.out ? &*r.out : nullptr);
      r.report_lock = io::lock_output_file(c.report, "--report", inputs);
    }
    if (!c.checkpoint.empty()) {
      io::check_output_file(c.checkpoint, inputs, "--checkpoint", r.out ? &*r.out : nullptr,
                            checkpoint_companions(c.checkpoint));
      int64_t mask_bytes = 0;  // every block's
      for (const auto& [name, shape] : masked) mask_bytes += shape.bytes();
      const int64_t hidden = model.hidden_size() * 4;
      const int64_t size = (r.needs_stats ? c.nsamples * r.seqlen * hidden : 0) +
                           2 * eval_chunks_total * eval_seqlen * hidden + mask_bytes;
      // Each rank's masks start on a checksum unit of their own (checkpoint.cc mask_layout).
      check_checkpoint_space(c.checkpoint, size + (comm.size() - 1) * io::kByteUnit);
      r.checkpoint_lock = std::make_unique<io::PathLock>(c.checkpoint, "--checkpoint");
    }
  } else if (r.writes_model && comm.rank() < static_cast<int>(shards.size())) {
    io::check_output_parent_writable(c.out, "--out");  // this rank writes shards too (pruned_model_writer)
  }
}

}  // namespace

MemoryPlan plan_device_memory(const io::ModelConfig& mc, DType storage, int64_t calib_tokens,
                              int64_t tokens_per_pass, int64_t eval_tokens, std::optional<DType> prefetched,
                              bool gram, int64_t sample_rows) {
  const double f = sizeof(float), s = static_cast<double>(dtype_size(storage));
  const bool low_precision = storage != DType::kF32;
  const double d = static_cast<double>(mc.hidden_size), vocab = static_cast<double>(mc.vocab_size);
  const double kv = static_cast<double>(mc.num_kv_heads * mc.head_dim);
  const double inner = static_cast<double>(mc.intermediate_size);
  MemoryPlan p;
  // Embeddings and the head (OPT: learned positions too).
  p.globals = f * (vocab * d + static_cast<double>(mc.max_position_embeddings + 2) * d) + s * vocab * d;
  // The block, and one linear twice: its pruned copy replaces the dense one as soon as it is made.
  double linears = 0, largest = 0, widest_input = 0;
  for (const auto& e : io::expected_block_tensors(mc, 0)) {
    if (e.shape.size() != 2) continue;  // the linears are a block's matrices (norms are vectors)
    const double size = static_cast<double>(e.shape[0]) * static_cast<double>(e.shape[1]);
    linears += size;
    largest = std::max(largest, size);
    widest_input = std::max(widest_input, static_cast<double>(e.shape[1]));
  }
  p.block_weights = s * (linears + largest);
  // The next block's linears, uploaded in their stored dtype during this block (one rank).
  if (prefetched) p.block_weights += static_cast<double>(dtype_size(*prefetched)) * linears;
  // H of this rank's windows and the dense pass's copy of it.
  p.calibration = s * 2.0 * static_cast<double>(calib_tokens) * d;
  // One micro-batch through a block: its rows, q/k/v, attention, the norms and the MLP's three widths; in
  // lower precision also the fp32 buffer of the states, the 16-bit copies of what is read rounded (the
  // norm's output, q, k, v, the attention's output and the MLP's activation: the CUDA backend's rounded
  // copies) and the attention's tile of scores and probabilities.
  const double tokens = static_cast<double>(tokens_per_pass);
  const double q_width = static_cast<double>(mc.num_heads * mc.head_dim);
  // q and the attention's output are q_width wide (wider than d in Qwen3-0.6B); Qwen3's per-head norms write
  // q and k once more (and, in lower precision, their rounded copies).
  p.activations = f * tokens *
                  (8.0 * d + 2.0 * std::max(0.0, q_width - d) + 2.0 * kv + 4.0 * inner +
                   (mc.qk_norm ? (low_precision ? 1.5 : 1.0) * (q_width + kv) : 0.0));
  if (low_precision && tokens > 0)
    p.activations += f * tokens * d + s * tokens * (d + widest_input + 2.0 * q_width + 2.0 * kv) +
                     // post-norm OPT reads two d-wide storages rounded (the states and the norm's output)
                     (mc.family == io::ModelFamily::kOpt && !mc.do_layer_norm_before ? s * tokens * d : 0.0) +
                     static_cast<double>(kAttentionTileBytes);
  // The dense and the pruned evaluation streams, and one slab of logits.
  p.evaluation = eval_tokens > 0 ? s * 2.0 * static_cast<double>(eval_tokens) * d + f * 512.0 * vocab : 0.0;
  // The scores of the largest matrix, its byte mask and packed bits (kept with the mask), its fp32 copy in
  // lower precision, and DSnoT's scratch.
  p.selection =
      (f + 1.125 + (low_precision ? f : 0.0)) * largest + static_cast<double>(kDeviceRefineScratchBytes);
  // The widest input's Gram matrix XᵀX, computed per chunk on the device and brought to the host.
  if (gram) p.gram = f * widest_input * widest_input;
  // The widest group's samples (fp32) and a block of rows' products with them (mask_stage.h).
  p.samples = f * static_cast<double>(sample_rows) * (widest_input + static_cast<double>(kEnergyBlockRows));
  p.buffers = static_cast<double>(kDeviceConvertBytes + kDeviceLibraryBytes);
  return p;
}

MemoryPlan plan_host_memory(const io::ModelConfig& mc, DType stored, const HostMemoryShape& in) {
  const double f = sizeof(float), R = std::max(in.ranks, 1);
  MemoryPlan p;
  // The inputs the reconstruction error reads (every group's, and this rank's own as they are collected),
  // and on the CPU a linear's copy of its group's and a block of rows' products with them (mask_stage.h).
  p.samples = in.sample_bytes;
  double linears = 0, largest = 0, block = 0, widest_input = 0, chunk_statistics = 0;
  for (const auto& e : io::expected_block_tensors(mc, 0)) {
    double size = 1;
    for (const int64_t extent : e.shape) size *= static_cast<double>(extent);
    block += size;
    if (e.shape.size() != 2) continue;
    linears += size;
    largest = std::max(largest, size);
    widest_input = std::max(widest_input, static_cast<double>(e.shape[1]));
    // A chunk's statistics of the linear (Σx², Σx, per-window sums of its inputs, Σy² of its outputs), in
    // fp64 (BlockStatistics::packed_length).
    chunk_statistics += 8.0 * (3.0 * static_cast<double>(e.shape[1]) + static_cast<double>(e.shape[0]) + 1.0);
  }
  // The mask bits this rank keeps for the output (a checkpoint's writer reads them where they are).
  const double bits = in.kept_mask_bytes.value_or(linears * static_cast<double>(mc.num_layers) / 8.0);
  const double d = static_cast<double>(mc.hidden_size), vocab = static_cast<double>(mc.vocab_size);
  const double calib = static_cast<double>(in.calib_tokens), eval = static_cast<double>(in.eval_tokens);
  if (in.device_resident) {  // the rest is in the device's memory (plan_device_memory)
    if (!in.prunes) return p;
    p.masks = bits;
    // A checkpoint's writer gets fp32 copies of this rank's states (brought to the host, then copied into
    // the slab) and of its evaluation streams.
    if (in.checkpoint) {
      p.calibration = 2.0 * f * calib * d;
      p.evaluation = f * in.eval_streams * eval * d;
    }
    return p;
  }
  if (in.sample_rows > 0)
    p.samples +=
        f * static_cast<double>(in.sample_rows) * (widest_input + static_cast<double>(kEnergyBlockRows));

  const bool opt = mc.family == io::ModelFamily::kOpt;
  const double head_in = opt ? static_cast<double>(mc.word_embed_proj_dim) : d;
  // The embeddings and the head (one table when tied), OPT's learned positions and projections.
  p.globals = f * vocab * head_in * (mc.tie_word_embeddings ? 1.0 : 2.0);
  if (opt) {
    p.globals += f * static_cast<double>(mc.max_position_embeddings + 2) * d;
    if (mc.has_project_in_out()) p.globals += f * 2.0 * d * head_in;
  }
  // A block's tensors in fp32, one linear of it twice (its dense and pruned weight), the next block (one
  // rank: widened in the background; several: this rank's share in the stored dtype), and the buffer a
  // stored tensor is read into, which keeps the size of the largest.
  // (Several ranks: this rank's share of the next block's tensors, whole tensors, the largest first.)
  const double s = static_cast<double>(dtype_size(stored));
  const double next_block = mc.num_layers < 2 ? 0.0
                            : in.ranks == 1   ? f * block
                                              : s * std::max(block / R, largest);
  p.block_weights = f * block + s * largest + (in.prunes ? f * largest + next_block : 0.0);
  // H, the dense pass's copy of it and, while a checkpoint is written in the background, the writer's copy;
  // the windows' token ids; every chunk's statistics, gathered from all ranks before they are reduced.
  p.calibration = (calib > 0 ? f * calib * d * (in.checkpoint ? 3.0 : 2.0) + f * calib : 0.0) +
                  static_cast<double>(in.calib_chunks) * chunk_statistics;
  // The forward pass's workspace, sized for its largest pass and kept: the states, the norm's output, q, k,
  // v, the attention's and o_proj's outputs, the MLP's widths (LLaMA gate, up and their product; OPT fc1's
  // output), the block's output; and each thread's attention score rows.
  const double tokens = static_cast<double>(in.tokens_per_pass);
  if (tokens > 0) {
    const double q_width = static_cast<double>(mc.num_heads * mc.head_dim);
    const double kv = static_cast<double>(mc.num_kv_heads * mc.head_dim);
    const double inner = static_cast<double>(mc.intermediate_size);
    p.activations = f * tokens * (4.0 * d + 2.0 * q_width + 2.0 * kv + (opt ? 1.0 : 3.0) * inner) +
                    f * in.threads * kCpuAttentionQueryRows * static_cast<double>(in.attention_length);
  }
  // The evaluation streams (a prune's dense and pruned ones, and the checkpoint writer's copies), and at
  // the end a batch's final-norm output and a slab of logits.
  if (eval > 0)
    p.evaluation = f * in.eval_streams * eval * d * (in.checkpoint ? 2.0 : 1.0) +
                   f * static_cast<double>(in.eval_batch_tokens) * d + f * 512.0 * (vocab + d);
  // Per thread the part of BLAS's buffer a product touches, a heap and a stack.
  p.buffers = kHostThreadBytes * in.threads;
  if (!in.prunes) return p;  // evaluation only: no selection and no masks
  // The largest linear's selection: the scores of this rank's rows and their byte mask (several ranks: the
  // rows' weight copy and the whole mask unpacked from the gathered bits), the reconstruction error's
  // W − W̃, refinement's copies of the mask (the initial one; R²-DSnoT's guard also the whole gathered one),
  // --compat ria's fp16 magnitudes, each thread's sort keys.
  p.selection = (f + 1.0) * largest / R + (in.ranks > 1 ? largest * (1.0 + f / R) : 0.0) +
                (in.recon_error ? f * largest / R : 0.0) + (in.refine ? 2.0 * largest : 0.0) +
                (in.compat_ria ? f * largest : 0.0) + 8.0 * widest_input * in.threads;
  // The Gram matrix of every input group, fp64, and a chunk's XᵀX being added (its Xᵀ and product); a rank
  // other than the first keeps its chunks' fp32 partials until the running total reaches it.
  if (!in.gram_widths.empty()) {
    double widest = 0;
    for (const int64_t n : in.gram_widths) {
      p.gram += 8.0 * static_cast<double>(n) * static_cast<double>(n);
      widest = std::max(widest, static_cast<double>(n));
    }
    p.gram += f * tokens * widest + 2.0 * f * widest * widest;
    if (in.ranks > 1) {
      double squares = 0;
      for (const int64_t n : in.gram_widths) squares += static_cast<double>(n) * static_cast<double>(n);
      p.gram += f * static_cast<double>(in.local_chunks) * squares;
    }
  }
  p.masks = bits;
  return p;
}

RunPlan plan_run(const PruneConfig& config, dist::Communicator& comm) {
  RunPlan r;
  agree_on_errors(comm, [&] { plan(config, comm, r); });
  // A rank that found the run finished returns now; one that did not would go on alone. Asked on every rank
  // whatever its options (ranks given different --resume are refused after this, by the identity check).
  const fs::path marker_of =
      config.resume.empty() || config.resume == "auto" ? config.checkpoint : fs::path(config.resume);
  every_rank_sees(comm, r.already_complete,
                  "the marker of a finished run " + checkpoint_marker(marker_of).string());
  return r;
}

std::vector<int64_t> recon_sample_positions(int64_t tokens, int64_t windows, int64_t seqlen) {
  const int64_t count =
      tokens <= 0 ? seqlen
                  : std::clamp<int64_t>((tokens + windows - 1) / std::max<int64_t>(windows, 1), 1, seqlen);
  std::vector<int64_t> positions(static_cast<size_t>(count));
  for (int64_t j = 0; j < count; ++j)
    positions[static_cast<size_t>(j)] = ((2 * j + 1) * seqlen) / (2 * count);
  return positions;
}

}  // namespace symprune::engine
