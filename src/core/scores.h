#pragma once
// Pruning scores of DESIGN.md §3.2: S[r, c] for every weight of a linear layer; smaller = pruned first.
//
// Layout (DESIGN.md §2): W[r, c] has shape [m, n], row r = output channel, column c = input channel.
// The paper (reference/symmetric-pruning-paper.tex) writes Ŵ ∈ R^{b×c} with inputs on its rows:
//   paper Ŵ_jk        = our W[k, j]    (paper row j = our column c, paper column k = our row r)
//   paper ‖X_{:j}‖₂   = √N · a_c       (input channel norm, ActivationStats::input_norm)
//   paper ‖Y_{k:}‖₂   = √N · b_r       (output channel norm, ActivationStats::output_norm)
//   paper ‖Ŵ_{j:}‖    = ‖W[:, c]‖      (our column, "C_c" below)
//   paper ‖Ŵ_{:k}‖    = ‖W[r, :]‖      (our row, "R_r" below)
// Every name in the code refers to our layout. R_r = ‖W[r,:]‖_p over the n inputs of row r,
// C_c = ‖W[:,c]‖_p over the m outputs of column c; p = 0 is the count of nonzeros, p = ∞ the max.
//
// Methods (α = the activation exponent, ScoreOptions::alpha):
//   magnitude     |W|                                         (paper: Marginal)
//   wanda         |W| · a_c^α                 α default 1     (Wanda)
//   owanda        |W| · b_r^α                 α default 1     (OWanda, output side)
//   symwanda      |W| · (a_c^α + b_r^α)       α default 1     (General symmetric Wanda)
//   symwanda-sq   |W| · sqrt(a_c^{2α} + b_r^{2α})  α default 1 (squared-Frobenius variant)
//   symmetric     |W| · (‖W[r,:]‖₂ + ‖W[:,c]‖₂)              (Symmetric, X = Y = Wᵀ)
//   symmetric-sq  |W| · sqrt(‖W[r,:]‖₂² + ‖W[:,c]‖₂²)
//   ri            |W|/‖W[r,:]‖₁ + |W|/‖W[:,c]‖₁                (RI)
//   ria           ri · a_c^α                  α default 0.5   (RIA)
//   ria-row       |W|/‖W[r,:]‖₁ · a_c^α        α default 0.5   = the paper's "Col-Sum" ablation
//   ria-col       |W|/‖W[:,c]‖₁ · a_c^α        α default 0.5   = the paper's "Row-Sum" ablation
//   lp            strategy S1..S4 on R_r = ‖W[r,:]‖_p, C_c = ‖W[:,c]‖_p, all × a_c^α (α default 0.5):
//                   S1 |W|(1/R_r + 1/C_c)   S2 |W|/(R_r + C_c)   S3 |W|(R_r + C_c)   S4 |W|/(1/R_r + 1/C_c)
//                 lp with p = 1, S1 is ria.
//   stochria      |W|(1/‖W[r,S_r]‖₁ + 1/‖W[S_c,c]‖₁) · a_c^α   α default 0.5; S_r: τ columns sampled for
//                 row r, S_c: τ rows sampled for column c, without replacement, τ = max(1, ⌊β·min(m,n)⌋)
//                 (the floor of the fp64 product). With β = 1 on a square matrix it is ria.
//
// "Col-Sum" / "Row-Sum": the paper's ablation (Table "column & row sensitivity") keeps one of the two
// RI terms. In the paper's layout RI_jk = |Ŵ_jk|/‖Ŵ_{j:}‖₁ (sum over paper row j) + |Ŵ_jk|/‖Ŵ_{:k}‖₁
// (sum over paper column k). Paper column k is our row r, so "Col-Sum" divides by ‖W[r,:]‖₁ (our
// ria-row) and "Row-Sum" by ‖W[:,c]‖₁ (our ria-col). The paper finds Col-Sum the stronger one.
//
// Defined answers (no NaN or inf ever reaches a mask):
//   * A zero norm contributes 0 to a relative term: 1/0 := 0 and |W|/0 := 0. For p-norms a zero
//     R_r or C_c means every |W| in that row/column is 0, so only zero weights are affected; S2/S4
//     with both norms zero give 0. In stochria a sampled sum can be 0 while |W[r,c]| ≠ 0 (all sampled
//     entries zero): that side's term is then 0, the same rule.
//   * α = 0 gives factor 1 even for a zero activation norm (0⁰ = 1).
//   * A score beyond the fp32 range (above FLT_MAX, or positive and rounding to 0) is an Error
//     (score_saturates): such scores would tie, and the mask among them be the lowest indices.
//   * A NaN/Inf weight, or non-finite/negative statistics, is an Error naming ScoreOptions::matrix_name.
// Scores are computed in fp64 (norms and products) and rounded once to fp32; every reduction runs in a
// fixed order, so results do not depend on the thread count.
//
// compat_ria_fp16 (ri and ria only; ignored by the other methods, whose reference scores are fp32 or
// exact): emulates the RIA repository's fp16 arithmetic (reference-implementations.md §3.3):
//   w = half(|W|), R_r / C_c = half(float(Σ w)) (sums of the fp16 |W| in fp64, rounded to fp32 then fp16),
//   q1 = half(float(w)/float(C_c)), q2 = half(float(w)/float(R_r)), ri = half(float(q1) + float(q2)),
//   ria: S = float(ri) · f_c in fp32, s_c = float(in_sumsq[c]/N), f_c = sqrt(sqrt(s_c)) for α = 0.5
//   (PyTorch's x**0.5 is a sqrt), else sqrt(s_c)^α with x, x·x, x·x·x for α = 1, 2, 3 and powf otherwise;
//   ri: S = float(ri). Zero sums give q = 0 as above (the reference would give NaN); |W| beyond the
//   fp16 range is an Error.
#include <cfloat>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/activation_stats.h"
#include "core/tensor.h"

namespace symprune {

enum class ScoreMethod {
  kMagnitude,
  kWanda,
  kOWanda,
  kSymWanda,
  kSymWandaSq,
  kSymmetric,
  kSymmetricSq,
  kRI,
  kRIA,
  kRIARowOnly,  // "ria-row": |W|/‖W[r,:]‖₁ · a_c^α, the paper's Col-Sum
  kRIAColOnly,  // "ria-col": |W|/‖W[:,c]‖₁ · a_c^α, the paper's Row-Sum
  kLp,
  kStochRIA,
};

// Every method's CLI name, in enum order.
const std::vector<std::string_view>& score_method_names();
std::string_view score_method_name(ScoreMethod method);
// Parses a CLI name; unknown names throw an Error listing every valid name.
ScoreMethod parse_score_method(std::string_view name);

// Whether the method reads input statistics (a_c) / output statistics (b_r) at all.
bool score_method_uses_input_stats(ScoreMethod method);
bool score_method_uses_output_stats(ScoreMethod method);
// Whether the method takes an activation exponent α (every activation-aware method).
bool score_method_uses_alpha(ScoreMethod method);
// Default α: 1 for wanda, owanda, symwanda, symwanda-sq; 0.5 for ria, ria-row, ria-col, lp, stochria;
// NaN for methods without α.
double default_alpha(ScoreMethod method);

struct ScoreOptions {
  double alpha = std::numeric_limits<double>::quiet_NaN();  // NaN = the method's default_alpha()
  double p = 1.0;                                           // lp: 0 (nonzero count), 1, 2, 3, 4 or infinity
  int strategy = 1;                                         // lp: S1..S4
  double beta = 0.1;                                        // stochria: sampling ratio in (0, 1]
  uint64_t seed = 0;  // stochria: RNG key parts (seed, block, matrix_name)
  int64_t block = 0;
  std::string matrix_name;       // for error messages and the stochria RNG key
  bool compat_ria_fp16 = false;  // ri / ria: RIA repository fp16 rounding (see the header comment)
  // Rows of the result: [row_begin, row_end) of the whole matrix (row_end < 0: to the last row), for a
  // rank that owns those rows. Column norms and the checks still read the whole weight, so the scores of
  // a row slice equal those rows of the whole matrix's scores, bit for bit.
  int64_t row_begin = 0;
  int64_t row_end = -1;
};

// α after applying the default (NaN for methods without α).
double resolved_alpha(ScoreMethod method, const ScoreOptions& options);

// Whether compute_scores needs ActivationStats: activation-aware methods with α ≠ 0.
bool score_method_needs_stats(ScoreMethod method, const ScoreOptions& options);

// Throws an Error (naming matrix_name) for: α negative or non-finite, α given for a method without
// α, p not in {0, 1, 2, 3, 4, ∞}, strategy outside 1..4, β outside (0, 1].
void validate_score_options(ScoreMethod method, const ScoreOptions& options);

// The Error for a NaN or ±Inf weight (entry `index` of a matrix with `cols` columns, named `matrix`), one
// message wherever it is found: scoring on either backend, or the pipeline's check before the ranks score.
[[noreturn]] void fail_non_finite_weight(const std::string& matrix, int64_t index, int64_t cols, float value);

// Scores of W [m, n] (fp32) → S [rows, n] fp32 for the rows options.row_begin..row_end (all by default).
// `stats` may be null only when score_method_needs_stats() is false; otherwise its input widths must be n
// (and output widths m for owanda/symwanda/symwanda-sq). Errors name options.matrix_name.
Tensor compute_scores(ScoreMethod method, const Tensor& weight, const ActivationStats* stats,
                      const ScoreOptions& options);

// Every method except --compat ria computes, in fp64, S[r, c] = to_fp32(combine(|W[r, c]|, u_r, v_c, f_c)):
//   product: |W| · (u_r + v_c)        hypot: |W| · sqrt(u_r·u_r + v_c·v_c)        ratio: |W| / (u_r + v_c)
//   (0 when u_r + v_c is 0), then · f_c when column_factor is not empty; values above the fp32 range
//   become the largest float. The per-row and per-column vectors come from the statistics and from
//   reductions of W, which a backend computes where W is (WeightReductions), so every backend applies the
//   same formulas in the same order. For example wanda is product with u = 0, v = a^α; ria is product with
//   u = 1/‖W[r,:]‖₁, v = 1/‖W[:,c]‖₁, f = a^α.
struct ScorePlan {
  enum Form { kProduct, kHypot, kRatio };
  Form form = kProduct;
  std::vector<double> row_term;       // u [m]
  std::vector<double> column_term;    // v [n]
  std::vector<double> column_factor;  // f [n], or empty for none
};

// The plan's score of entry [row, column] with |W| = magnitude, in fp64 (before rounding to the fp32 score).
double plan_score(const ScorePlan& plan, int64_t row, int64_t column, double magnitude);

// Whether a score computed in fp64 leaves the range of fp32 scores: above FLT_MAX (it would be clamped
// there) or positive but rounding to 0. Scores of either kind tie, and the mask among them would be an
// arbitrary choice (the lowest index), so scoring refuses them (fail_saturated_score), as --alpha's check
// refuses a factor above FLT_MAX. Denormal scores keep their order to within rounding, as all others do.
inline bool score_saturates(double score) {
  return score > static_cast<double>(FLT_MAX) || (score > 0.0 && static_cast<float>(score) == 0.0f);
}

// The Error for the saturated score of weight [row, column] (score_saturates), naming the method, the
// score and what to change.
[[noreturn]] void fail_saturated_score(ScoreMethod method, const ScoreOptions& options, const ScorePlan& plan,
                                       int64_t row, int64_t column, float weight);

// The reductions of W a plan needs, computed by the backend that holds W. Norms follow scores.h's p rules
// (p = 0 counts nonzeros, ∞ is the max; each row summed in column order, each column in row order).
class WeightReductions {
 public:
  virtual ~WeightReductions() = default;
  virtual std::vector<double> row_norms(double p) = 0;
  virtual std::vector<double> column_norms(double p) = 0;
  // stochria's sampled ℓ1 sums (ScoreOptions' seed, block, matrix_name, beta).
  virtual void stochria_sums(const ScoreOptions& options, std::vector<double>& row_sums,
                             std::vector<double>& column_sums) = 0;
};

// The reductions of a host weight (the CPU backend's; it must outlive the result).
std::unique_ptr<WeightReductions> host_weight_reductions(const Tensor& weight);

// The plan of `method` for a weight of m × n (checks the statistics like compute_scores; not for
// compat_ria_fp16, which has its own arithmetic).
ScorePlan plan_scores(ScoreMethod method, int64_t m, int64_t n, const ActivationStats* stats,
                      const ScoreOptions& options, WeightReductions& reductions);

// The two halves of a p-norm, for backends that accumulate on their own: acc' = add(acc, |w|) in order,
// norm = finish(acc).
double norm_accumulate(double p, double acc, double magnitude);
double norm_finish(double p, double acc);

// stochria's sample: τ distinct indices of [0, population), sorted ascending, for row `index`
// (column = false: columns of that row) or column `index` (column = true: rows of that column).
// Counter-based (SplitMix64 keyed by seed, block, FNV-1a(matrix_name), side, index; Floyd's
// algorithm, exactly without replacement), so it does not depend on threads, ranks or devices.
std::vector<int64_t> stochria_sample(uint64_t seed, int64_t block, std::string_view matrix_name, bool column,
                                     int64_t index, int64_t population, int64_t tau);
// τ = max(1, ⌊β · min(m, n)⌋).
int64_t stochria_tau(double beta, int64_t m, int64_t n);

// The samples stochria_sums reads, one side of an m × n weight at a time (columns = false: each row's τ
// column indices; true: each column's τ row indices; each ascending), in consecutive ranges of indices
// whose picks take at most max_bytes (at least one index per range): visit(begin, end, picks) with
// picks[(i − begin)·τ + k] the k-th sample of index i ∈ [begin, end). A device backend uploads each
// range's picks and sums |W| at them in the same order; memory stays bounded for any β.
using StochriaVisitor = std::function<void(int64_t begin, int64_t end, std::span<const int32_t> picks)>;
void visit_stochria_samples(const ScoreOptions& options, int64_t m, int64_t n, bool columns,
                            int64_t max_bytes, const StochriaVisitor& visit);

}  // namespace symprune
