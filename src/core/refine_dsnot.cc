// DSnoT refinement; see refine_dsnot.h for the semantics and the deliberate differences from the
// reference code (reference-implementations.md §5.2, §5.3).
#include "core/refine_dsnot.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace symprune {
namespace {

int sign_of(double x) {
  return (x > 0.0) - (x < 0.0);
}

// Σ of D over the pruned entries of one row, in column order (double).
double row_error(const std::vector<float>& d, std::span<const uint8_t> pruned) {
  double e = 0.0;
  for (size_t c = 0; c < d.size(); ++c)
    if (pruned[c]) e += static_cast<double>(d[c]);
  return e;
}

// Columns sorted stably ascending by float value (torch order: NaN last, -0.0 == +0.0).
std::vector<int64_t> stable_argsort(const std::vector<float>& key, std::vector<int64_t> columns) {
  std::stable_sort(columns.begin(), columns.end(), [&](int64_t a, int64_t b) {
    return score_order_key(key[static_cast<size_t>(a)]) < score_order_key(key[static_cast<size_t>(b)]);
  });
  return columns;
}

struct RowResult {
  int64_t swaps = 0;
  double error_before = 0.0;
  double error_after = 0.0;
};

RowResult refine_row(const float* w, int64_t n, const std::vector<float>& mu, const std::vector<float>& var,
                     const std::vector<double>& act_norm, std::span<uint8_t> mask,
                     const DsnotOptions& options, const std::optional<NmPattern>& nm) {
  const size_t un = static_cast<size_t>(n);
  std::vector<float> d(un), regrow_key(un), wanda(un);
  for (size_t c = 0; c < un; ++c) {
    d[c] = w[c] * mu[c];  // fp32 product, as the reference
    float g = mask[c] ? d[c] : 0.0f;
    if (options.var_power != 0.0)
      g /= (options.var_power == 1.0 ? var[c] : std::pow(var[c], static_cast<float>(options.var_power)));
    regrow_key[c] = g;  // kept entries are 0, or NaN when v_c == 0 (sorted last, like torch)
    wanda[c] = static_cast<float>(std::fabs(static_cast<double>(w[c])) * act_norm[c]);
  }
  const std::vector<uint8_t> initial(mask.begin(), mask.end());

  RowResult result;
  double e = row_error(d, mask);
  result.error_before = e;
  const int e0 = sign_of(e);
  const bool same_sign = options.same_sign || nm.has_value();

  std::vector<int64_t> all(un);
  std::iota(all.begin(), all.end(), int64_t{0});
  const std::vector<int64_t> regrow = stable_argsort(regrow_key, all);

  // Prune candidates (unstructured): kept columns by ascending Wanda score, D <= 0 (and NaN) first in
  // that order, then D > 0 reversed.
  std::vector<int64_t> candidates;
  if (!nm) {
    std::vector<int64_t> kept;
    for (size_t c = 0; c < un; ++c)
      if (!mask[c]) kept.push_back(static_cast<int64_t>(c));
    kept = stable_argsort(wanda, std::move(kept));
    std::vector<int64_t> positive;
    for (int64_t c : kept) (d[static_cast<size_t>(c)] > 0.0f ? positive : candidates).push_back(c);
    candidates.insert(candidates.end(), positive.rbegin(), positive.rend());
  }

  int64_t a0 = 0, a1 = n - 1, b0 = 0, b1 = static_cast<int64_t>(candidates.size()) - 1;
  for (int cycle = 0; cycle < options.max_cycles; ++cycle) {
    if (!(std::fabs(e) > options.threshold)) break;  // threshold on the error before the swap
    const int64_t gi = e > 0.0 ? a1-- : a0++;
    if (gi < 0 || gi >= n) break;
    const int64_t g = regrow[static_cast<size_t>(gi)];
    int64_t p = -1;
    if (nm) {
      // Kept-and-untouched entry of g's block with the smallest Wanda score (lowest column on ties).
      const int64_t start = g - g % nm->m;
      for (int64_t c = start; c < start + nm->m; ++c) {
        const size_t uc = static_cast<size_t>(c);
        if (initial[uc] || mask[uc]) continue;
        if (p < 0 || score_order_key(wanda[uc]) < score_order_key(wanda[static_cast<size_t>(p)])) p = c;
      }
      if (p < 0) break;
    } else {
      const int64_t pi = e < 0.0 ? b1-- : b0++;
      if (pi < 0 || pi >= static_cast<int64_t>(candidates.size())) break;
      p = candidates[static_cast<size_t>(pi)];
    }
    // Guard: only a genuine swap (g pruned now, p kept now) keeps the row's pruned count.
    if (!mask[static_cast<size_t>(g)] || mask[static_cast<size_t>(p)]) break;
    const double e_after =
        e + static_cast<double>(d[static_cast<size_t>(p)]) - static_cast<double>(d[static_cast<size_t>(g)]);
    if (same_sign && sign_of(e_after) != e0) break;
    mask[static_cast<size_t>(p)] = 1;
    mask[static_cast<size_t>(g)] = 0;
    e = e_after;
    ++result.swaps;
  }
  result.error_after = result.swaps == 0 ? result.error_before : row_error(d, mask);
  return result;
}

}  // namespace

RefineStats refine_dsnot(const Tensor& W, const std::vector<double>& mu, const std::vector<double>& var,
                         const std::vector<double>& act_norm, Mask& mask, const DsnotOptions& options,
                         std::optional<NmPattern> nm) {
  SYMPRUNE_CHECK(W.rank() == 2, "DSnoT: weight must be a matrix [rows, cols], got shape {}",
                 W.shape_string());
  const int64_t m = W.dim(0), n = W.dim(1);
  const auto check_len = [&](const std::vector<double>& v, const char* what) {
    SYMPRUNE_CHECK(static_cast<int64_t>(v.size()) == n,
                   "DSnoT: {} has {} entries but the weight {} has {} columns", what, v.size(),
                   W.shape_string(), n);
  };
  check_len(mu, "mean-sum vector (mu)");
  check_len(var, "variance vector (var)");
  check_len(act_norm, "activation-norm vector (act_norm)");
  SYMPRUNE_CHECK(mask.rows() == m && mask.cols() == n, "DSnoT: mask is [{}, {}] but the weight is {}",
                 mask.rows(), mask.cols(), W.shape_string());
  SYMPRUNE_CHECK(options.max_cycles >= 0, "DSnoT: max_cycles must be >= 0, got {}", options.max_cycles);
  SYMPRUNE_CHECK(options.threshold >= 0.0, "DSnoT: threshold must be a number >= 0, got {}",
                 options.threshold);
  SYMPRUNE_CHECK(std::isfinite(options.var_power), "DSnoT: var_power must be finite, got {}",
                 options.var_power);
  if (nm) {
    SYMPRUNE_CHECK(nm->n >= 1 && nm->m > nm->n && n % nm->m == 0,
                   "DSnoT: N:M pattern {}:{} does not fit a weight with {} columns (need 1 <= N < M, M "
                   "dividing the columns)",
                   nm->n, nm->m, n);
  }

  const std::vector<float> mu_f(mu.begin(), mu.end()), var_f(var.begin(), var.end());
  std::vector<RowResult> rows(static_cast<size_t>(m));
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t r = 0; r < m; ++r)
    rows[static_cast<size_t>(r)] =
        refine_row(W.data() + r * n, n, mu_f, var_f, act_norm, mask.row(r), options, nm);

  RefineStats stats;
  for (const RowResult& row : rows) {  // fixed order: independent of the thread count
    stats.swaps += row.swaps;
    stats.mean_abs_error_before += std::fabs(row.error_before);
    stats.mean_abs_error_after += std::fabs(row.error_after);
  }
  if (m > 0) {
    stats.mean_abs_error_before /= static_cast<double>(m);
    stats.mean_abs_error_after /= static_cast<double>(m);
  }
  return stats;
}

}  // namespace symprune
