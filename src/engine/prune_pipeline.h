#pragma once
// The layer-wise pruning pipeline of DESIGN.md §3.5 on one process:
//   resolve the model → (activation-aware methods only) draw the calibration windows, embed them into
//   H [N·T, d] → per block: dense pass with an observer collecting every linear's ActivationStats and
//   the Gram matrix XᵀX of its inputs → score + mask every linear from those dense-pass statistics →
//   apply all masks (set_linear_weight) → pruned pass, whose output is the next block's H → write the
//   pruned model (engine/pruned_model_writer.h) → optional perplexity of the dense and pruned model.
// Methods that read no activations (magnitude, symmetric, symmetric-sq, ri, or α = 0) run no forward
// pass at all, as the reference tools do; their layers then carry no reconstruction error.
//
// Reconstruction error per linear: ‖(W − W̃)X‖_F / ‖WX‖_F on the dense-pass inputs X of its block.
// Instead of keeping X (N·T × n floats per linear), the observer accumulates G = XᵀX (n × n, fp32
// products per micro-batch summed in fp64; linears fed the same input — q/k/v, gate/up — share one G),
// and ‖ΔW X‖² = Σ_r Δw_r G Δw_rᵀ = trace(ΔW G ΔWᵀ), ‖WX‖² = trace(W G Wᵀ) (bias excluded).
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

#include "core/refine_dsnot.h"

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

  std::string calib;  // calibration file ("" = none)
  std::string calib_format = "auto";
  int64_t nsamples = 128;
  int64_t seqlen = 0;  // 0 = 2048, or with compat "wanda" max_position_embeddings (the Wanda repo's T)
  uint64_t seed = 0;

  std::filesystem::path out;
  bool force = false;

  std::string eval;         // perplexity text file ("" = no evaluation)
  int64_t eval_seqlen = 0;  // 0 = seqlen
  int64_t eval_max_chunks = 0;
  int threads = 0;
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
};

struct PerplexityPair {
  double dense = 0.0;
  double pruned = 0.0;
  int64_t seqlen = 0;
  int64_t chunks = 0;
};

struct PruneTimings {
  double calibration = 0, blocks = 0, scores_masks = 0, refine = 0, write = 0, eval = 0, total = 0;
};

struct PruneResult {
  std::filesystem::path model_dir;
  std::string model_fingerprint;
  std::string calibration_fingerprint;  // empty without calibration
  std::string mask_description;         // describe(MaskSpec)
  std::vector<LayerResult> layers;
  int64_t pruned_total = 0;
  int64_t params_total = 0;  // weights of all pruned linears
  double sparsity_total() const {
    return params_total > 0 ? static_cast<double>(pruned_total) / static_cast<double>(params_total) : 0.0;
  }
  double sparsity_target = 0.0;  // ρ, or N/M
  std::optional<PerplexityPair> perplexity;
  PruneTimings timings;
  nlohmann::json config;  // the resolved configuration (defaults filled in)
  // The report JSON of prune_cli.md.
  nlohmann::json report() const;
};

struct BlockProgress {
  int64_t block = 0;   // 0-based block just finished
  int64_t blocks = 0;  // total
  double seconds = 0;  // since the pipeline started
};
using ProgressFn = std::function<void(const BlockProgress&)>;

// Validates the configuration (before anything heavy), runs the pipeline and writes config.out.
// Bad input throws symprune::Error and leaves nothing at config.out.
PruneResult prune_model(const PruneConfig& config, const ProgressFn& progress = {});

}  // namespace symprune::engine
