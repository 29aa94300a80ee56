#pragma once
// Reconstruction-error refinement (`--refine recon`) and the guard of `--refine-guard` (issue 14).
//
// Only the mask changes, never a weight. For output row r with weights w and pruned set P, Δw = w on P
// and 0 elsewhere, and the row's calibration error is E_r = Δw G Δwᵀ = ‖Δw Xᵀ‖², G = XᵀX the Gram matrix
// of the linear's inputs (n × n, symmetric, fp64). With g = G Δwᵀ (fp64), the exact changes are
//   regrow c (pruned → kept):  δ_grow(c)  = w_c²·G_cc − 2·w_c·g_c
//   prune k (kept → pruned):   δ_prune(k) = w_k²·G_kk + 2·w_k·g_k
//   swap (regrow c, prune k):  δ_grow(c) + δ_prune(k) − 2·w_c·w_k·G_ck
// and after a swap g ← g − w_c·G[:,c] + w_k·G[:,k]. With G replaced by the rank-one μ̃μ̃ᵀ, E_r = e_r², the
// square of DSnoT's mean error; the whole G also holds the second moment that DSnoT leaves unbounded.
//
// Search, per row (rows are independent; OpenMP over blocks of rows):
//  1. Pool. Computing g for every column is a full product ΔW·G (m·n² flops: about 5× DSnoT's time at
//     n = 4096 even as an optimized dgemm), so only `pool` columns get an exact g: the pruned weights with
//     the largest and the kept weights with the smallest saliency w_c²·G_cc (the error a weight adds on its
//     own: Wanda's score squared), pool/2 of each (a side with fewer candidates leaves its share to the
//     other). These are the weights nearest the mask's saliency boundary; in prototypes on random and
//     structured G they gave lower errors than pools ranked by the exact single-move deltas (which miss that
//     a swap's partner can cancel correlated error) or by a low-rank model of G. N:M: the pool/M groups whose
//     best swap by saliency (smallest kept minus largest pruned saliency of the group) costs least, all their
//     columns; swaps stay inside a group, so each group keeps its pattern.
//  2. Exact g on the pool and the pool's block S = G[pool, pool]: one pass over G in slabs of 512 columns
//     per block of rows, each slab row of G used for every row of the block whose pool holds it. Each g
//     entry is a sum in a fixed order (slab by slab; eight interleaved partial sums within a slab), so the
//     result depends neither on the threads nor on how rows are sliced or blocked.
//  3. Cycles, at most max_cycles swaps: rank the pool's pruned entries by δ_grow and its kept entries by
//     δ_prune, take the `shortlist` best of each side (N:M: every pruned/kept pair inside each pool group)
//     and evaluate the pairs with the cross term. Make the best swap if it lowers E_r by more than 1e-10 of
//     the magnitude of its terms (rounding-level gains would only churn), else stop. Ties go to the lowest
//     regrow column, then the lowest prune column. The pool is fixed per row: a regrown weight may be
//     pruned again, a column outside the pool is never touched. Weights that are zero (a model pruned
//     before) take no part in swaps, so the row's zeros stay those of the initial mask.
// Hence E_r never rises (up to fp64 rounding of the sums), the pruned count per row and the N:M pattern
// never change, and the result is deterministic. Cost per row: O(n) for the pool, pool·n for step 2,
// cycles·(pool + shortlist²) for step 3; the pool bounds the swaps a row makes (about pool/4 on the n = 4096
// bench). bench/results/refine_bench.md has the time against DSnoT and the error for pool 64, 96 and 128.
//
// Row partitions (distributed runs): W and mask may hold any contiguous slice of a matrix's rows with the
// whole G; the result for those rows equals the whole-matrix call (nothing crosses rows).
#include <cstdint>
#include <optional>
#include <vector>

#include "core/masks.h"
#include "core/refine_dsnot.h"
#include "core/tensor.h"

namespace symprune {

struct ReconOptions {
  int max_cycles = 50;  // swaps per row at most (--max-cycles)
  int pool = 96;        // columns per row with an exact g (step 1): 1.9–2.5× DSnoT's time at n = 4096
  int shortlist = 8;    // unstructured: candidates per side evaluated as pairs each cycle (step 3)
};

// Throws symprune::Error naming the offending option when an option is out of range.
void validate_recon_options(const ReconOptions& options);

// W [m, n]; gram: G, n × n row-major and symmetric; mask: the initial mask in, the refined mask out.
// Stats: swaps and recon_sq_change (Σ of the accepted swaps' exact δ, ≤ 0); the DSnoT fields
// mean_abs_error_* need μ̃ and stay 0 here. Throws symprune::Error on shape mismatches, invalid options, a
// non-finite weight or a negative or non-finite diagonal of G.
RefineStats refine_recon(const Tensor& W, const double* gram, int64_t n, Mask& mask,
                         const ReconOptions& options, std::optional<NmPattern> nm = std::nullopt);

// Per row r: E_r(refined) − E_r(initial), as Σ_{c changed} d_c·(G[c,:]·(Δw_initial + Δw_refined)) with
// d = Δw_refined − Δw_initial, so a row costs (changed columns)·n, 0 for an unchanged row.
std::vector<double> recon_row_changes(const Tensor& W, const double* gram, int64_t n, const Mask& initial,
                                      const Mask& refined);

// --refine-guard: restores to `initial` every row of `refined` whose change (recon_row_changes) is > 0,
// sets those changes to 0, and returns the number of rows restored.
int64_t revert_rows_that_rose(const Mask& initial, Mask& refined, std::vector<double>& row_changes);

}  // namespace symprune
