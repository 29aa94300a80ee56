#pragma once
// Score, select, refine and gather the mask of one linear (DESIGN.md §3.2–3.4 and §4), with the output rows
// of the matrix split over the ranks: rank p owns rows dist::partition(m, R, p).
//  * Scores of the own rows (column norms read the whole weight, which every rank holds, so the scores do
//    not depend on the split).
//  * Selection: row and N:M masks are row-local; a layer mask is one selection over the whole matrix, made
//    with integer histograms summed over the ranks (core/masks.h MatrixPart), exact and split-independent.
//  * Refinement of the own rows (rows are independent; R²-DSnoT's column norms of the initial mask are
//    computed from the gathered initial mask).
//  * The rows' masks are gathered bit-packed, so every rank ends with the whole mask.
//  * The reconstruction error ‖(W−W̃)X‖/‖WX‖ from the Gram matrix, per row on the own rows, rows summed in
//    order after a gather.
#include <optional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/masks.h"
#include "core/refine_dsnot.h"
#include "core/scores.h"
#include "dist/communicator.h"
#include "engine/block_statistics.h"
#include "engine/refine_linear.h"

namespace symprune::engine {

struct MaskSettings {
  Backend* backend = nullptr;  // holds the weights: scores, selection, the reconstruction error run there
  ScoreMethod method = ScoreMethod::kMagnitude;
  ScoreOptions score;  // block and matrix_name are set per linear
  bool scores_need_stats = false;
  MaskSpec spec;
  RefineSettings refine;           // engine/refine_linear.h
  bool report_recon_error = true;  // with the report's token sample: the reconstruction errors
};

struct LinearMask {
  Mask mask;  // the whole matrix's
  int64_t pruned = 0;
  std::optional<double> recon_error;          // absent without a token sample
  std::optional<double> recon_error_initial;  // refined linears: the initial mask's
  std::optional<RefineStats> refine;          // refined linears
  double refine_seconds = 0.0;
  int64_t mask_bytes = 0;  // bytes this rank gathered for the mask
};

// Whether `linear` ("self_attn.q_proj", "fc1", ...) is left unrefined by `skip` (DSnoT's --skip_layer).
bool refine_skips(const std::string& skip, const std::string& linear);

// Collective over `comm`: every rank calls it for the same linear with the whole weight (in the memory of
// settings.backend: scores, selection and the reconstruction error's products run there) and the reduced
// statistics (`stats` may be null when neither scores nor refinement read them, `gram` when no Gram
// matrices were collected, `samples` when the report has no reconstruction error).
LinearMask prune_linear(dist::Communicator& comm, const MaskSettings& settings, int64_t block,
                        const std::string& linear, const Tensor& weight, const ActivationStats* stats,
                        const Gram* gram, const Tensor* samples);

// sample_energy's products A Xᵀ are taken kEnergyBlockRows rows of A at a time ([kEnergyBlockRows, K]).
constexpr int64_t kEnergyBlockRows = 256;

// ‖AX‖_F² over the sampled input rows X [K, n] (BlockStatistics::samples; both in the backend's memory)
// of the matrix whose rows
// `rows` (dist::partition of total_rows) this rank holds: per row Σ_t (a_r·x_t)² (fp32 products, fp64
// sums), gathered and added in row order, so the result is the same for any number of ranks. Collective.
double sample_energy(dist::Communicator& comm, Backend& backend, const Tensor& rows, int64_t total_rows,
                     const Tensor& samples);

// ‖(W−W̃)X‖_F / ‖WX‖_F over the samples, given dense_energy = sample_energy of W's rows (it does not depend
// on the mask, so a refined linear computes it once for both of its errors), or nullopt when ‖WX‖ = 0 and
// W̃ ≠ W. `weight_rows` and `row_mask` are this rank's rows. Collective.
std::optional<double> reconstruction_error(dist::Communicator& comm, Backend& backend,
                                           const Tensor& weight_rows, const Mask& row_mask,
                                           int64_t total_rows, const Tensor& samples, double dense_energy);

}  // namespace symprune::engine
