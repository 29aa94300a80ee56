#pragma once
// Refinement of one linear's initial mask in the pipeline (DESIGN.md §3.4): --refine dsnot, r2dsnot
// (core/refine_dsnot.h) or recon (core/refine_recon.h), and --refine-guard. The pipeline resolves the
// settings once, before anything heavy, and calls refine_linear for every linear that --refine-skip
// leaves to refine, with that linear's dense-pass statistics and Gram matrix.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/activation_stats.h"
#include "core/backend.h"
#include "core/masks.h"
#include "core/refine_dsnot.h"
#include "core/refine_recon.h"
#include "core/tensor.h"

namespace symprune::engine {

struct PruneConfig;

struct RefineSettings {
  std::string method = "none";  // none, dsnot, r2dsnot or recon
  std::string skip = "mlp";     // --refine-skip
  DsnotOptions dsnot;           // dsnot and r2dsnot (r2 set for r2dsnot)
  ReconOptions recon;           // recon: max_cycles from --max-cycles, the search's defaults otherwise
  bool guard = false;           // --refine-guard
  // N:M DSnoT (not R²): the key of the weight a swap prunes. The reference takes the initial score there;
  // where that is |W|·a_c^α (magnitude: α = 0; wanda: its α) this holds α and the key is exactly the initial
  // score. Unset (other methods, which the reference has no initial mask for): the Wanda score |W|·a_c, as
  // in the unstructured prune list.
  std::optional<double> nm_prune_alpha;
  bool enabled() const { return method != "none"; }
};

// Validates --refine, --refine-skip, --refine-guard and the options of every method (symprune::Error
// names the option); the DSnoT options are checked whatever the method, as before recon existed.
RefineSettings resolve_refine_settings(const PruneConfig& config);

// The report's config.refine: null without refinement; recon reports its pool and shortlist instead of
// the DSnoT keys it does not read; with an N:M mask (`nm`), dsnot and r2dsnot name their prune pick.
nlohmann::json refine_config_json(const RefineSettings& settings, bool nm);

// Refines `mask`, the initial mask of `w` [m, n], in place. stats: the linear's dense-pass statistics
// (DSnoT's μ̃, variance and norms); gram: its G = XᵀX, n × n. The result holds the swaps, DSnoT's
// mean |e_r| before and after (for every method), and:
//  * with --refine-guard, rows_reverted (rows whose E_r = Δw G Δwᵀ rose, restored to the initial mask)
//    and recon_sq_change, the exact change of ‖(W − W̃)X‖² that remains. recon never raises E_r, so its
//    guard has nothing to restore and is not evaluated;
//  * with recon, recon_sq_change always (the search tracks it exactly); unguarded dsnot/r2dsnot leave it
//    unset (computing it costs about as much as their refinement).
//
// Row slices (distributed runs): w and mask may hold any contiguous rows of the matrix; every method is
// row-local except R²-DSnoT's column norms of the initial mask, passed as column_l1 for the whole matrix.
//
// `w` is in `backend`'s memory: DSnoT and R²-DSnoT run there (Backend::refine_dsnot; on a GPU, only the
// mask crosses the bus); recon and the guard read a host copy.
RefineStats refine_linear(Backend& backend, const RefineSettings& settings, const Tensor& w,
                          const ActivationStats& stats, const double* gram, int64_t n, Mask& mask,
                          std::optional<NmPattern> nm, const std::vector<double>* column_l1 = nullptr);

}  // namespace symprune::engine
