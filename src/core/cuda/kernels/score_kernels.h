#pragma once
// Host-only header: the kernels of the pruning scores (core/scores.h) on DEVICE pointers. They compute
// exactly what the CPU computes, in fp64 without contractions, so scores agree bit for bit: p-norm
// sums of W's rows (column order) and columns (row order), and ScorePlan's element formula.
#include <cstdint>

#include "core/cuda/device_memory.h"

namespace symprune::cuda {

// *first = the smallest flat index of a NaN or infinite value (unchanged when none; INT64_MAX first).
void launch_first_nonfinite(const float* values, int64_t count, int64_t* first, DeviceStream stream);
// sums[r] = Σ_c add_p(|W[r, c]|) in column order; sums[c] = Σ_r add_p(|W[r, c]|) in row order, with
// core::norm_accumulate's rules (p = 0 counts nonzeros, p = ∞ takes the max, p ∈ {1, 2, 3, 4}).
void launch_row_norm_sums(const float* weight, int64_t m, int64_t n, double p, double* sums,
                          DeviceStream stream);
// With `skip` (a byte mask [m, n]), the entries it marks are passed over (DSnoT's column norms of the
// kept entries).
void launch_column_norm_sums(const float* weight, int64_t m, int64_t n, double p, double* sums,
                             DeviceStream stream, const uint8_t* skip = nullptr);
// stochria's sampled sums over one range of visit_stochria_samples (core/scores.h), for i in [begin, end):
// sums[i] = Σ_k |W[i, picks[(i − begin)·τ + k]]| (columns = false: i a row) or Σ_k |W[picks[...], i]|
// (columns = true: i a column), k in order.
void launch_sampled_abs_sums(const float* weight, int64_t n, const int32_t* picks, int64_t begin, int64_t end,
                             int64_t tau, bool columns, double* sums, DeviceStream stream);
// scores[r - row_begin, c] for r in [row_begin, row_end): ScorePlan's formula of form `form`
// (ScorePlan::Form as an int) with u [m], v [n] and f [n] (null: no factor). *first_saturated (device
// memory, set to INT64_MAX before) becomes the lowest r·n + c whose score saturates (score_saturates).
void launch_plan_scores(const float* weight, int64_t n, int64_t row_begin, int64_t row_end, int form,
                        const double* u, const double* v, const double* f, float* scores,
                        int64_t* first_saturated, DeviceStream stream);

}  // namespace symprune::cuda
