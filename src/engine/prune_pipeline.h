#pragma once
// The layer-wise pruning pipeline of DESIGN.md §3.5 and §4, written once for one process and for R ranks
// (`symprune prune` runs it with the local communicator, `symprune_dist` with MPI or NCCL). Its stages,
// in prune_pipeline.cc, in order:
//   plan_run (engine/run_plan.h)     validate and resolve: options, model, outputs, tokenizer, memory
//   calibrate                         draw the windows, embed this rank's chunks of them into H
//   per block:
//     BlockWeightExchange::load       each rank reads a share of the block's tensors, the ranks exchange
//     them;
//                                     the next block's share is read in the background
//     dense_pass                      the dense block on this rank's H with the statistics observer
//     BlockStatistics::reduce         statistics of all ranks' chunks, combined in chunk order
//     prune_linear (mask_stage.h)     scores, masks and refinement of this rank's rows, masks gathered
//     apply_masks, pruned_pass        every rank applies the whole masks and runs the pruned block on its H
//     (with --eval) the dense and the pruned evaluation streams move through the block
//   write_pruned_model                each rank writes its shards, rank 0 the rest, atomically
//   evaluate                          final norm and head on this rank's evaluation chunks, NLLs gathered
//   report                            rank 0
// Results do not depend on R: see engine/ordered_reduce.h for the sums, mask_stage.h for the masks.
//
// Methods that read no activations (magnitude, symmetric, symmetric-sq, ri, or α = 0) run no calibration
// pass at all, as the reference tools do; their layers then carry no reconstruction error.
//
// Reconstruction error per linear: ‖(W − W̃)X‖_F / ‖WX‖_F on the dense-pass inputs X of its block, from
// G = XᵀX (linears fed the same input share one G): ‖ΔW X‖² = Σ_r Δw_r G Δw_rᵀ, ‖WX‖² = Σ_r w_r G w_rᵀ.
//
// Mask kinds (MaskSpec): --sparsity with group "row" (default: exactly ⌊n·ρ⌋ per output row) or
// "layer" (exactly ⌊m·n·ρ⌋ per matrix), or --nm N:M. Compatibility modes (reference notes §4):
//   compat "wanda": magnitude uses the per-layer "≤ θ" rule (all reference repos); other methods keep
//                   the requested group (the Wanda repo is per output row); group "layer" uses "≤ θ".
//                   Without an explicit seqlen, T = max_position_embeddings (Wanda's model.seqlen).
//   compat "ria":   per-layer "≤ θ" unless group "row" is asked for explicitly (RIA's --per_outneuron);
//                   ri and ria use RIA's fp16 rounding of the relative-importance term.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/refine_dsnot.h"
#include "dist/communicator.h"

namespace symprune::engine {

struct PruneConfig {
  std::string model;               // directory or short name (io::resolve_model)
  std::string method;              // a parse_score_method name
  std::optional<double> alpha;     // unset = the method's default
  double p = 1.0;                  // lp
  int strategy = 1;                // lp S1..S4
  double beta = 0.1;               // stochria
  uint64_t method_seed = 0;        // stochria
  std::optional<double> sparsity;  // exactly one of sparsity / nm
  std::string group;               // "row", "layer", or "" = the default for the compat mode
  std::string nm;                  // "N:M" or ""
  std::string compat = "none";     // none, wanda, ria

  // Mask refinement after the initial mask, before the pruned pass (DESIGN.md §3.4): "none", "dsnot",
  // "r2dsnot" or "recon" (engine/refine_linear.h). refine_skip: "mlp" (DSnoT's default: only the attention
  // projections are refined), "attn" or "none". For "r2dsnot" the pipeline sets refine_options.r2 from r2;
  // recon reads refine_options.max_cycles only. refine_guard: keep a refined row only if its
  // reconstruction error on the calibration inputs did not rise.
  std::string refine = "none";
  std::string refine_skip = "mlp";
  DsnotOptions refine_options;
  R2Options r2;
  bool refine_guard = false;

  std::string calib;  // calibration file ("" = none; "synthetic" = uniformly random token ids from --seed)
  std::string calib_format = "auto";
  // Tokenizer file or directory for text calibration and --eval ("" = the model directory's).
  std::string tokenizer;
  int64_t nsamples = 128;
  int64_t seqlen = 0;  // 0 = 2048, or with compat "wanda" max_position_embeddings (the Wanda repo's T)
  uint64_t seed = 0;
  int64_t micro_batch = 0;  // calibration windows per forward pass; 0 = max(1, 16384 / seqlen)

  std::filesystem::path out;  // may be empty only for a synthetic model (timing runs)
  bool force = false;
  std::filesystem::path report;  // JSON report ("" = none), written atomically at the end
  // Other files the run reads (a recipe): outputs may not replace them.
  std::vector<std::filesystem::path> input_files;

  // Report ‖(W−W̃)X‖/‖WX‖ per linear over a sample of recon_tokens calibration tokens: the same
  // ceil(recon_tokens / nsamples) evenly spaced positions of every window (0 or enough tokens: all of
  // them, exact). Costs two sgemms of K rows per linear and K·n floats per input exchanged between ranks.
  bool recon_error = true;
  int64_t recon_tokens = 1024;

  // Checkpoints (engine/checkpoint.h): the state is saved to `checkpoint` after every `checkpoint_every`
  // blocks and after the last; `resume` ("auto" or a checkpoint file, "" = start fresh) continues a run.
  std::filesystem::path checkpoint;
  int64_t checkpoint_every = 1;
  std::string resume;

  std::string eval;         // perplexity text file ("" = no evaluation)
  int64_t eval_seqlen = 0;  // 0 = seqlen
  int64_t eval_max_chunks = 0;
  int threads = 0;

  // The backend the model, the statistics, the scores and the masks run on; null = the CPU's. The apps
  // resolve --device (cpu, cuda, auto) to it with accel::backend_for_device. The report's "device" is its
  // name; a checkpoint resumes only on the same kind of backend.
  Backend* backend = nullptr;
  // Ranks of this node that use this rank's device (accel::ranks_sharing_device): the memory plan is checked
  // against its share of the device's free memory.
  int ranks_per_device = 1;
  // Ranks on this rank's node: the host memory plan is checked against its share of the node's memory.
  int ranks_per_node = 1;
  // --dtype: what the linear weights and the hidden states between blocks are kept in on the backend
  // ("auto", "bf16", "fp16", "fp32"; model::resolve_storage_dtype). Lower precision needs a GPU.
  std::string dtype = "auto";
};

struct LayerResult {
  std::string name;  // "0.self_attn.q_proj"
  std::vector<int64_t> shape;
  int64_t pruned = 0;
  double sparsity = 0.0;
  std::optional<double> recon_error;  // absent when no forward pass ran
  // Refinement (absent when the matrix was not refined): swaps, mean |e_r| before/after, rows reverted by
  // the guard, the exact change of ‖(W − W̃)X‖² where computed (refine_linear.h), and the reconstruction
  // error of the initial mask (recon_error is then the refined mask's).
  std::optional<RefineStats> refine;
  std::optional<double> recon_error_initial;
  // Zero entries of the weight as written: `pruned` plus the kept weights that were zero already (a model
  // pruned before). Absent when no model was written.
  std::optional<int64_t> zeros;
};

struct PerplexityPair {
  double dense = 0.0;
  double pruned = 0.0;
  int64_t seqlen = 0;
  int64_t chunks = 0;
  // exp of these is the perplexity: kept because a perplexity beyond a double's range is null in JSON.
  double dense_mean_nll = 0.0;
  double pruned_mean_nll = 0.0;
};

// Seconds per stage; a resumed run's figures (total included) sum every attempt since the first start.
struct PruneTimings {
  double calibration = 0, weights = 0, blocks = 0, statistics = 0, scores_masks = 0, refine = 0, write = 0,
         eval_dense = 0, eval_pruned = 0, total = 0;
  // The calibration passes one by one (the dense pass with its statistics' accumulation, then the pruned
  // pass that makes the next block's inputs), each up to the end of its device work; `blocks` is their sum.
  double dense_pass = 0, pruned_pass = 0;
  // Checkpoints: the main thread's share (snapshots, creating files, waiting for the writer) and the
  // background writer's time, which overlaps the blocks.
  double checkpoint = 0, checkpoint_background = 0;
};

// One block's share of the stages (the report's "block_timings"): `seconds` is the block's wall time, the
// stages are PruneTimings' per-block fields. The first block of an attempt loads its weights on the
// calling thread; later ones find them read in the background, so a benchmark that times a few blocks
// extrapolates from a middle one (bench/cuda_prune_bench.py).
struct BlockTimings {
  int64_t block = 0;
  double seconds = 0;
  PruneTimings
      stages;  // weights, blocks (dense_pass + pruned_pass), statistics, scores_masks, refine, eval_*
};

// Bytes this process sent and received per kind (the scaling figures of bench/); zero with one rank.
struct CommunicationVolume {
  int64_t weights = 0, statistics = 0, grams = 0, masks = 0, eval = 0;
};

struct PruneResult {
  std::filesystem::path model_dir;
  std::string model_fingerprint;
  std::string calibration_fingerprint;  // empty without calibration
  std::string eval_fingerprint;         // the --eval tokens'; empty without --eval
  // {"model", "calibration", "eval"} (null where empty): the report's and the provenance's "fingerprints".
  nlohmann::json fingerprints() const;
  std::string mask_description;  // describe(MaskSpec)
  std::vector<LayerResult> layers;
  int64_t pruned_total = 0;
  int64_t params_total = 0;  // weights of all pruned linears
  double sparsity_total() const {
    return params_total > 0 ? static_cast<double>(pruned_total) / static_cast<double>(params_total) : 0.0;
  }
  double sparsity_target = 0.0;        // ρ, or N/M
  std::optional<int64_t> zeros_total;  // Σ LayerResult::zeros, when the model was written
  std::optional<PerplexityPair> perplexity;
  PruneTimings timings;
  // Every block, in order, a resumed run's earlier attempts' too (from the blocks a checkpoint of a version
  // before per-block timings saved: none).
  std::vector<BlockTimings> block_timings;
  CommunicationVolume communication;
  // A device-resident run (this attempt): the memory plan against what the run held at its peak, worst
  // rank (device_memory_json in prune_pipeline.cc); null on a host backend.
  nlohmann::json device_memory;
  // The host memory plan, what it was checked against and the resident sizes the ranks reached
  // (host_memory_json in prune_pipeline.cc).
  nlohmann::json host_memory;
  nlohmann::json config;  // the resolved configuration (defaults filled in)
  // Set when the run was interrupted after the model was written (during the pruned evaluation): what
  // was not finished. The report then carries "incomplete".
  std::optional<std::string> incomplete;
  // With --resume: the checkpoint continued and the first block this process ran (0-based).
  std::optional<std::filesystem::path> resumed_from;
  int64_t resumed_block = 0;
  // --resume found the marker of this very run having finished: nothing was done (and nothing else here is
  // set but config and the model fields).
  bool already_complete = false;
  // The report JSON (also written to config.report).
  nlohmann::json report() const;
};

struct BlockProgress {
  int64_t block = 0;         // 0-based block just finished
  int64_t blocks = 0;        // total
  double seconds = 0;        // since the pipeline started
  double block_seconds = 0;  // this block alone
  double eta_seconds = 0;    // remaining blocks at the mean block time so far
};
using ProgressFn = std::function<void(const BlockProgress&)>;

// Validates the configuration (before anything heavy: bad options, unusable --out/--report, not enough
// memory), runs the pipeline, writes config.out and config.report. Bad input throws symprune::Error and
// leaves nothing at config.out. Progress (per block with elapsed time and ETA, per evaluation batch) is
// logged, and also passed to `progress` per block. A signal (core/interrupt.h) stops the run at the next
// safe point with Interrupted; when it arrives during the pruned evaluation, the finished model stays and
// the report is written, marked incomplete, before Interrupted is rethrown.
// With config.checkpoint, a SIGTERM/SIGUSR1 (or SIGINT/SIGHUP) stops the run at the next block boundary
// after the state there is saved, with interrupt::Interrupted whose exit code is kCheckpointedExitCode
// (engine/checkpoint.h).
// Collective over `comm`; rank 0 writes the report and returns the full result (other ranks return the
// same layers and figures).
PruneResult prune_model(const PruneConfig& config, dist::Communicator& comm, const ProgressFn& progress = {});
// One process (the local communicator).
PruneResult prune_model(const PruneConfig& config, const ProgressFn& progress = {});

}  // namespace symprune::engine
