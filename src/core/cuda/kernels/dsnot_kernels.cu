// DSnoT and R²-DSnoT kernels (see dsnot_kernels.h). Every expression is core/refine_dsnot.cc's, written
// with round-to-nearest intrinsics where nvcc would otherwise contract a·b + c into an FMA.
//
// Per row, the swap loop reads each order only from one end, at most 2·max_cycles + 1 entries deep
// (a pointer moves once per cycle plus once per entry it passes over), and each prune list at most
// max_cycles deep. So the block selects those entries (radix select of the order keys, ties by column)
// and ranks the few it keeps, where the CPU uses nth_element windows. Regrow keys that are NaN are left
// out of the lists instead of being passed over: the CPU's pointers skip them, so the entries visited are
// the same.
#include "core/cuda/kernel_platform.cuh"
#include "core/cuda/kernels/block_select.cuh"
#include "core/cuda/kernels/dsnot_kernels.h"
#include "core/cuda/kernels/launch_shape.cuh"
#include "core/cuda/kernels/score_kernels.h"

namespace symprune::cuda {
namespace {

using namespace kernels;

// How deep the swap loop reaches into a regrow order and into a prune list.
__host__ __device__ int64_t regrow_reach(int64_t n, int max_cycles) {
  const int64_t reach = 2 * static_cast<int64_t>(max_cycles) + 1;
  return reach < n ? reach : n;
}
__host__ __device__ int64_t prune_reach(int64_t n, int max_cycles) {
  return max_cycles < n ? max_cycles : n;
}

// What one thread computes serially per row (the CPU's column-order fp64 sums): the expected error e_r
// and R²-DSnoT's norms of the initially kept entries (RowNorm).
struct RowState {
  double error;
  double l1, sumsq, max1, max2;
  int64_t argmax;
  double inv_l1;  // 1/‖W̃[r,:]‖₁, 0 for a zero row
};

struct RowContext {
  const float* w;
  const uint8_t* initial;
  DsnotDeviceColumns columns;
  DsnotKernelOptions options;
  RowState row;
};

__device__ __forceinline__ float expected_term(const float* w, const float* mu, int64_t c) {
  return __fmul_rn(w[c], mu[c]);  // D[r,c], fp32 as the reference
}

// A row's columns for thread 0's in-order sums, kChainTile at a time: D[r, c], |W[r, c]| and a mask's flag,
// staged in shared memory by the whole block (thread 0 reading the row from global memory itself waited
// on its loads, a few hundred cycles per column, about 1 ms per row of 4096).
constexpr int kChainTile = 1024;
struct ChainTile {
  float term[kChainTile];
  float magnitude[kChainTile];
  uint8_t flag[kChainTile];
};

// Calls visit(term, magnitude, flagged, c) on thread 0 for c = 0, 1, …, n − 1 in order, flagged = the
// mask `flags` marks c. The whole block calls it; it ends with a barrier.
template <typename Visit>
__device__ void row_in_order(const float* w, const float* mu, const uint8_t* flags, int64_t n,
                             ChainTile& tile, Visit visit) {
  for (int64_t base = 0; base < n; base += kChainTile) {
    const int count = n - base < kChainTile ? static_cast<int>(n - base) : kChainTile;
    for (int i = static_cast<int>(threadIdx.x); i < count; i += kThreads) {
      tile.term[i] = expected_term(w, mu, base + i);
      tile.magnitude[i] = fabsf(w[base + i]);  // widened: fabs of the double, as the CPU takes it
      tile.flag[i] = flags[base + i];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      SYMPRUNE_UNROLL_BY(8)
      for (int i = 0; i < count; ++i) visit(tile.term[i], tile.magnitude[i], tile.flag[i] != 0, base + i);
    }
    __syncthreads();
  }
}

// Σ of D over the pruned entries, in column order (thread 0's result). An entry not pruned adds +0.0
// instead of being passed over, which is the same: the sum starts at +0.0 and so is never −0.0, and
// x + 0.0 = x for every other x, NaN and infinities included.
__device__ double row_error(const float* w, const float* mu, const uint8_t* pruned, int64_t n,
                            ChainTile& tile) {
  double e = 0.0;
  row_in_order(w, mu, pruned, n, tile, [&](float term, float, bool flagged, int64_t) {
    e = __dadd_rn(e, flagged ? static_cast<double>(term) : 0.0);
  });
  return e;
}

// The row's error and (R²-DSnoT) the norms of its initially kept entries, in one pass (thread 0's result).
__device__ RowState row_state(const float* w, const uint8_t* initial, const float* mu, int64_t n,
                              const DsnotKernelOptions& options, ChainTile& tile) {
  RowState s{};
  s.argmax = -1;
  const bool r2 = options.r2;
  row_in_order(w, mu, initial, n, tile, [&](float term, float magnitude, bool pruned, int64_t c) {
    s.error = __dadd_rn(s.error, pruned ? static_cast<double>(term) : 0.0);  // as row_error
    if (!r2 || pruned) return;
    const double x = static_cast<double>(magnitude);
    s.l1 = __dadd_rn(s.l1, x);
    s.sumsq = __dadd_rn(s.sumsq, __dmul_rn(x, x));
    if (x > s.max1) {
      s.max2 = s.max1;
      s.max1 = x;
      s.argmax = c;
    } else if (x > s.max2) {
      s.max2 = x;
    }
  });
  s.inv_l1 = s.l1 > 0.0 ? __ddiv_rn(1.0, s.l1) : 0.0;
  return s;
}

// RowNorm::with and RowNorm::without (std::max(a, b) is a < b ? b : a).
__device__ double norm_with(const RowState& s, int p, double x) {
  if (p == 1) return __dadd_rn(s.l1, x);
  if (p == 2) return __dsqrt_rn(__dadd_rn(s.sumsq, __dmul_rn(x, x)));
  return s.max1 < x ? x : s.max1;
}
__device__ double norm_without(const RowState& s, int p, int64_t c, double x) {
  if (p == 1) {
    const double rest = __dsub_rn(s.l1, x);
    return rest < 0.0 ? 0.0 : rest;
  }
  if (p == 2) {
    const double rest = __dsub_rn(s.sumsq, __dmul_rn(x, x));
    return __dsqrt_rn(rest < 0.0 ? 0.0 : rest);
  }
  return c == s.argmax ? s.max2 : s.max1;
}

// The regrow key of column c: the up order's, or with `down` the e > 0 direction's own (R²-DSnoT with
// γ₁ > 0; otherwise the two are the same).
__device__ float regrow_key(const RowContext& x, int64_t c, bool down) {
  const DsnotKernelOptions& o = x.options;
  const bool pruned = x.initial[c] != 0;
  const float d = expected_term(x.w, x.columns.mu, c);
  if (!o.r2) {
    float g = pruned ? d : 0.0f;
    if (o.divide_by_var) g = __fdiv_rn(g, x.columns.var_pow[c]);
    return g;
  }
  const double relative = __dadd_rn(x.row.inv_l1, x.columns.col_inv_l1[c]);
  double g = pruned ? __dmul_rn(static_cast<double>(d), o.grow_relative ? relative : 1.0) : 0.0;
  if (o.divide_by_var) g = __ddiv_rn(g, static_cast<double>(x.columns.var_pow[c]));
  if (o.gamma_grow > 0.0 && pruned) {
    const double reg = __dmul_rn(o.gamma_grow, norm_with(x.row, o.reg_p, fabs(static_cast<double>(x.w[c]))));
    return static_cast<float>(down ? __dadd_rn(g, reg) : __dsub_rn(g, reg));
  }
  return static_cast<float>(g);
}

// The prune key of column c: the Wanda score, or R²-DSnoT's.
__device__ float prune_key(const RowContext& x, int64_t c) {
  const DsnotKernelOptions& o = x.options;
  const double abs_w = fabs(static_cast<double>(x.w[c]));
  if (!o.r2) return static_cast<float>(__dmul_rn(abs_w, x.columns.act_norm[c]));
  const double relative = __dadd_rn(x.row.inv_l1, x.columns.col_inv_l1[c]);
  double p = __dmul_rn(__dmul_rn(abs_w, o.prune_relative ? relative : 1.0), x.columns.act_pow[c]);
  if (o.gamma_prune > 0.0) p = __dadd_rn(p, __dmul_rn(o.gamma_prune, norm_without(x.row, o.reg_p, c, abs_w)));
  return static_cast<float>(p);
}

// The `count` smallest (key, index) among the indices i < n with candidate(i), ascending, written to
// `out` as column_of(i); returns how many there are (count, or fewer when fewer are candidates).
// sort_keys: scratch for `count` entries. The whole block calls it.
template <typename Candidate, typename KeyAt, typename ColumnOf>
__device__ int64_t block_smallest(Candidate candidate, KeyAt key_at, ColumnOf column_of, int64_t n,
                                  int64_t count, uint64_t* sort_keys, int32_t* out) {
  int64_t candidates = 0;
  for (int64_t base = 0; base < n; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    int chunk = 0;
    block_exclusive_count(i < n && candidate(i), &chunk);
    candidates += chunk;
  }
  const bool all = count >= candidates;
  int64_t ties = 0;  // how many keys equal to the threshold are taken (the first ones by index)
  const uint32_t threshold = all ? 0u : row_radix_select(key_at, candidate, n, count, &ties);
  int64_t taken = 0, ties_seen = 0;
  for (int64_t base = 0; base < n; base += kThreads) {
    const int64_t i = base + threadIdx.x;
    const bool is_candidate = i < n && candidate(i);
    const uint32_t key = is_candidate ? key_at(i) : 0u;
    const bool tie = is_candidate && !all && key == threshold;
    int tie_chunk = 0;
    const int tie_before = block_exclusive_count(tie, &tie_chunk);
    const bool in = is_candidate && (all || key < threshold || (tie && ties_seen + tie_before < ties));
    ties_seen += tie_chunk;
    int chunk = 0;
    const int before = block_exclusive_count(in, &chunk);
    if (in) sort_keys[taken + before] = (static_cast<uint64_t>(key) << 32) | static_cast<uint64_t>(i);
    taken += chunk;
  }
  __syncthreads();
  // Rank by counting: the keys are distinct (they hold the index) and few (at most 2·max_cycles + 1).
  for (int64_t j = threadIdx.x; j < taken; j += kThreads) {
    const uint64_t own = sort_keys[j];
    int64_t rank = 0;
    for (int64_t other = 0; other < taken; ++other) rank += sort_keys[other] < own ? 1 : 0;
    out[rank] = static_cast<int32_t>(column_of(static_cast<int64_t>(own & 0xffffffffu)));
  }
  __syncthreads();
  return taken;
}

__device__ __forceinline__ int sign_of(double x) {
  return (x > 0.0) - (x < 0.0);
}

// A row's candidate lists (columns, in the order the pointers visit them) and their lengths.
struct RowLists {
  const int32_t* up;  // ascending regrow key: visited while e <= 0
  int64_t up_count;
  const int32_t* down;  // descending (down-order) regrow key: visited while e > 0
  int64_t down_count;
  const int32_t* nonpositive;  // kept, D <= 0 or NaN, ascending prune key: pruned while e >= 0
  int64_t nonpositive_count;
  const int32_t* positive;  // kept, D > 0, ascending prune key: pruned while e < 0
  int64_t positive_count;
};

// refine_row's swap loop, one thread. `current` is the row's mask (initial on entry), `touched` the
// entries N:M never prunes (initially pruned or pruned by a swap).
__device__ void run_swaps(const RowContext& x, const RowLists& lists, uint8_t* current, uint8_t* touched,
                          int64_t n, int64_t row, const DsnotRowResults& results) {
  const DsnotKernelOptions& o = x.options;
  const bool two_orders = o.r2 && o.gamma_grow > 0.0;
  const bool same_sign = o.same_sign || o.nm_m > 0;
  double e = x.row.error;
  const int e0 = sign_of(e);
  int64_t up_next = 0, down_next = 0, nonpositive_next = 0, positive_next = 0, swaps = 0;
  for (int cycle = 0; cycle < o.max_cycles; ++cycle) {
    if (!(fabs(e) > o.threshold)) break;  // threshold on the error before the swap
    int64_t g = -1;
    while (true) {
      if (e > 0.0) {
        if (down_next >= lists.down_count) break;
        g = lists.down[down_next++];
      } else {
        if (up_next >= lists.up_count) break;
        g = lists.up[up_next++];
      }
      // With two orders, an entry already regrown through the other one is passed over.
      if (two_orders && x.initial[g] && !current[g]) {
        g = -1;
        continue;
      }
      break;
    }
    if (g < 0) break;
    const float dg = expected_term(x.w, x.columns.mu, g);
    if (!(e > 0.0 ? dg > 0.0f : dg < 0.0f)) break;  // the regrown weight must move e towards 0
    if (!current[g]) break;  // only a genuine swap (g pruned, p kept) keeps the row's pruned count
    int64_t p = -1;
    if (o.nm_m > 0) {
      // Kept-and-untouched entry of g's block with the smallest prune key (lowest column on ties), among
      // those that move e towards 0 (refine_dsnot.cc). None: this cycle is spent, the next tries the next g
      // (under --compat dsnot none means the block ran out, and the row stops).
      const int64_t start = g - g % o.nm_m;
      uint32_t best = 0;
      for (int64_t c = start; c < start + o.nm_m; ++c) {
        if (touched[c]) continue;
        const float dc = expected_term(x.w, x.columns.mu, c);
        if (!o.nm_prune_any_sign && (e < 0.0 ? !(dc > 0.0f) : dc > 0.0f)) continue;
        const uint32_t key = order_key(prune_key(x, c));
        if (p < 0 || key < best) {
          p = c;
          best = key;
        }
      }
      if (p < 0) {
        if (o.nm_prune_any_sign) break;
        continue;
      }
    } else if (e < 0.0) {
      if (positive_next >= lists.positive_count) break;
      p = lists.positive[positive_next++];
    } else {
      if (nonpositive_next >= lists.nonpositive_count) break;
      p = lists.nonpositive[nonpositive_next++];
    }
    if (current[p]) break;
    const double e_after = __dsub_rn(__dadd_rn(e, static_cast<double>(expected_term(x.w, x.columns.mu, p))),
                                     static_cast<double>(dg));
    if (same_sign && sign_of(e_after) != e0) break;
    current[p] = 1;
    current[g] = 0;
    touched[p] = 1;
    e = e_after;
    ++swaps;
  }
  results.swaps[row] = swaps;
  results.error_before[row] = x.row.error;  // error_after is the block's (dsnot_rows_kernel)
}

__global__ void __launch_bounds__(kThreads)
    dsnot_rows_kernel(const float* __restrict__ weight, int64_t rows, int64_t n, uint8_t* __restrict__ mask,
                      DsnotDeviceColumns columns, DsnotKernelOptions options, DsnotRowResults results,
                      char* __restrict__ scratch, int64_t scratch_per_block) {
  __shared__ RowState shared_state;
  __shared__ ChainTile chain_tile;
  __shared__ int64_t shared_swaps;  // thread 0's count of the row's swaps, for the block's branch below
  const int64_t reach = regrow_reach(n, options.max_cycles), prune_depth = prune_reach(n, options.max_cycles);
  char* own = scratch + static_cast<int64_t>(blockIdx.x) * scratch_per_block;
  uint64_t* sort_keys = reinterpret_cast<uint64_t*>(own);
  int32_t* up = reinterpret_cast<int32_t*>(sort_keys + reach);
  int32_t* down = up + reach;
  int32_t* nonpositive = down + reach;
  int32_t* positive = nonpositive + prune_depth;
  uint8_t* initial = reinterpret_cast<uint8_t*>(positive + prune_depth);
  uint8_t* touched = initial + n;
  const bool two_orders = options.r2 && options.gamma_grow > 0.0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* w = weight + row * n;
    uint8_t* current = mask + row * n;
    for (int64_t c = threadIdx.x; c < n; c += kThreads) {
      initial[c] = current[c];
      touched[c] = current[c];
    }
    __syncthreads();
    const RowState state = row_state(w, initial, columns.mu, n, options, chain_tile);
    if (threadIdx.x == 0) shared_state = state;
    __syncthreads();
    const RowContext x{w, initial, columns, options, shared_state};
    // A row already within the threshold makes no swap: no lists. With the sign test (same-sign, N:M) e
    // keeps its initial sign, so only that direction's lists are read (e > 0: down and non-positive).
    const double e = x.row.error;
    const bool refines = fabs(e) > options.threshold && options.max_cycles > 0;
    const bool sign_fixed = options.same_sign || options.nm_m > 0;
    const bool need_up = refines && !(sign_fixed && e > 0.0),
               need_down = refines && !(sign_fixed && e <= 0.0);
    const auto usable = [&](int64_t c) { return !isnan(regrow_key(x, c, false)); };
    const auto column = [](int64_t i) { return i; };
    RowLists lists{};
    lists.up = up;
    if (need_up)
      lists.up_count = block_smallest(
          usable, [&](int64_t c) { return order_key(regrow_key(x, c, false)); }, column, n, reach, sort_keys,
          up);
    // The down order from its largest key: index i is column n − 1 − i, its key complemented, so that the
    // ascending (key, index) order is the descending (key, column) one.
    lists.down = down;
    if (need_down)
      lists.down_count =
          block_smallest([&](int64_t i) { return usable(n - 1 - i); },
                         [&](int64_t i) { return ~order_key(regrow_key(x, n - 1 - i, two_orders)); },
                         [n](int64_t i) { return n - 1 - i; }, n, reach, sort_keys, down);
    const auto prune_order = [&](int64_t c) { return order_key(prune_key(x, c)); };
    lists.nonpositive = nonpositive;
    if (options.nm_m == 0 && need_down)  // e >= 0 prunes from here; e == 0 stops at the threshold
      lists.nonpositive_count =
          block_smallest([&](int64_t c) { return !initial[c] && !(expected_term(w, columns.mu, c) > 0.0f); },
                         prune_order, column, n, prune_depth, sort_keys, nonpositive);
    lists.positive = positive;
    if (options.nm_m == 0 && need_up)
      lists.positive_count =
          block_smallest([&](int64_t c) { return !initial[c] && expected_term(w, columns.mu, c) > 0.0f; },
                         prune_order, column, n, prune_depth, sort_keys, positive);
    if (threadIdx.x == 0) {
      run_swaps(x, lists, current, touched, n, row, results);
      shared_swaps = results.swaps[row];
    }
    __syncthreads();
    // A row that swapped has its error summed again by the block (row_error holds barriers, so the branch
    // must be the block's: it reads thread 0's count from shared memory, not each thread's load of the
    // global one); one that did not keeps its error.
    if (shared_swaps > 0) {
      const double after = row_error(w, columns.mu, current, n, chain_tile);
      if (threadIdx.x == 0) results.error_after[row] = after;
    } else if (threadIdx.x == 0) {
      results.error_after[row] = x.row.error;
    }
    __syncthreads();  // the next row reuses the scratch and shared_state
  }
}

}  // namespace

int64_t dsnot_scratch_bytes_per_block(int64_t n, int max_cycles) {
  const int64_t reach = regrow_reach(n, max_cycles), depth = prune_reach(n, max_cycles);
  const int64_t bytes = reach * 8 + (2 * reach + 2 * depth) * 4 + 2 * n;
  return (bytes + 7) / 8 * 8;  // the next block's sort keys stay 8-byte aligned
}

void launch_dsnot_rows(const float* weight, int64_t rows, int64_t n, uint8_t* mask,
                       const DsnotDeviceColumns& columns, const DsnotKernelOptions& options,
                       const DsnotRowResults& results, void* scratch, int blocks, DeviceStream stream) {
  if (rows == 0) return;
  if (blocks < 1 || blocks > rows) throw_argument_error("launch_dsnot_rows: blocks outside [1, rows]");
  const int64_t per_block = dsnot_scratch_bytes_per_block(n, options.max_cycles);
  SYMPRUNE_LAUNCH(dsnot_rows_kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0, native(stream),
                  weight, rows, n, mask, columns, options, results, static_cast<char*>(scratch), per_block);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_initial_column_l1(const float* weight, int64_t rows, int64_t n, const uint8_t* mask,
                              double* col_l1, DeviceStream stream) {
  // The ℓ1 column sums of score_kernels with the pruned entries passed over (the same tiles and order).
  launch_column_norm_sums(weight, rows, n, 1.0, col_l1, stream, mask);
}

}  // namespace symprune::cuda
