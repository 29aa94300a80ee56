#include "core/scores.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"

namespace symprune {
namespace {

constexpr int64_t kColumnChunk = 256;  // columns per work item for column reductions (fixed order)
// Below this many elements a parallel region costs more than it saves (results are identical either way).
constexpr int64_t kParallelMin = 1 << 15;

struct MethodInfo {
  ScoreMethod method;
  std::string_view name;
  bool input_stats;
  bool output_stats;
  double default_alpha;  // NaN: no α
};

constexpr double kNoAlpha = std::numeric_limits<double>::quiet_NaN();

constexpr MethodInfo kMethods[] = {
    {ScoreMethod::kMagnitude, "magnitude", false, false, kNoAlpha},
    {ScoreMethod::kWanda, "wanda", true, false, 1.0},
    {ScoreMethod::kOWanda, "owanda", false, true, 1.0},
    {ScoreMethod::kSymWanda, "symwanda", true, true, 1.0},
    {ScoreMethod::kSymWandaSq, "symwanda-sq", true, true, 1.0},
    {ScoreMethod::kSymmetric, "symmetric", false, false, kNoAlpha},
    {ScoreMethod::kSymmetricSq, "symmetric-sq", false, false, kNoAlpha},
    {ScoreMethod::kRI, "ri", false, false, kNoAlpha},
    {ScoreMethod::kRIA, "ria", true, false, 0.5},
    {ScoreMethod::kRIARowOnly, "ria-row", true, false, 0.5},
    {ScoreMethod::kRIAColOnly, "ria-col", true, false, 0.5},
    {ScoreMethod::kLp, "lp", true, false, 0.5},
    {ScoreMethod::kStochRIA, "stochria", true, false, 0.5},
};

const MethodInfo& info(ScoreMethod method) {
  for (const MethodInfo& entry : kMethods)
    if (entry.method == method) return entry;
  SYMPRUNE_ASSERT(false, "unknown ScoreMethod {}", static_cast<int>(method));
  return kMethods[0];
}

std::string label(const ScoreOptions& options) {
  return options.matrix_name.empty() ? std::string("<unnamed matrix>") : options.matrix_name;
}

}  // namespace

void fail_non_finite_weight(const std::string& matrix, int64_t index, int64_t cols, float value) {
  fail("{}: weight [{}, {}] is {} (NaN/Inf weights cannot be scored)", matrix, index / cols, index % cols,
       value);
}

namespace {

// 1/x with a zero norm contributing nothing (every |W| it would divide is 0 then, see scores.h).
inline double inverse(double x) {
  return x > 0.0 ? 1.0 / x : 0.0;
}
inline double ratio(double numerator, double denominator) {
  return denominator > 0.0 ? numerator / denominator : 0.0;
}
// fp64 → fp32, clamping an overflow to the largest finite float (fill_scores then refuses it:
// score_saturates).
inline float to_score(double value) {
  return value > static_cast<double>(FLT_MAX) ? FLT_MAX : static_cast<float>(value);
}
// Keeps factors finite so that 0 · factor stays 0.
inline double finite_factor(double value) {
  return value > DBL_MAX ? DBL_MAX : value;
}

bool is_allowed_p(double p) {
  return p == 0.0 || p == 1.0 || p == 2.0 || p == 3.0 || p == 4.0 ||
         p == std::numeric_limits<double>::infinity();
}

// Norm accumulation: p = 0 counts nonzeros, p = ∞ takes the max, otherwise Σ|w|^p then ^(1/p).
struct NormKind {
  double p;
  double add(double acc, double a) const {
    if (p == 1.0) return acc + a;
    if (p == 2.0) return acc + a * a;
    if (p == 0.0) return acc + (a != 0.0 ? 1.0 : 0.0);
    if (std::isinf(p)) return std::max(acc, a);
    if (p == 3.0) return acc + a * a * a;
    if (p == 4.0) return acc + (a * a) * (a * a);
    return acc + std::pow(a, p);
  }
  double finish(double acc) const {
    if (p == 0.0 || p == 1.0 || std::isinf(p)) return acc;
    if (p == 2.0) return std::sqrt(acc);
    if (p == 3.0) return std::cbrt(acc);
    return std::pow(acc, 1.0 / p);
  }
};

// ‖W[r,:]‖_p for every row (each row summed in column order by one thread).
std::vector<double> row_norms(const Tensor& weight, NormKind kind) {
  const int64_t m = weight.dim(0), n = weight.dim(1);
  std::vector<double> norms(static_cast<size_t>(m));
  const float* w = weight.data();
#pragma omp parallel for schedule(static) if (m * n >= kParallelMin)
  for (int64_t r = 0; r < m; ++r) {
    double acc = 0.0;
    for (int64_t c = 0; c < n; ++c) acc = kind.add(acc, std::fabs(static_cast<double>(w[r * n + c])));
    norms[static_cast<size_t>(r)] = kind.finish(acc);
  }
  return norms;
}

// ‖W[:,c]‖_p for every column (each column summed in row order by one thread).
std::vector<double> column_norms(const Tensor& weight, NormKind kind) {
  const int64_t m = weight.dim(0), n = weight.dim(1);
  std::vector<double> acc(static_cast<size_t>(n), 0.0);
  const float* w = weight.data();
  const int64_t chunks = (n + kColumnChunk - 1) / kColumnChunk;
#pragma omp parallel for schedule(static) if (m * n >= kParallelMin)
  for (int64_t chunk = 0; chunk < chunks; ++chunk) {
    const int64_t c0 = chunk * kColumnChunk, c1 = std::min(n, c0 + kColumnChunk);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = c0; c < c1; ++c)
        acc[static_cast<size_t>(c)] =
            kind.add(acc[static_cast<size_t>(c)], std::fabs(static_cast<double>(w[r * n + c])));
    for (int64_t c = c0; c < c1; ++c) acc[static_cast<size_t>(c)] = kind.finish(acc[static_cast<size_t>(c)]);
  }
  return acc;
}

// x^α in fp64 with 0⁰ = 1 and the result kept finite.
double power(double x, double alpha) {
  if (alpha == 0.0) return 1.0;
  if (alpha == 1.0) return x;
  return finite_factor(std::pow(x, alpha));
}

void check_stat_vector(const std::vector<double>& values, int64_t expected, const char* field,
                       const char* what, const ScoreOptions& options) {
  SYMPRUNE_CHECK(static_cast<int64_t>(values.size()) == expected,
                 "{}: activation statistics {} have {} entries, the weight has {} {}", label(options), field,
                 values.size(), expected, what);
  for (size_t i = 0; i < values.size(); ++i)
    SYMPRUNE_CHECK(std::isfinite(values[i]) && values[i] >= 0.0,
                   "{}: activation statistic {}[{}] = {} is not a finite non-negative number (activations "
                   "overflowed?)",
                   label(options), field, i, values[i]);
}

// Scores are fp32 and saturate at FLT_MAX: an activation factor beyond it (only an extreme alpha gives one)
// would turn its column's or row's scores into ties, and the mask into an arbitrary one.
void check_factor_fits_scores(double factor, double norm, int64_t index, const char* side, double alpha,
                              const ScoreOptions& options) {
  SYMPRUNE_CHECK(
      factor <= static_cast<double>(FLT_MAX),
      "{}: --alpha {} gives {}^alpha = {:g} for {} {}, beyond the range of fp32 scores (which would "
      "all tie at the maximum): use a smaller --alpha",
      label(options), alpha, norm, factor, side, index);
}

// a_c^α for every input column (all 1 when α = 0, where stats may be absent).
std::vector<double> input_factors(const ActivationStats* stats, double alpha, int64_t n,
                                  const ScoreOptions& options) {
  std::vector<double> factors(static_cast<size_t>(n), 1.0);
  if (alpha == 0.0) return factors;
  for (int64_t c = 0; c < n; ++c) {
    factors[static_cast<size_t>(c)] = power(stats->input_norm(c), alpha);
    check_factor_fits_scores(factors[static_cast<size_t>(c)], stats->input_norm(c), c, "input column", alpha,
                             options);
  }
  return factors;
}

std::vector<double> output_factors(const ActivationStats* stats, double alpha, int64_t m,
                                   const ScoreOptions& options) {
  std::vector<double> factors(static_cast<size_t>(m), 1.0);
  if (alpha == 0.0) return factors;
  for (int64_t r = 0; r < m; ++r) {
    factors[static_cast<size_t>(r)] = power(stats->output_norm(r), alpha);
    check_factor_fits_scores(factors[static_cast<size_t>(r)], stats->output_norm(r), r, "output row", alpha,
                             options);
  }
  return factors;
}

// The rows a call computes (ScoreOptions::row_begin/row_end).
struct RowRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

RowRange rows_of(const Tensor& weight, const ScoreOptions& options) {
  const int64_t m = weight.dim(0);
  const RowRange rows{options.row_begin, options.row_end < 0 ? m : options.row_end};
  SYMPRUNE_CHECK(rows.begin >= 0 && rows.begin <= rows.end && rows.end <= m,
                 "{}: score rows [{}, {}) outside the {} rows of the weight", label(options), rows.begin,
                 rows.end, m);
  return rows;
}

// S[r,c] = f(r, c, |W[r,c]|) in fp64 for r in `rows` (S row 0 = weight row rows.begin), rows in parallel.
// Sets *first_saturated to the lowest index r·n + c whose score saturates (score_saturates), else -1.
template <typename F>
Tensor fill_scores(const Tensor& weight, RowRange rows, F f, int64_t* first_saturated) {
  const int64_t n = weight.dim(1);
  Tensor scores({rows.size(), n});
  const float* w = weight.data();
  float* s = scores.data();  // row r of the weight is row r - rows.begin of the scores
  int64_t first = INT64_MAX;
#pragma omp parallel for schedule(static) reduction(min : first) if (rows.size() * n >= kParallelMin)
  for (int64_t r = rows.begin; r < rows.end; ++r)
    for (int64_t c = 0; c < n; ++c) {
      const double x = f(r, c, std::fabs(static_cast<double>(w[r * n + c])));
      if (score_saturates(x)) first = std::min(first, r * n + c);
      s[(r - rows.begin) * n + c] = to_score(x);
    }
  *first_saturated = first == INT64_MAX ? -1 : first;
  return scores;
}

void check_weight(const Tensor& weight, const ScoreOptions& options) {
  SYMPRUNE_CHECK(weight.rank() == 2, "{}: scores need a 2-D weight, got shape {}", label(options),
                 weight.shape_string());
  SYMPRUNE_CHECK(weight.dim(0) > 0 && weight.dim(1) > 0, "{}: scores need a non-empty weight, got shape {}",
                 label(options), weight.shape_string());
  const int64_t i = first_non_finite(weight);
  if (i >= 0) fail_non_finite_weight(label(options), i, weight.dim(1), weight.data()[i]);
}

// RIA repository arithmetic (reference-implementations.md §3.3), see scores.h.
float half_round(float value) {
  return fp16_to_float(float_to_fp16(value));
}

// PyTorch's tensor ** α on fp32 (special cases it takes, powf otherwise).
float torch_pow(float x, double alpha) {
  if (alpha == 0.0) return 1.0f;
  if (alpha == 0.5) return std::sqrt(x);
  if (alpha == 1.0) return x;
  if (alpha == 2.0) return x * x;
  if (alpha == 3.0) return x * x * x;
  return std::pow(x, static_cast<float>(alpha));
}

Tensor ria_fp16_scores(const Tensor& weight, const ActivationStats* stats, double alpha, bool with_activation,
                       const ScoreOptions& options, RowRange rows) {
  const int64_t m = weight.dim(0), n = weight.dim(1);
  const float* w = weight.data();
  // |W| in fp16 (exact for fp16 checkpoints).
  Tensor half_abs({m, n});
  float* h = half_abs.data();
  bool in_range = true;
#pragma omp parallel for schedule(static) reduction(&& : in_range) if (m * n >= kParallelMin)
  for (int64_t i = 0; i < m * n; ++i) {
    h[i] = half_round(std::fabs(w[i]));
    in_range = in_range && std::isfinite(h[i]);
  }
  SYMPRUNE_CHECK(in_range, "{}: --compat ria needs |W| within the fp16 range (65504), the weight exceeds it",
                 label(options));
  const std::vector<double> row_sums = row_norms(half_abs, NormKind{1.0});
  const std::vector<double> column_sums = column_norms(half_abs, NormKind{1.0});
  std::vector<float> row_h(static_cast<size_t>(m)), column_h(static_cast<size_t>(n));
  for (int64_t r = 0; r < m; ++r)
    row_h[static_cast<size_t>(r)] = half_round(static_cast<float>(row_sums[static_cast<size_t>(r)]));
  for (int64_t c = 0; c < n; ++c)
    column_h[static_cast<size_t>(c)] = half_round(static_cast<float>(column_sums[static_cast<size_t>(c)]));
  std::vector<float> factor(static_cast<size_t>(n), 1.0f);
  if (with_activation && alpha != 0.0) {
    for (int64_t c = 0; c < n; ++c) {
      const float s =
          static_cast<float>(stats->in_sumsq[static_cast<size_t>(c)] / static_cast<double>(stats->n_seqs));
      factor[static_cast<size_t>(c)] =
          alpha == 0.5 ? std::sqrt(std::sqrt(s)) : torch_pow(std::sqrt(s), alpha);
    }
  }
  Tensor scores({rows.size(), n});
  float* out = scores.data();  // row r of the weight is row r - rows.begin of the scores
#pragma omp parallel for schedule(static) if (rows.size() * n >= kParallelMin)
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      const float a = h[r * n + c];
      const float cs = column_h[static_cast<size_t>(c)], rs = row_h[static_cast<size_t>(r)];
      const float q1 = cs > 0.0f ? half_round(a / cs) : 0.0f;
      const float q2 = rs > 0.0f ? half_round(a / rs) : 0.0f;
      const float ri = half_round(q1 + q2);
      out[(r - rows.begin) * n + c] = with_activation ? ri * factor[static_cast<size_t>(c)] : ri;
    }
  }
  return scores;
}

// Host memory for stochria's sample indices at a time (scores.h visit_stochria_samples).
constexpr int64_t kStochriaHostSampleBytes = int64_t{16} << 20;

// Sampled ℓ1 sums of stochria: rows over τ sampled columns, columns over τ sampled rows.
void stochria_sums(const Tensor& weight, const ScoreOptions& options, std::vector<double>& row_sums,
                   std::vector<double>& column_sums) {
  const int64_t m = weight.dim(0), n = weight.dim(1);
  const int64_t tau = stochria_tau(options.beta, m, n);
  const float* w = weight.data();
  for (const bool columns : {false, true}) {
    std::vector<double>& sums = columns ? column_sums : row_sums;
    sums.assign(static_cast<size_t>(columns ? n : m), 0.0);
    // Row i's samples are columns (entry i·n + pick), column i's are rows (entry pick·n + i).
    const int64_t index_stride = columns ? 1 : n, pick_stride = columns ? n : 1;
    visit_stochria_samples(
        options, m, n, columns, kStochriaHostSampleBytes,
        [&](int64_t begin, int64_t end, std::span<const int32_t> picks) {
#pragma omp parallel for schedule(static) if ((end - begin) * tau >= kParallelMin)
          for (int64_t i = begin; i < end; ++i) {
            const int32_t* own = picks.data() + (i - begin) * tau;
            double sum = 0.0;
            for (int64_t k = 0; k < tau; ++k)
              sum += std::fabs(static_cast<double>(w[i * index_stride + own[k] * pick_stride]));
            sums[static_cast<size_t>(i)] = sum;
          }
        });
  }
}

std::vector<double> inverses(const std::vector<double>& values) {
  std::vector<double> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = inverse(values[i]);
  return out;
}

void check_score_stats(ScoreMethod method, int64_t m, int64_t n, const ActivationStats* stats,
                       const ScoreOptions& options) {
  if (!score_method_needs_stats(method, options)) return;
  SYMPRUNE_CHECK(stats != nullptr,
                 "{}: method {} is activation-aware and needs calibration statistics, but none were given",
                 label(options), score_method_name(method));
  SYMPRUNE_CHECK(stats->n_seqs > 0, "{}: method {} needs calibration statistics, but they cover 0 sequences",
                 label(options), score_method_name(method));
  if (score_method_uses_input_stats(method))
    check_stat_vector(stats->in_sumsq, n, "in_sumsq", "input columns", options);
  if (score_method_uses_output_stats(method))
    check_stat_vector(stats->out_sumsq, m, "out_sumsq", "output rows (were output statistics collected?)",
                      options);
}

// The plan's element formula (scores.h) over the rows of `part`; the form is fixed per call so the
// inner loop has no branch on it.
template <ScorePlan::Form kForm>
double plan_element(const double* u, const double* v, const double* f, int64_t r, int64_t c, double w) {
  double x;
  if constexpr (kForm == ScorePlan::kProduct)
    x = w * (u[r] + v[c]);
  else if constexpr (kForm == ScorePlan::kHypot)
    x = w * std::sqrt(u[r] * u[r] + v[c] * v[c]);
  else
    x = ratio(w, u[r] + v[c]);
  return f != nullptr ? x * f[c] : x;
}

template <ScorePlan::Form kForm>
Tensor fill_plan(ScoreMethod method, const Tensor& weight, RowRange part, const ScorePlan& plan,
                 const ScoreOptions& options) {
  const double* u = plan.row_term.data();
  const double* v = plan.column_term.data();
  const double* f = plan.column_factor.empty() ? nullptr : plan.column_factor.data();
  int64_t first_saturated = -1;
  Tensor scores = fill_scores(
      weight, part, [&](int64_t r, int64_t c, double w) { return plan_element<kForm>(u, v, f, r, c, w); },
      &first_saturated);
  if (first_saturated >= 0) {
    const int64_t n = weight.dim(1);
    fail_saturated_score(method, options, plan, first_saturated / n, first_saturated % n,
                         weight.data()[first_saturated]);
  }
  return scores;
}

class HostWeightReductions final : public WeightReductions {
 public:
  explicit HostWeightReductions(const Tensor& weight) : weight_(weight) {}
  std::vector<double> row_norms(double p) override { return symprune::row_norms(weight_, NormKind{p}); }
  std::vector<double> column_norms(double p) override { return symprune::column_norms(weight_, NormKind{p}); }
  void stochria_sums(const ScoreOptions& options, std::vector<double>& row_sums,
                     std::vector<double>& column_sums) override {
    symprune::stochria_sums(weight_, options, row_sums, column_sums);
  }

 private:
  const Tensor& weight_;
};

}  // namespace

const std::vector<std::string_view>& score_method_names() {
  static const std::vector<std::string_view> names = [] {
    std::vector<std::string_view> list;
    for (const MethodInfo& entry : kMethods) list.push_back(entry.name);
    return list;
  }();
  return names;
}

std::string_view score_method_name(ScoreMethod method) {
  return info(method).name;
}

ScoreMethod parse_score_method(std::string_view name) {
  for (const MethodInfo& entry : kMethods)
    if (entry.name == name) return entry.method;
  std::string all;
  for (const MethodInfo& entry : kMethods) {
    if (!all.empty()) all += ", ";
    all += entry.name;
  }
  fail("unknown pruning method '{}' (valid methods: {})", name, all);
}

bool score_method_uses_input_stats(ScoreMethod method) {
  return info(method).input_stats;
}
bool score_method_uses_output_stats(ScoreMethod method) {
  return info(method).output_stats;
}
bool score_method_uses_alpha(ScoreMethod method) {
  return !std::isnan(info(method).default_alpha);
}
double default_alpha(ScoreMethod method) {
  return info(method).default_alpha;
}

double resolved_alpha(ScoreMethod method, const ScoreOptions& options) {
  if (!score_method_uses_alpha(method)) return kNoAlpha;
  return std::isnan(options.alpha) ? default_alpha(method) : options.alpha;
}

bool score_method_needs_stats(ScoreMethod method, const ScoreOptions& options) {
  return score_method_uses_alpha(method) && resolved_alpha(method, options) != 0.0;
}

void validate_score_options(ScoreMethod method, const ScoreOptions& options) {
  const std::string_view name = score_method_name(method);
  if (!std::isnan(options.alpha)) {
    SYMPRUNE_CHECK(score_method_uses_alpha(method),
                   "{}: takes no activation exponent alpha (--alpha): {} scores read no activations",
                   label(options), name);
    SYMPRUNE_CHECK(std::isfinite(options.alpha) && options.alpha >= 0.0,
                   "{}: alpha must be a finite number >= 0, got {}", label(options), options.alpha);
  }
  SYMPRUNE_CHECK(is_allowed_p(options.p), "{}: lp norm p must be one of 0, 1, 2, 3, 4, inf, got {}",
                 label(options), options.p);
  SYMPRUNE_CHECK(options.strategy >= 1 && options.strategy <= 4,
                 "{}: lp strategy must be 1..4 (S1..S4), got {}", label(options), options.strategy);
  SYMPRUNE_CHECK(options.beta > 0.0 && options.beta <= 1.0, "{}: stochria beta must be in (0, 1], got {}",
                 label(options), options.beta);
}

std::unique_ptr<WeightReductions> host_weight_reductions(const Tensor& weight) {
  return std::make_unique<HostWeightReductions>(weight);
}

double norm_accumulate(double p, double acc, double magnitude) {
  return NormKind{p}.add(acc, magnitude);
}
double norm_finish(double p, double acc) {
  return NormKind{p}.finish(acc);
}

ScorePlan plan_scores(ScoreMethod method, int64_t m, int64_t n, const ActivationStats* stats,
                      const ScoreOptions& options, WeightReductions& reductions) {
  validate_score_options(method, options);
  check_score_stats(method, m, n, stats, options);
  const double alpha = resolved_alpha(method, options);
  const auto zeros = [](int64_t count) { return std::vector<double>(static_cast<size_t>(count), 0.0); };
  const auto a = [&] { return input_factors(stats, alpha, n, options); };
  ScorePlan plan;
  switch (method) {
    case ScoreMethod::kMagnitude:
      plan.row_term = zeros(m);
      plan.column_term.assign(static_cast<size_t>(n), 1.0);
      return plan;
    case ScoreMethod::kWanda:
      plan.row_term = zeros(m);
      plan.column_term = a();
      return plan;
    case ScoreMethod::kOWanda:
      plan.row_term = output_factors(stats, alpha, m, options);
      plan.column_term = zeros(n);
      return plan;
    case ScoreMethod::kSymWanda:
    case ScoreMethod::kSymWandaSq:
      plan.form = method == ScoreMethod::kSymWanda ? ScorePlan::kProduct : ScorePlan::kHypot;
      plan.row_term = output_factors(stats, alpha, m, options);
      plan.column_term = a();
      return plan;
    case ScoreMethod::kSymmetric:
    case ScoreMethod::kSymmetricSq:
      plan.form = method == ScoreMethod::kSymmetric ? ScorePlan::kProduct : ScorePlan::kHypot;
      plan.row_term = reductions.row_norms(2.0);
      plan.column_term = reductions.column_norms(2.0);
      return plan;
    case ScoreMethod::kRI:
    case ScoreMethod::kRIA:
      plan.row_term = inverses(reductions.row_norms(1.0));
      plan.column_term = inverses(reductions.column_norms(1.0));
      if (method == ScoreMethod::kRIA) plan.column_factor = a();
      return plan;
    case ScoreMethod::kRIARowOnly:
      plan.row_term = inverses(reductions.row_norms(1.0));
      plan.column_term = zeros(n);
      plan.column_factor = a();
      return plan;
    case ScoreMethod::kRIAColOnly:
      plan.row_term = zeros(m);
      plan.column_term = inverses(reductions.column_norms(1.0));
      plan.column_factor = a();
      return plan;
    case ScoreMethod::kLp: {
      const std::vector<double> rows = reductions.row_norms(options.p);
      const std::vector<double> cols = reductions.column_norms(options.p);
      // S1 |W|(1/R + 1/C), S2 |W|/(R + C), S3 |W|(R + C), S4 |W|/(1/R + 1/C); all × a^α.
      const bool inverted = options.strategy == 1 || options.strategy == 4;
      plan.form = options.strategy == 2 || options.strategy == 4 ? ScorePlan::kRatio : ScorePlan::kProduct;
      plan.row_term = inverted ? inverses(rows) : rows;
      plan.column_term = inverted ? inverses(cols) : cols;
      plan.column_factor = a();
      return plan;
    }
    case ScoreMethod::kStochRIA: {
      std::vector<double> row_sums, column_sums;
      reductions.stochria_sums(options, row_sums, column_sums);
      plan.row_term = inverses(row_sums);
      plan.column_term = inverses(column_sums);
      plan.column_factor = a();
      return plan;
    }
  }
  SYMPRUNE_ASSERT(false, "unhandled ScoreMethod {}", static_cast<int>(method));
  return plan;
}

double plan_score(const ScorePlan& plan, int64_t row, int64_t column, double magnitude) {
  const double* u = plan.row_term.data();
  const double* v = plan.column_term.data();
  const double* f = plan.column_factor.empty() ? nullptr : plan.column_factor.data();
  switch (plan.form) {
    case ScorePlan::kProduct:
      return plan_element<ScorePlan::kProduct>(u, v, f, row, column, magnitude);
    case ScorePlan::kHypot:
      return plan_element<ScorePlan::kHypot>(u, v, f, row, column, magnitude);
    case ScorePlan::kRatio:
      return plan_element<ScorePlan::kRatio>(u, v, f, row, column, magnitude);
  }
  SYMPRUNE_ASSERT(false, "unhandled score form {}", static_cast<int>(plan.form));
  return 0.0;
}

void fail_saturated_score(ScoreMethod method, const ScoreOptions& options, const ScorePlan& plan, int64_t row,
                          int64_t column, float weight) {
  const double score = plan_score(plan, row, column, std::fabs(static_cast<double>(weight)));
  const bool alpha = score_method_uses_alpha(method) && resolved_alpha(method, options) != 0.0;
  fail(
      "{}: the {} score of weight [{}, {}] = {:g} is {:g}, {} the range of fp32 scores: such scores would "
      "all "
      "tie at {} and the mask would be an arbitrary choice among them; the weights' magnitudes{} are far "
      "outside the usual range ({})",
      label(options), score_method_name(method), row, column, weight, score,
      score > static_cast<double>(FLT_MAX) ? "above" : "below",
      score > static_cast<double>(FLT_MAX) ? "the maximum" : "0",
      alpha ? fmt::format(" or the activations to the power --alpha {}", resolved_alpha(method, options))
            : "",
      alpha ? "use a smaller --alpha, or a good checkpoint"
            : "a damaged checkpoint? ri, ria and magnitude do not depend on the weights' scale");
}

Tensor compute_scores(ScoreMethod method, const Tensor& weight, const ActivationStats* stats,
                      const ScoreOptions& options) {
  validate_score_options(method, options);
  check_weight(weight, options);
  const int64_t m = weight.dim(0), n = weight.dim(1);
  const RowRange part = rows_of(weight, options);
  if (options.compat_ria_fp16 && (method == ScoreMethod::kRI || method == ScoreMethod::kRIA)) {
    check_score_stats(method, m, n, stats, options);
    return ria_fp16_scores(weight, stats, resolved_alpha(method, options), method == ScoreMethod::kRIA,
                           options, part);
  }
  HostWeightReductions reductions(weight);
  const ScorePlan plan = plan_scores(method, m, n, stats, options, reductions);
  switch (plan.form) {
    case ScorePlan::kProduct:
      return fill_plan<ScorePlan::kProduct>(method, weight, part, plan, options);
    case ScorePlan::kHypot:
      return fill_plan<ScorePlan::kHypot>(method, weight, part, plan, options);
    case ScorePlan::kRatio:
      return fill_plan<ScorePlan::kRatio>(method, weight, part, plan, options);
  }
  SYMPRUNE_ASSERT(false, "unhandled score form {}", static_cast<int>(plan.form));
  return Tensor();
}

}  // namespace symprune
