#pragma once
// DSnoT and R²-DSnoT mask refinement (DESIGN.md §3.4; reference-implementations.md §5.2 unstructured,
// §5.3 N:M).
//
// Only the mask changes, never a weight. Per output row r, with D[r,c] = W[r,c]·μ̃_c, the expected error
// e_r = Σ_{pruned c} D[r,c] is driven towards 0 by swaps (regrow one pruned g, prune one kept p), at most
// max_cycles per row; a row stops for good once |e_r| ≤ threshold (tested on the error before the swap),
// or, with same_sign, once a swap would flip the sign of the initial error.
//
// Numerics: D, the regrow key G = D/v^p and the Wanda score |W|·a_c are float (the reference's fp32);
// e_r is accumulated in double (the reference sums in fp32), so threshold/sign decisions can differ from
// the reference only at near-ties. Sorts are stable, ascending by (float value, column), NaN last.
//
// Deliberate differences from the reference code (the guards below change results on narrow rows: on
// stories260K's q_proj, n = 64, most rows stop because a prune list runs out or on the sign test):
//  * Prune-candidate list: kept columns in ascending Wanda order, split into those with D <= 0 (also NaN)
//    in that order followed by those with D > 0 in reversed order. The reference drops D == 0 columns
//    and duplicates the first kept column instead (its reorder-helper bug); here D == 0 sits with the
//    negatives.
//  * Frozen rows really are frozen: the reference keeps advancing the pointers of inactive rows and
//    replays mask writes that are no-ops for realistic n; here an inactive row is never touched again.
//  * A swap is made only when the regrow candidate g is currently pruned, the prune candidate p currently
//    kept, both pointers are inside their lists, and both move e towards 0 (D[g] has the sign of e,
//    D[p] the opposite sign or 0: the paper's Δ < 0 condition). Otherwise the row stops as if it had met
//    the threshold (N:M: except a block without such a p, which passes g over; below). The reference code
//    checks none of this: its pointers run on into the other sign's part of the lists (pruning the
//    highest-scoring kept weights of the wrong sign), into the kept zero-key middle of the regrow list, or
//    off the end (index error), which changes the row's pruned count. For wide rows (about n/2 candidates per
//    sign against at most 50 cycles) the lists rarely run out; on narrow rows (stories260K, n = 64) the
//    guards stop most rows, and the result differs from a literal replay of the reference code. With these
//    guards the pruned count per row (and the N:M pattern) is preserved by construction.
//  * Regrow keys that are NaN (0/0: D = 0 on a zero-variance channel) carry no information and are passed
//    over; the reference sorts them last, where an e > 0 row starts.
//  * N:M (always same-sign, per §5.3): p = the kept, not yet touched entry of g's M-block with the
//    smallest |W|·act_norm (ties: lowest column) among those whose D moves e towards 0 (the sign guard
//    above); "touched" = initially pruned or pruned by a swap, even if regrown later (the reference's
//    S' = +inf). The reference uses the initial score S_init there: the caller passes act_norm = a_c^α for
//    an initial score |W|·a_c^α (engine/refine_linear.h), which makes the key S_init; otherwise a_c (the
//    Wanda score). A block with no such entry passes g over: the cycle is spent and the next one takes
//    the next g (stopping the row there left 2:4 rows after 2.3 swaps on average). The reference code
//    takes the block's smallest key whatever D's sign: its swaps then let |e| grow as long as e keeps
//    its sign (on stories260K's 2:4 wanda q_proj of block 0, 686 of 1029 swaps did, the layer's
//    reconstruction error 0.20 → 0.59). options.nm_prune_any_sign (--compat dsnot) takes the reference's
//    pick.
//
// R²-DSnoT (options.r2 set) keeps the cycle mechanics and changes only the two keys. With W̃ the
// initially pruned matrix (kept entries of W) and R[r,c] = 1/‖W̃[r,:]‖₁ + 1/‖W̃[:,c]‖₁ (a zero norm
// contributes 0, as in the scores):
//   regrow key  G[r,c] = D[r,c]·(R[r,c] if grow_relative)/v_c^p_g         (pruned c; kept c: 0)
//   prune key   P[r,c] = |W[r,c]|·(R[r,c] if prune_relative)·a_c^α + γ₂·‖W̃[r,:] − W[r,c]e_c‖_p
// and the regrow pick adds γ₁·‖W̃[r,:] + W[r,c]e_c‖_p in the direction of the paper's argmax: for e > 0
// the largest G + γ₁N⁺, for e ≤ 0 the smallest G − γ₁N⁺ (the paper's argmax of sign(e)·G + γ₁N⁺).
// The paper writes the regularizer as γ‖W̃_q‖_p, which is the same for every candidate of a row; this
// project evaluates it on the row after the candidate move (DESIGN.md §3.4): it favours regrowing the
// weight that makes the row norm larger and pruning the one that leaves it smaller (MagR's ℓ∞ shrinks
// the largest weights), and with the paper's γ ≤ 1e-3 it mostly breaks near-ties.
// With γ₁ > 0 the two directions have their own orders; a pointer skips entries already regrown through
// the other one. Keys come from the initial mask, once per matrix, as in DSnoT. With grow_relative and
// prune_relative off, γ₁ = γ₂ = 0 and α = 1, R²-DSnoT is DSnoT exactly (tested).
//
// Rows are independent, so each row runs its own cycle loop (OpenMP over rows); the result is the same
// as the reference's lock-step loop over all rows and does not depend on the number of threads.
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/masks.h"
#include "core/tensor.h"

namespace symprune {

// The R²-DSnoT keys (see above). Defaults: the paper's equations as written (relative factor in both
// keys, square-root activation), p = 2 (the paper's best norm in every ablation), no regularization.
struct R2Options {
  bool grow_relative = true;
  bool prune_relative = true;
  double reg_p = 2.0;        // 1, 2 or +inf
  double gamma_grow = 0.0;   // γ₁ >= 0
  double gamma_prune = 0.0;  // γ₂ >= 0
  double alpha = 0.5;        // α_r >= 0: the prune key's a_c^α
};

struct DsnotOptions {
  int max_cycles = 50;          // K: cycles per row at most, one swap each (N:M: or one g passed over)
  double threshold = 0.1;       // τ: a row stops when |e_r| <= τ (in μ̃ units: per-sequence sums)
  double var_power = 1.0;       // p_g: regrow key D / v^p_g (0: no division)
  bool same_sign = false;       // unstructured only; N:M always applies the sign test
  // N:M: the prune pick is the block's smallest key whatever the sign of its D, as the DSnoT code takes it
  // (--compat dsnot); otherwise only entries that move e towards 0 are candidates.
  bool nm_prune_any_sign = false;
  std::optional<R2Options> r2;  // set: R²-DSnoT keys
};

// Throws symprune::Error naming the offending option (CLI spelling) when an option is out of range.
void validate_dsnot_options(const DsnotOptions& options);

struct RefineStats {
  int64_t swaps = 0;                   // over all rows
  double mean_abs_error_before = 0.0;  // mean over rows of |e_r| for the input mask
  double mean_abs_error_after = 0.0;   // same for the refined mask
  // Σ_r of the change of E_r = Δw_r G Δw_rᵀ = ‖(W − W̃)[r,:] Xᵀ‖² (exact, fp64; refine_recon.h): set by
  // refine_recon and by the guard; refine_dsnot has no G and leaves it unset.
  std::optional<double> recon_sq_change;
  int64_t rows_reverted = 0;  // --refine-guard: rows restored to the initial mask (refine_recon.h)
  // The same per row, in row order: |e_r| before and after, and the change of E_r (where recon_sq_change is
  // set). The figures above are their row-order sums (over m); with several ranks each holds its rows', and
  // the report adds all of them in row order (engine/mask_stage.cc), whatever the rank count.
  std::vector<double> row_abs_error_before, row_abs_error_after, row_recon_sq_change;
};

// W [m, n]; mu = μ̃ (n), var = v (n), act_norm (n): the prune key is |W|·act_norm (a_c: the Wanda order); mask
// [m, n] is the initial mask in and the refined mask out. nm selects the §5.3 variant (M must divide n).
// Throws symprune::Error on shape mismatches or invalid options (validate_dsnot_options).
//
// Row partitions (distributed / per-device runs): W and mask may hold any contiguous slice of a matrix's
// rows; the result for those rows is the same as in a whole-matrix call. The only quantity that crosses
// rows is R²-DSnoT's column norm ‖W̃[:,c]‖₁: pass the whole matrix's (the sum of every slice's
// initial_column_l1, e.g. all-reduced) as column_l1; without it the slice's own columns are used.
RefineStats refine_dsnot(const Tensor& W, const std::vector<double>& mu, const std::vector<double>& var,
                         const std::vector<double>& act_norm, Mask& mask, const DsnotOptions& options,
                         std::optional<NmPattern> nm = std::nullopt,
                         const std::vector<double>* column_l1 = nullptr);

// --- The parts of refine_dsnot that another implementation of it (a device backend's,
// Backend::refine_dsnot) shares, so that it gives the same errors and the same results.

// refine_dsnot's argument checks for a weight [m, n] (shape_string names it in errors), in its order.
void check_dsnot_arguments(int64_t m, int64_t n, const std::string& shape_string,
                           const std::vector<double>& mu, const std::vector<double>& var,
                           const std::vector<double>& act_norm, const Mask& mask, const DsnotOptions& options,
                           std::optional<NmPattern> nm, const std::vector<double>* column_l1);

// The per-column inputs every row reads, rounded as refine_dsnot uses them: μ̃_c and v_c^p_g in fp32
// (var_pow = v when p_g = 1), a_c, and for R²-DSnoT a_c^α and 1/‖W̃[:,c]‖₁ (0 for a zero column) from
// `column_l1` (the whole matrix's; ignored without options.r2).
struct DsnotColumns {
  std::vector<float> mu, var_pow;
  std::vector<double> act_norm, act_pow, col_inv_l1;
};
DsnotColumns dsnot_columns(const std::vector<double>& mu, const std::vector<double>& var,
                           const std::vector<double>& act_norm, const DsnotOptions& options,
                           const std::vector<double>& column_l1);

// The totals over rows of per-row swaps and errors e_r before and after (row order, so the sums do not
// depend on how the rows were processed).
RefineStats dsnot_totals(std::span<const int64_t> swaps, std::span<const double> error_before,
                         std::span<const double> error_after);

// |e_r| per row, e_r = Σ_{pruned c} W[r,c]·μ̃_c with fp32 products summed in fp64: the row_abs_error_* that
// refine_dsnot reports, for any mask (also one refined another way).
std::vector<double> abs_expected_errors(const Tensor& W, const std::vector<double>& mu, const Mask& mask);
// Per-row values added in row order from 0 (independent of how the rows were processed), and their mean
// (mean_abs_error_*; 0 without rows).
double sum_of_rows(const std::vector<double>& values);
double mean_of_rows(const std::vector<double>& values);

// Σ_r |W[r,c]| over the kept entries of `mask` (‖W̃[:,c]‖₁), summed in row order.
std::vector<double> initial_column_l1(const Tensor& W, const Mask& mask);

}  // namespace symprune
