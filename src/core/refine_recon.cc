// Reconstruction-error refinement and the refinement guard; see refine_recon.h for the method.
#include "core/refine_recon.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <utility>

#include "core/error.h"

namespace symprune {
namespace {

constexpr int64_t kSlab = 512;                       // columns of G per pass (fixes every sum's order)
constexpr int64_t kBlockBudget = int64_t{64} << 20;  // bytes of pool blocks S per block of rows
constexpr int64_t kGuardBlockRows = 256;             // rows per block in recon_row_changes
constexpr double kMinRelativeGain = 1e-10;           // a swap must gain more than this × its terms

using V4 = double __attribute__((vector_size(32)));
using F4 = float __attribute__((vector_size(16)));

// Loads by memcpy (unaligned); passed by reference, since a vector returned by value would change the
// calling convention between the default and the AVX2 clones.
inline void load4(V4& out, const double* p) {
  std::memcpy(&out, p, sizeof out);
}
inline void load4(V4& out, const float* p) {  // exact: every float is a double
  F4 x;
  std::memcpy(&x, p, sizeof x);
  out = __builtin_convertvector(x, V4);
}

// out[k] = Σ_i g[i]·v[k][i] for kRows vectors sharing one g (each g value is loaded once for all of them).
// Every sum is eight interleaved partial sums (the lanes of two 4-vectors) added pairwise at the end: one
// fixed order for every kRows, thread, instruction set and call, and eight add chains instead of one.
// Products and sums are rounded separately (FMA is not enabled, so nothing is contracted). The v are float:
// Δw and the guard's Δw_initial + Δw_refined are weights times 0, 1 or 2, exact in float, and half the bytes
// of double keep more rows' slabs in L2.
template <int kRows>
[[gnu::always_inline]] inline void dots(const double* g, const float* const* v, int64_t len, double* out) {
  V4 lo[kRows] = {}, hi[kRows] = {};
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    V4 g0, g1, x0, x1;
    load4(g0, g + i);
    load4(g1, g + i + 4);
    for (int k = 0; k < kRows; ++k) {
      load4(x0, v[k] + i);
      load4(x1, v[k] + i + 4);
      lo[k] += g0 * x0;
      hi[k] += g1 * x1;
    }
  }
  for (int k = 0; k < kRows; ++k) {
    double s[8];
    std::memcpy(s, &lo[k], sizeof lo[k]);
    std::memcpy(s + 4, &hi[k], sizeof hi[k]);
    for (int64_t j = i, l = 0; j < len; ++j, ++l) s[l] += g[j] * static_cast<double>(v[k][j]);
    out[k] = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  }
}

// Four at once where the registers allow it (AVX2: 16 vector registers of four doubles); elsewhere four
// single products, with the same results.
[[gnu::target("avx2")]] void dots4_avx2(const double* g, const float* const* v, int64_t len, double* out) {
  dots<4>(g, v, len, out);
}
void dots4_portable(const double* g, const float* const* v, int64_t len, double* out) {
  for (int k = 0; k < 4; ++k) dots<1>(g, v + k, len, out + k);
}
// Chosen at the first call rather than by function multiversioning: its ifunc resolver runs while the
// program is relocated, before a sanitizer runtime is ready (ThreadSanitizer crashes there).
void dots4(const double* g, const float* const* v, int64_t len, double* out) {
  using Dots4 = void (*)(const double*, const float* const*, int64_t, double*);
  static const Dots4 chosen = __builtin_cpu_supports("avx2") ? dots4_avx2 : dots4_portable;
  chosen(g, v, len, out);
}

// The columns of one row whose products with G are needed, and the products.
struct RowProducts {
  std::vector<int64_t> cols;  // ascending
  std::vector<double> dots;   // dots[a] = Σ_j G[cols[a], j]·v[j]
  // G[cols, cols] (only when asked for), stored slab by slab in the order gram_products writes it: entry
  // (a, b) at block[base[b] + a·stride[b]], stride[b] = the number of listed columns in b's slab.
  std::vector<double> block;
  std::vector<int64_t> base, stride;
  double at(size_t a, size_t b) const {
    return block[static_cast<size_t>(base[b] + static_cast<int64_t>(a) * stride[b])];
  }
};

// Fills every rows[i].dots (and block) for the vectors v_i that fill(i, j0, j1, out) writes slab by slab.
// Slab by slab, each row c of G is read once per call and, while its kSlab entries are in L1, used for
// every row whose list holds c; the rows' slabs of v stay in L2. Each product is summed slab by slab in
// column order, so it depends neither on which rows share a call nor on threads. Single-threaded: callers
// run one call per block of rows on each thread, which needs no barrier (a busy machine deschedules
// threads, and every barrier would wait for the slowest).
template <typename Fill>
void gram_products(const double* gram, int64_t n, std::vector<RowProducts>& rows, bool with_block,
                   const Fill& fill) {
  const auto count = static_cast<int64_t>(rows.size());
  // For every column c, the (row, list index) pairs that need G[c, :], by ascending row.
  std::vector<int64_t> first(static_cast<size_t>(n + 1), 0);
  for (RowProducts& row : rows) {
    row.dots.assign(row.cols.size(), 0.0);
    if (with_block) {
      row.block.resize(row.cols.size() * row.cols.size());
      row.base.resize(row.cols.size());
      row.stride.resize(row.cols.size());
    }
    for (int64_t c : row.cols) ++first[static_cast<size_t>(c + 1)];
  }
  for (int64_t c = 0; c < n; ++c) first[static_cast<size_t>(c + 1)] += first[static_cast<size_t>(c)];
  std::vector<std::pair<int64_t, int64_t>> users(static_cast<size_t>(first[static_cast<size_t>(n)]));
  std::vector<int64_t> next(first.begin(), first.end() - 1);
  for (int64_t i = 0; i < count; ++i) {
    const auto& cols = rows[static_cast<size_t>(i)].cols;
    for (size_t a = 0; a < cols.size(); ++a)
      users[static_cast<size_t>(next[static_cast<size_t>(cols[a])]++)] = {i, static_cast<int64_t>(a)};
  }
  std::vector<float> v(static_cast<size_t>(count * kSlab));
  std::vector<std::pair<size_t, size_t>> inside(static_cast<size_t>(count));  // list indices in the slab
  for (int64_t j0 = 0; j0 < n; j0 += kSlab) {
    const int64_t j1 = std::min(n, j0 + kSlab);
    for (int64_t i = 0; i < count; ++i) {
      const auto& cols = rows[static_cast<size_t>(i)].cols;
      if (cols.empty()) continue;
      fill(i, j0, j1, v.data() + i * kSlab);
      const auto lo = static_cast<size_t>(std::lower_bound(cols.begin(), cols.end(), j0) - cols.begin());
      const auto hi = static_cast<size_t>(std::lower_bound(cols.begin(), cols.end(), j1) - cols.begin());
      inside[static_cast<size_t>(i)] = {lo, hi};
      if (!with_block) continue;
      RowProducts& row = rows[static_cast<size_t>(i)];
      for (size_t b = lo; b < hi; ++b) {
        row.base[b] = static_cast<int64_t>(cols.size() * lo + (b - lo));
        row.stride[b] = static_cast<int64_t>(hi - lo);
      }
    }
    for (int64_t c = 0; c < n; ++c) {
      const double* g = gram + c * n;
      const int64_t u0 = first[static_cast<size_t>(c)], u1 = first[static_cast<size_t>(c + 1)];
      for (int64_t u = u0; u < u1; u += 4) {  // four users of G[c, slab] at a time
        const float* vs[4];
        double out[4];
        const int64_t group = std::min<int64_t>(4, u1 - u);
        for (int64_t k = 0; k < 4; ++k)  // a short group repeats its last vector (results unused)
          vs[k] = v.data() + users[static_cast<size_t>(u + std::min(k, group - 1))].first * kSlab;
        dots4(g + j0, vs, j1 - j0, out);
        for (int64_t k = 0; k < group; ++k) {
          const auto [i, a] = users[static_cast<size_t>(u + k)];
          rows[static_cast<size_t>(i)].dots[static_cast<size_t>(a)] += out[k];
        }
      }
      if (!with_block) continue;
      for (int64_t u = u0; u < u1; ++u) {
        const auto [i, a] = users[static_cast<size_t>(u)];
        RowProducts& row = rows[static_cast<size_t>(i)];
        // Rows a of this slab's part are written in ascending a (c ascends): one stream per row.
        const auto [lo, hi] = inside[static_cast<size_t>(i)];
        double* out = row.block.data() + row.cols.size() * lo + static_cast<size_t>(a) * (hi - lo);
        for (size_t b = lo; b < hi; ++b) out[b - lo] = g[row.cols[b]];
      }
    }
  }
}

// The `count` smallest entries of `items` (any order; all of them if count >= size).
template <typename T>
void keep_smallest(std::vector<T>& items, size_t count) {
  if (count >= items.size()) return;
  std::nth_element(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(count), items.end());
  items.resize(count);
}

// Pool ranks are float keys with the column below them in one integer (as mask selection does), so the
// selections are integer nth_elements; ties go to the lower column. `largest` ranks descending.
uint64_t pool_rank(double key, int64_t column, bool largest) {
  const uint32_t order = score_order_key(static_cast<float>(key));
  return (static_cast<uint64_t>(largest ? ~order : order) << 32) | static_cast<uint64_t>(column);
}

// The columns of the selected ranks (width consecutive columns from each), ascending, into cols.
void columns_of(const std::vector<uint64_t>& ranks, int64_t width, std::vector<int64_t>& cols) {
  cols.clear();
  for (uint64_t rank : ranks)
    for (int64_t c = static_cast<int64_t>(rank & 0xffffffffu), end = c + width; c < end; ++c)
      cols.push_back(c);
  std::sort(cols.begin(), cols.end());
}

// Step 1 of refine_recon.h, unstructured: pruned weights of largest and kept weights of smallest saliency.
// grow and keep are scratch space (reused, so a row allocates nothing).
void saliency_pool(const float* w, std::span<const uint8_t> pruned, const std::vector<double>& diag,
                   int64_t pool, std::vector<uint64_t>& grow, std::vector<uint64_t>& keep,
                   std::vector<int64_t>& cols) {
  grow.clear();
  keep.clear();
  for (size_t c = 0; c < pruned.size(); ++c) {
    const double x = w[c];
    const double saliency = x * x * diag[c];
    if (pruned[c])
      grow.push_back(pool_rank(saliency, static_cast<int64_t>(c), /*largest=*/true));
    else
      keep.push_back(pool_rank(saliency, static_cast<int64_t>(c), /*largest=*/false));
  }
  if (grow.empty() || keep.empty()) {
    cols.clear();
    return;
  }
  const auto budget = static_cast<size_t>(pool);
  keep_smallest(grow, std::max(budget / 2, budget - std::min(budget, keep.size())));
  keep_smallest(keep, budget - grow.size());
  grow.insert(grow.end(), keep.begin(), keep.end());
  columns_of(grow, 1, cols);
}

// Step 1, N:M: the groups whose best swap by saliency costs least, all their columns.
void group_pool(const float* w, std::span<const uint8_t> pruned, const std::vector<double>& diag,
                int64_t pool, int m, std::vector<uint64_t>& groups, std::vector<int64_t>& cols) {
  groups.clear();
  const auto n = static_cast<int64_t>(pruned.size());
  for (int64_t start = 0; start < n; start += m) {
    double top_pruned = -1.0, low_kept = -1.0;
    for (int64_t c = start; c < start + m; ++c) {
      const double x = w[c];
      const double saliency = x * x * diag[static_cast<size_t>(c)];
      if (pruned[static_cast<size_t>(c)])
        top_pruned = std::max(top_pruned, saliency);
      else if (low_kept < 0.0 || saliency < low_kept)
        low_kept = saliency;
    }
    if (top_pruned >= 0.0 && low_kept >= 0.0)
      groups.push_back(pool_rank(low_kept - top_pruned, start, false));
  }
  keep_smallest(groups, static_cast<size_t>(std::max<int64_t>(1, pool / m)));
  columns_of(groups, m, cols);
}

// The `count` entries of `candidates` (ascending pool indices) with the smallest own δ, ties to the lower
// index, NaN never: insertion into a short sorted list (most entries fail the first comparison).
void shortlist(const std::vector<double>& own, const std::vector<size_t>& candidates, int count,
               std::vector<size_t>& out) {
  out.clear();
  const auto limit = static_cast<size_t>(count);
  for (size_t a : candidates) {
    if (std::isnan(own[a])) continue;
    if (out.size() == limit) {
      if (!(own[a] < own[out.back()])) continue;
      out.pop_back();
    }
    size_t at = out.size();
    while (at > 0 && own[a] < own[out[at - 1]]) --at;
    out.insert(out.begin() + static_cast<std::ptrdiff_t>(at), a);
  }
}

// Moves pool index a from one ascending list to another, keeping both ascending.
void move_index(size_t a, std::vector<size_t>& from, std::vector<size_t>& to) {
  from.erase(std::lower_bound(from.begin(), from.end(), a));
  to.insert(std::lower_bound(to.begin(), to.end(), a), a);
}

struct RowResult {
  int64_t swaps = 0;
  double change = 0.0;  // Σ of the accepted δ
};

// Step 3 on one row's pool; writes the pool's entries of the mask row.
RowResult search_row(const float* w, std::span<uint8_t> pruned, const RowProducts& pool,
                     const ReconOptions& options, std::optional<NmPattern> nm) {
  const size_t p = pool.cols.size();
  RowResult result;
  if (p == 0) return result;
  std::vector<double> x(p), g = pool.dots, own(p), diag(p), two_sign(p);  // two_sign: −2 pruned, +2 kept
  std::vector<uint8_t> is_pruned(p);
  std::vector<size_t> pruned_list, kept_list, grow, keep;
  for (size_t a = 0; a < p; ++a) {
    x[a] = w[pool.cols[a]];
    diag[a] = pool.at(a, a);
    is_pruned[a] = pruned[static_cast<size_t>(pool.cols[a])];
    two_sign[a] = is_pruned[a] ? -2.0 : 2.0;
    // A weight that is zero (in a model pruned before) changes nothing whether pruned or kept: swapping it
    // would only change how many weights of the row are zero.
    if (x[a] != 0.0) (is_pruned[a] ? pruned_list : kept_list).push_back(a);
  }
  for (int cycle = 0; cycle < options.max_cycles; ++cycle) {
    for (size_t a = 0; a < p; ++a) own[a] = x[a] * x[a] * diag[a] + two_sign[a] * x[a] * g[a];
    // Best pair; pool indices ascend with the columns, so index order is the column tie-break.
    double best = std::numeric_limits<double>::infinity();
    size_t best_a = p, best_b = p;
    const auto consider = [&](size_t a, size_t b) {
      const double delta = own[a] + own[b] - 2.0 * x[a] * x[b] * pool.at(a, b);
      if (!(delta <= best)) return;  // also passes over NaN
      if (delta == best && best_a < p && (a > best_a || (a == best_a && b > best_b))) return;
      best = delta;
      best_a = a;
      best_b = b;
    };
    if (nm) {
      const auto m = static_cast<size_t>(nm->m);
      for (size_t start = 0; start < p; start += m)
        for (size_t a = start; a < start + m; ++a)
          if (is_pruned[a] && x[a] != 0.0)
            for (size_t b = start; b < start + m; ++b)
              if (!is_pruned[b] && x[b] != 0.0) consider(a, b);
    } else {
      shortlist(own, pruned_list, options.shortlist, grow);
      shortlist(own, kept_list, options.shortlist, keep);
      for (size_t a : grow)
        for (size_t b : keep) consider(a, b);
    }
    if (best_a == p) break;
    const size_t a = best_a, b = best_b;
    const double scale = std::fabs(own[a]) + std::fabs(own[b]) + 2.0 * std::fabs(x[a] * g[a]) +
                         2.0 * std::fabs(x[b] * g[b]) + 2.0 * std::fabs(x[a] * x[b] * pool.at(a, b));
    if (!(best < -kMinRelativeGain * scale)) break;
    is_pruned[a] = 0;
    is_pruned[b] = 1;
    two_sign[a] = 2.0;
    two_sign[b] = -2.0;
    move_index(a, pruned_list, kept_list);
    move_index(b, kept_list, pruned_list);
    const double* column_b = pool.block.data() + pool.base[b];
    const double* column_a = pool.block.data() + pool.base[a];
    const int64_t stride_b = pool.stride[b], stride_a = pool.stride[a];
    for (size_t i = 0; i < p; ++i)  // S symmetric: column a of S is row a
      g[i] += x[b] * column_b[static_cast<int64_t>(i) * stride_b] -
              x[a] * column_a[static_cast<int64_t>(i) * stride_a];
    result.change += best;
    ++result.swaps;
  }
  for (size_t a = 0; a < p; ++a) pruned[static_cast<size_t>(pool.cols[a])] = is_pruned[a];
  return result;
}

void check_shapes(const Tensor& W, const double* gram, int64_t n, const Mask& mask, const char* mask_name) {
  SYMPRUNE_CHECK(W.rank() == 2, "recon refinement: weight must be a matrix [rows, cols], got shape {}",
                 W.shape_string());
  SYMPRUNE_CHECK(W.dim(1) == n,
                 "recon refinement: the Gram matrix is {} x {} but the weight {} has {} columns", n, n,
                 W.shape_string(), W.dim(1));
  SYMPRUNE_CHECK(gram != nullptr || n == 0, "recon refinement: no Gram matrix");
  SYMPRUNE_CHECK(mask.rows() == W.dim(0) && mask.cols() == n,
                 "recon refinement: {} is [{}, {}] but the weight is {}", mask_name, mask.rows(), mask.cols(),
                 W.shape_string());
}

}  // namespace

void validate_recon_options(const ReconOptions& options) {
  SYMPRUNE_CHECK(options.max_cycles >= 0, "--max-cycles must be >= 0, got {}", options.max_cycles);
  SYMPRUNE_CHECK(options.pool >= 2, "recon refinement: pool must be >= 2, got {}", options.pool);
  SYMPRUNE_CHECK(options.shortlist >= 1, "recon refinement: shortlist must be >= 1, got {}",
                 options.shortlist);
}

RefineStats refine_recon(const Tensor& W, const double* gram, int64_t n, Mask& mask,
                         const ReconOptions& options, std::optional<NmPattern> nm) {
  check_shapes(W, gram, n, mask, "mask");
  validate_recon_options(options);
  if (nm)
    SYMPRUNE_CHECK(
        nm->n >= 1 && nm->m > nm->n && n % nm->m == 0,
        "recon refinement: N:M pattern {}:{} does not fit a weight with {} columns (need 1 <= N < M, "
        "M dividing the columns)",
        nm->n, nm->m, n);
  const int64_t m = W.dim(0);
  for (int64_t i = 0; i < W.numel(); ++i)
    SYMPRUNE_CHECK(std::isfinite(W[i]), "recon refinement: weight {} has a non-finite value at [{}, {}]",
                   W.shape_string(), i / n, i % n);
  std::vector<double> diag(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; ++c) {
    diag[static_cast<size_t>(c)] = gram[c * n + c];
    SYMPRUNE_CHECK(diag[static_cast<size_t>(c)] >= 0.0 && std::isfinite(diag[static_cast<size_t>(c)]),
                   "recon refinement: Gram matrix diagonal entry {} is {}, not a finite number >= 0", c,
                   diag[static_cast<size_t>(c)]);
  }
  RefineStats stats;
  if (options.max_cycles == 0 || m == 0 || n < 2) {
    stats.row_recon_sq_change.assign(static_cast<size_t>(m), 0.0);
    stats.recon_sq_change = 0.0;
    return stats;
  }

  const int64_t pool = std::min<int64_t>(options.pool, n);
  // Blocks of rows, one at a time per thread: a block's pool blocks S fit kBlockBudget, and G is streamed
  // once per block. The block size changes the time, never a result.
  const int64_t block_rows = std::clamp<int64_t>(kBlockBudget / (8 * pool * pool), 1, m);
  const int64_t blocks = (m + block_rows - 1) / block_rows;
  std::vector<RowResult> results(static_cast<size_t>(m));
#pragma omp parallel
  {
    std::vector<RowProducts> rows;
    std::vector<uint64_t> grow, keep;
#pragma omp for schedule(dynamic, 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t begin = blk * block_rows, count = std::min(block_rows, m - begin);
      rows.resize(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        const float* w = W.data() + (begin + i) * n;
        auto& cols = rows[static_cast<size_t>(i)].cols;
        if (nm)
          group_pool(w, mask.row(begin + i), diag, pool, nm->m, grow, cols);
        else
          saliency_pool(w, mask.row(begin + i), diag, pool, grow, keep, cols);
      }
      gram_products(gram, n, rows, /*with_block=*/true, [&](int64_t i, int64_t j0, int64_t j1, float* out) {
        const float* w = W.data() + (begin + i) * n;
        const auto pruned = mask.row(begin + i);
        for (int64_t j = j0; j < j1; ++j) out[j - j0] = pruned[static_cast<size_t>(j)] ? w[j] : 0.0f;
      });
      for (int64_t i = 0; i < count; ++i)
        results[static_cast<size_t>(begin + i)] = search_row(W.data() + (begin + i) * n, mask.row(begin + i),
                                                             rows[static_cast<size_t>(i)], options, nm);
    }
  }
  for (const RowResult& row : results) {
    stats.swaps += row.swaps;
    stats.row_recon_sq_change.push_back(row.change);
  }
  stats.recon_sq_change = sum_of_rows(stats.row_recon_sq_change);
  return stats;
}

std::vector<double> recon_row_changes(const Tensor& W, const double* gram, int64_t n, const Mask& initial,
                                      const Mask& refined) {
  check_shapes(W, gram, n, initial, "initial mask");
  check_shapes(W, gram, n, refined, "refined mask");
  const int64_t m = W.dim(0);
  std::vector<double> changes(static_cast<size_t>(m), 0.0);
  const int64_t blocks = (m + kGuardBlockRows - 1) / kGuardBlockRows;
#pragma omp parallel
  {
    std::vector<RowProducts> rows;
#pragma omp for schedule(dynamic, 1)
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t begin = blk * kGuardBlockRows, count = std::min(kGuardBlockRows, m - begin);
      rows.resize(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i) {
        const auto before = initial.row(begin + i), after = refined.row(begin + i);
        auto& cols = rows[static_cast<size_t>(i)].cols;
        cols.clear();
        for (int64_t c = 0; c < n; ++c)
          if (before[static_cast<size_t>(c)] != after[static_cast<size_t>(c)]) cols.push_back(c);
      }
      // v = Δw_initial + Δw_refined: w·{0, 1, 2}, exact in float (2w overflows only beyond 1.7e38, to an
      // infinite change that reverts the row).
      gram_products(gram, n, rows, /*with_block=*/false, [&](int64_t i, int64_t j0, int64_t j1, float* out) {
        const float* w = W.data() + (begin + i) * n;
        const auto before = initial.row(begin + i), after = refined.row(begin + i);
        for (int64_t j = j0; j < j1; ++j)
          out[j - j0] =
              w[j] * static_cast<float>(before[static_cast<size_t>(j)] + after[static_cast<size_t>(j)]);
      });
      for (int64_t i = 0; i < count; ++i) {
        const RowProducts& row = rows[static_cast<size_t>(i)];
        const int64_t r = begin + i;
        const float* w = W.data() + r * n;
        double change = 0.0;
        for (size_t a = 0; a < row.cols.size(); ++a) {
          const int64_t c = row.cols[a];
          const double d =
              refined.pruned(r, c) ? w[c] : -static_cast<double>(w[c]);  // Δw_refined − Δw_initial
          change += d * row.dots[a];
        }
        changes[static_cast<size_t>(r)] = change;
      }
    }
  }
  return changes;
}

int64_t revert_rows_that_rose(const Mask& initial, Mask& refined, std::vector<double>& row_changes) {
  SYMPRUNE_CHECK(initial.rows() == refined.rows() && initial.cols() == refined.cols() &&
                     static_cast<int64_t>(row_changes.size()) == refined.rows(),
                 "refinement guard: masks [{}, {}] and [{}, {}] with {} row changes do not match",
                 initial.rows(), initial.cols(), refined.rows(), refined.cols(), row_changes.size());
  int64_t reverted = 0;
  for (int64_t r = 0; r < refined.rows(); ++r) {
    if (!(row_changes[static_cast<size_t>(r)] > 0.0)) continue;
    const auto from = initial.row(r);
    std::copy(from.begin(), from.end(), refined.row(r).begin());
    row_changes[static_cast<size_t>(r)] = 0.0;
    ++reverted;
  }
  return reverted;
}

}  // namespace symprune
