// DSnoT and R²-DSnoT refinement; see refine_dsnot.h for the semantics and the deliberate differences
// from the reference code (reference-implementations.md §5.2, §5.3).
#include "core/refine_dsnot.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
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

// The stable ascending order of a float key (torch order: NaN last, -0.0 == +0.0) is the order of the
// 64-bit composite (score_order_key << 32 | column), a total order on plain integers, so partial
// selections (nth_element) reproduce the full stable sort exactly and cheaply.
uint64_t order_of(float key, int64_t column) {
  return (static_cast<uint64_t>(score_order_key(key)) << 32) | static_cast<uint64_t>(column);
}
int64_t column_of(uint64_t order) {
  return static_cast<int64_t>(order & 0xffffffffu);
}

// The `count` smallest orders, ascending, as columns (all of them if count >= size).
std::vector<int64_t> smallest(std::vector<uint64_t> orders, size_t count) {
  if (count < orders.size()) {
    std::nth_element(orders.begin(), orders.begin() + static_cast<std::ptrdiff_t>(count), orders.end());
    orders.resize(count);
  }
  std::sort(orders.begin(), orders.end());
  std::vector<int64_t> columns(orders.size());
  std::transform(orders.begin(), orders.end(), columns.begin(), column_of);
  return columns;
}

// Positions [0, front) and [n − back, n) of the order of `key` over all n columns: a row's regrow
// pointers never get further than 2·max_cycles (+ the NaN keys passed over) from their end, so sorting
// the whole row (n log n, the dominant cost at n = 4096) is not needed.
class OrderWindow {
 public:
  OrderWindow(const std::vector<float>& key, size_t front, size_t back) : n_(key.size()) {
    std::vector<uint64_t> orders(n_);
    for (size_t c = 0; c < n_; ++c) orders[c] = order_of(key[c], static_cast<int64_t>(c));
    if (front + back >= n_) {
      front_ = smallest(std::move(orders), n_);
      return;
    }
    std::nth_element(orders.begin(), orders.begin() + static_cast<std::ptrdiff_t>(front), orders.end());
    front_ = smallest(
        std::vector<uint64_t>(orders.begin(), orders.begin() + static_cast<std::ptrdiff_t>(front)), front);
    // The largest `back` of the rest, descending: back_[j] is position n − 1 − j.
    auto rest = orders.begin() + static_cast<std::ptrdiff_t>(front);
    std::nth_element(rest, rest + static_cast<std::ptrdiff_t>(back), orders.end(), std::greater<>());
    std::sort(rest, rest + static_cast<std::ptrdiff_t>(back), std::greater<>());
    back_.resize(back);
    std::transform(rest, rest + static_cast<std::ptrdiff_t>(back), back_.begin(), column_of);
  }
  // The column at position i of the order, or -1 outside the window.
  int64_t at(int64_t i) const {
    const size_t ui = static_cast<size_t>(i);
    if (ui < front_.size()) return front_[ui];
    const size_t from_end = n_ - 1 - ui;
    return from_end < back_.size() ? back_[from_end] : -1;
  }

 private:
  size_t n_;
  std::vector<int64_t> front_, back_;
};

// Per-matrix inputs shared by every row.
struct MatrixContext {
  int64_t n = 0;
  DsnotColumns columns;
  const DsnotOptions* options = nullptr;
  std::optional<NmPattern> nm;
};

// ‖W̃[r,:]‖_p of the initially kept entries, and the same norm after adding (grow) or removing
// (prune) one entry of magnitude x. For p = ∞ removing needs the top two magnitudes.
class RowNorm {
 public:
  RowNorm(const float* w, std::span<const uint8_t> mask, double p) : p_(p) {
    for (size_t c = 0; c < mask.size(); ++c) {
      if (mask[c]) continue;
      const double x = std::fabs(static_cast<double>(w[c]));
      l1_ += x;
      sumsq_ += x * x;
      if (x > max1_) {
        max2_ = max1_;
        max1_ = x;
        argmax_ = static_cast<int64_t>(c);
      } else if (x > max2_) {
        max2_ = x;
      }
    }
  }
  double l1() const { return l1_; }
  double with(double x) const {
    if (p_ == 1.0) return l1_ + x;
    if (p_ == 2.0) return std::sqrt(sumsq_ + x * x);
    return std::max(max1_, x);
  }
  double without(int64_t c, double x) const {
    if (p_ == 1.0) return std::max(l1_ - x, 0.0);
    if (p_ == 2.0) return std::sqrt(std::max(sumsq_ - x * x, 0.0));
    return c == argmax_ ? max2_ : max1_;
  }

 private:
  double p_;
  double l1_ = 0.0, sumsq_ = 0.0, max1_ = 0.0, max2_ = 0.0;
  int64_t argmax_ = -1;
};

struct RowResult {
  int64_t swaps = 0;
  double error_before = 0.0;
  double error_after = 0.0;
};

RowResult refine_row(const float* w, std::span<uint8_t> mask, const MatrixContext& ctx) {
  const DsnotOptions& options = *ctx.options;
  const R2Options* r2 = options.r2 ? &*options.r2 : nullptr;
  const int64_t n = ctx.n;
  const size_t un = static_cast<size_t>(n);
  std::vector<float> d(un), regrow_key(un), prune_key(un);
  std::vector<float> regrow_key_down;  // R²-DSnoT with γ₁ > 0: the e > 0 direction's own order
  const bool two_regrow_orders = r2 != nullptr && r2->gamma_grow > 0.0;
  if (two_regrow_orders) regrow_key_down.resize(un);
  std::optional<RowNorm> norm;
  double row_inv_l1 = 0.0;
  if (r2) {
    norm.emplace(w, mask, r2->reg_p);
    row_inv_l1 = norm->l1() > 0.0 ? 1.0 / norm->l1() : 0.0;
  }
  const DsnotColumns& cols = ctx.columns;
  for (size_t c = 0; c < un; ++c) {
    d[c] = w[c] * cols.mu[c];  // fp32 product, as the reference
    const float v_pow = cols.var_pow[c];
    const double abs_w = std::fabs(static_cast<double>(w[c]));
    if (!r2) {
      float g = mask[c] ? d[c] : 0.0f;
      if (options.var_power != 0.0) g /= v_pow;
      regrow_key[c] = g;  // kept entries are 0, or NaN when v_c == 0 (sorted last, like torch)
      prune_key[c] = static_cast<float>(abs_w * cols.act_norm[c]);  // the Wanda score
      continue;
    }
    const double relative = row_inv_l1 + cols.col_inv_l1[c];
    double g = mask[c] ? static_cast<double>(d[c]) * (r2->grow_relative ? relative : 1.0) : 0.0;
    if (options.var_power != 0.0) g /= static_cast<double>(v_pow);
    if (two_regrow_orders && mask[c]) {
      const double reg = r2->gamma_grow * norm->with(abs_w);
      regrow_key[c] = static_cast<float>(g - reg);
      regrow_key_down[c] = static_cast<float>(g + reg);
    } else {
      regrow_key[c] = static_cast<float>(g);
      if (two_regrow_orders) regrow_key_down[c] = static_cast<float>(g);
    }
    double p = abs_w * (r2->prune_relative ? relative : 1.0) * cols.act_pow[c];
    if (r2->gamma_prune > 0.0) p += r2->gamma_prune * norm->without(static_cast<int64_t>(c), abs_w);
    prune_key[c] = static_cast<float>(p);
  }
  const std::vector<uint8_t> initial(mask.begin(), mask.end());
  // N:M: the reference's S' = +inf entries, never prune candidates: the initially pruned ones and every
  // weight pruned by a swap (also after it was regrown again).
  std::vector<uint8_t> touched = initial;

  RowResult result;
  double e = row_error(d, mask);
  result.error_before = e;
  const int e0 = sign_of(e);
  const bool same_sign = options.same_sign || ctx.nm.has_value();

  // Regrow lists: each pointer moves at most once per cycle plus once per entry passed over (NaN keys at
  // the back; with two orders, at most one regrown entry per earlier swap).
  const size_t cycles = static_cast<size_t>(options.max_cycles);
  const size_t nan_keys = static_cast<size_t>(
      std::count_if(regrow_key.begin(), regrow_key.end(), [](float k) { return std::isnan(k); }));
  const OrderWindow regrow_up(regrow_key, 2 * cycles + 1, 2 * cycles + nan_keys + 1);
  std::optional<OrderWindow> regrow_down_own;
  if (two_regrow_orders) regrow_down_own.emplace(regrow_key_down, 2 * cycles + 1, 2 * cycles + nan_keys + 1);
  const OrderWindow& regrow_down = two_regrow_orders ? *regrow_down_own : regrow_up;

  // Prune candidates (unstructured): the reference's list is the kept columns by ascending prune key,
  // D <= 0 (and NaN) first in that order, then D > 0 reversed; its front pointer (e >= 0) walks the first
  // part, its back pointer (e < 0) the second from its smallest key, each at most once per cycle, and
  // leaving its part stops the row (sign guard). So only the `cycles` smallest of each part are needed.
  std::vector<int64_t> prune_nonpositive, prune_positive;
  if (!ctx.nm) {
    std::vector<uint64_t> nonpositive, positive;
    for (size_t c = 0; c < un; ++c)
      if (!mask[c])
        (d[c] > 0.0f ? positive : nonpositive).push_back(order_of(prune_key[c], static_cast<int64_t>(c)));
    prune_nonpositive = smallest(std::move(nonpositive), cycles);
    prune_positive = smallest(std::move(positive), cycles);
  }

  int64_t a0 = 0, a1 = n - 1;
  size_t next_nonpositive = 0, next_positive = 0;
  for (int cycle = 0; cycle < options.max_cycles; ++cycle) {
    if (!(std::fabs(e) > options.threshold)) break;  // threshold on the error before the swap
    int64_t g = -1;
    while (true) {
      const int64_t gi = e > 0.0 ? a1-- : a0++;
      if (gi < 0 || gi >= n) break;
      g = (e > 0.0 ? regrow_down : regrow_up).at(gi);
      if (g < 0) break;  // outside the window: unreachable (see above), but never read past it
      // Passed over: NaN keys (0/0 from a zero-variance channel; no information, sorted last) and, with two
      // orders, entries already regrown through the other direction.
      const bool nan_key = std::isnan(regrow_key[static_cast<size_t>(g)]);
      const bool regrown = initial[static_cast<size_t>(g)] && !mask[static_cast<size_t>(g)];
      if (nan_key || (two_regrow_orders && regrown)) {
        g = -1;
        continue;
      }
      break;
    }
    if (g < 0) break;
    // Sign guard (the paper's Δ < 0 condition): the regrown weight must move e towards 0.
    if (!(e > 0.0 ? d[static_cast<size_t>(g)] > 0.0f : d[static_cast<size_t>(g)] < 0.0f)) break;
    // Guard: only a genuine swap (g pruned now, p kept now) keeps the row's pruned count. A kept g means the
    // pointer ran into the kept middle of the order (or onto an entry regrown earlier): the row stops.
    if (!mask[static_cast<size_t>(g)]) break;
    int64_t p = -1;
    if (ctx.nm) {
      // Kept-and-untouched entry of g's block with the smallest prune key (lowest column on ties), among
      // those that move e towards 0, as in the unstructured lists (the reference code takes the smallest
      // key whatever its sign, so that |e| may grow as long as its sign holds). A block without one only
      // rules out this g: the cycle is spent (its pointer has moved on) and the next cycle tries the next g.
      // Under --compat dsnot the block ran out of untouched entries, where the code would read garbage.
      const int64_t start = g - g % ctx.nm->m;
      for (int64_t c = start; c < start + ctx.nm->m; ++c) {
        const size_t uc = static_cast<size_t>(c);
        if (touched[uc]) continue;
        if (!options.nm_prune_any_sign && (e < 0.0 ? !(d[uc] > 0.0f) : d[uc] > 0.0f)) continue;
        if (p < 0 || score_order_key(prune_key[uc]) < score_order_key(prune_key[static_cast<size_t>(p)]))
          p = c;
      }
      if (p < 0) {
        if (options.nm_prune_any_sign) break;
        continue;
      }
    } else {
      // Sign guard: for e >= 0 the pruned weight must have D <= 0, for e < 0 D > 0. A part runs out only
      // in a row with fewer kept weights of the needed sign than cycles; the reference's pointer would then
      // run into the other sign's part of the list and prune its highest-scoring weights.
      const std::vector<int64_t>& part = e < 0.0 ? prune_positive : prune_nonpositive;
      size_t& next = e < 0.0 ? next_positive : next_nonpositive;
      if (next >= part.size()) break;
      p = part[next++];
    }
    if (mask[static_cast<size_t>(p)]) break;
    const double e_after =
        e + static_cast<double>(d[static_cast<size_t>(p)]) - static_cast<double>(d[static_cast<size_t>(g)]);
    if (same_sign && sign_of(e_after) != e0) break;
    mask[static_cast<size_t>(p)] = 1;
    mask[static_cast<size_t>(g)] = 0;
    touched[static_cast<size_t>(p)] = 1;
    e = e_after;
    ++result.swaps;
  }
  result.error_after = result.swaps == 0 ? result.error_before : row_error(d, mask);
  return result;
}

}  // namespace

std::vector<double> initial_column_l1(const Tensor& W, const Mask& mask) {
  SYMPRUNE_CHECK(W.rank() == 2 && mask.rows() == W.dim(0) && mask.cols() == W.dim(1),
                 "initial_column_l1: mask [{}, {}] does not match the weight {}", mask.rows(), mask.cols(),
                 W.shape_string());
  const int64_t m = W.dim(0), n = W.dim(1);
  std::vector<double> col_l1(static_cast<size_t>(n), 0.0);
  for (int64_t r = 0; r < m; ++r) {
    const float* w = W.data() + r * n;
    const auto row = mask.row(r);
    for (int64_t c = 0; c < n; ++c)
      if (!row[static_cast<size_t>(c)])
        col_l1[static_cast<size_t>(c)] += std::fabs(static_cast<double>(w[c]));
  }
  return col_l1;
}

std::vector<double> abs_expected_errors(const Tensor& W, const std::vector<double>& mu, const Mask& mask) {
  SYMPRUNE_CHECK(W.rank() == 2 && mask.rows() == W.dim(0) && mask.cols() == W.dim(1) &&
                     static_cast<int64_t>(mu.size()) == W.dim(1),
                 "abs_expected_errors: mask [{}, {}] and {} means do not match the weight {}", mask.rows(),
                 mask.cols(), mu.size(), W.shape_string());
  const int64_t m = W.dim(0), n = W.dim(1);
  const std::vector<float> mu_f(mu.begin(), mu.end());  // refine_dsnot's fp32 products
  std::vector<double> errors(static_cast<size_t>(m));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < m; ++r) {
    std::vector<float> d(static_cast<size_t>(n));
    for (int64_t c = 0; c < n; ++c)
      d[static_cast<size_t>(c)] = W.data()[r * n + c] * mu_f[static_cast<size_t>(c)];
    errors[static_cast<size_t>(r)] = std::fabs(row_error(d, mask.row(r)));
  }
  return errors;
}

double sum_of_rows(const std::vector<double>& values) {
  double sum = 0.0;
  for (double v : values) sum += v;
  return sum;
}

double mean_of_rows(const std::vector<double>& values) {
  return values.empty() ? 0.0 : sum_of_rows(values) / static_cast<double>(values.size());
}

void validate_dsnot_options(const DsnotOptions& options) {
  SYMPRUNE_CHECK(options.max_cycles >= 0, "--max-cycles must be >= 0, got {}", options.max_cycles);
  SYMPRUNE_CHECK(options.threshold >= 0.0, "--refine-threshold must be a number >= 0, got {}",
                 options.threshold);
  SYMPRUNE_CHECK(std::isfinite(options.var_power), "--var-power must be finite, got {}", options.var_power);
  if (!options.r2) return;
  const R2Options& r2 = *options.r2;
  SYMPRUNE_CHECK(r2.reg_p == 1.0 || r2.reg_p == 2.0 || r2.reg_p == std::numeric_limits<double>::infinity(),
                 "--reg-p must be 1, 2 or inf, got {}", r2.reg_p);
  SYMPRUNE_CHECK(r2.gamma_grow >= 0.0 && std::isfinite(r2.gamma_grow),
                 "--gamma-grow must be a finite number >= 0, got {}", r2.gamma_grow);
  SYMPRUNE_CHECK(r2.gamma_prune >= 0.0 && std::isfinite(r2.gamma_prune),
                 "--gamma-prune must be a finite number >= 0, got {}", r2.gamma_prune);
  SYMPRUNE_CHECK(r2.alpha >= 0.0 && std::isfinite(r2.alpha),
                 "--refine-alpha must be a finite number >= 0, got {}", r2.alpha);
}

void check_dsnot_arguments(int64_t m, int64_t n, const std::string& shape_string,
                           const std::vector<double>& mu, const std::vector<double>& var,
                           const std::vector<double>& act_norm, const Mask& mask, const DsnotOptions& options,
                           std::optional<NmPattern> nm, const std::vector<double>* column_l1) {
  const auto check_len = [&](const std::vector<double>& v, const char* what) {
    SYMPRUNE_CHECK(static_cast<int64_t>(v.size()) == n,
                   "DSnoT: {} has {} entries but the weight {} has {} columns", what, v.size(), shape_string,
                   n);
  };
  check_len(mu, "mean-sum vector (mu)");
  check_len(var, "variance vector (var)");
  check_len(act_norm, "activation-norm vector (act_norm)");
  SYMPRUNE_CHECK(mask.rows() == m && mask.cols() == n, "DSnoT: mask is [{}, {}] but the weight is {}",
                 mask.rows(), mask.cols(), shape_string);
  validate_dsnot_options(options);
  if (nm) {
    SYMPRUNE_CHECK(nm->n >= 1 && nm->m > nm->n && n % nm->m == 0,
                   "DSnoT: N:M pattern {}:{} does not fit a weight with {} columns (need 1 <= N < M, M "
                   "dividing the columns)",
                   nm->n, nm->m, n);
  }
  if (options.r2 && column_l1 != nullptr)
    SYMPRUNE_CHECK(static_cast<int64_t>(column_l1->size()) == n,
                   "DSnoT: column_l1 has {} entries but the weight {} has {} columns", column_l1->size(),
                   shape_string, n);
}

DsnotColumns dsnot_columns(const std::vector<double>& mu, const std::vector<double>& var,
                           const std::vector<double>& act_norm, const DsnotOptions& options,
                           const std::vector<double>& column_l1) {
  const size_t n = mu.size();
  DsnotColumns columns;
  columns.mu.assign(mu.begin(), mu.end());
  columns.var_pow.resize(n);
  for (size_t c = 0; c < n; ++c) {
    const float v = static_cast<float>(var[c]);
    columns.var_pow[c] = options.var_power == 1.0 ? v : std::pow(v, static_cast<float>(options.var_power));
  }
  columns.act_norm = act_norm;
  if (!options.r2) return columns;
  columns.act_pow.resize(n);
  for (size_t c = 0; c < n; ++c)
    columns.act_pow[c] = options.r2->alpha == 1.0 ? act_norm[c] : std::pow(act_norm[c], options.r2->alpha);
  columns.col_inv_l1.resize(n);
  for (size_t c = 0; c < n; ++c) columns.col_inv_l1[c] = column_l1[c] > 0.0 ? 1.0 / column_l1[c] : 0.0;
  return columns;
}

RefineStats dsnot_totals(std::span<const int64_t> swaps, std::span<const double> error_before,
                         std::span<const double> error_after) {
  RefineStats stats;
  for (size_t r = 0; r < swaps.size(); ++r) {  // fixed order: independent of the thread count
    stats.swaps += swaps[r];
    stats.row_abs_error_before.push_back(std::fabs(error_before[r]));
    stats.row_abs_error_after.push_back(std::fabs(error_after[r]));
  }
  stats.mean_abs_error_before = mean_of_rows(stats.row_abs_error_before);
  stats.mean_abs_error_after = mean_of_rows(stats.row_abs_error_after);
  return stats;
}

RefineStats refine_dsnot(const Tensor& W, const std::vector<double>& mu, const std::vector<double>& var,
                         const std::vector<double>& act_norm, Mask& mask, const DsnotOptions& options,
                         std::optional<NmPattern> nm, const std::vector<double>* column_l1) {
  SYMPRUNE_CHECK(W.rank() == 2, "DSnoT: weight must be a matrix [rows, cols], got shape {}",
                 W.shape_string());
  const int64_t m = W.dim(0), n = W.dim(1);
  check_dsnot_arguments(m, n, W.shape_string(), mu, var, act_norm, mask, options, nm, column_l1);
  MatrixContext ctx;
  ctx.n = n;
  ctx.options = &options;
  ctx.nm = nm;
  const std::vector<double> col_l1 = !options.r2            ? std::vector<double>()
                                     : column_l1 != nullptr ? *column_l1
                                                            : initial_column_l1(W, mask);
  ctx.columns = dsnot_columns(mu, var, act_norm, options, col_l1);

  std::vector<int64_t> swaps(static_cast<size_t>(m));
  std::vector<double> before(static_cast<size_t>(m)), after(static_cast<size_t>(m));
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t r = 0; r < m; ++r) {
    const RowResult row = refine_row(W.data() + r * n, mask.row(r), ctx);
    swaps[static_cast<size_t>(r)] = row.swaps;
    before[static_cast<size_t>(r)] = row.error_before;
    after[static_cast<size_t>(r)] = row.error_after;
  }
  return dsnot_totals(swaps, before, after);
}

}  // namespace symprune
