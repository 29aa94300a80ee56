// Reconstruction-error refinement (refine_recon.h): hand-traced rows, the exact deltas against a direct
// recomputation of Δw G Δwᵀ, an exhaustive greedy reference on integer data (where every sum is exact, so
// choices and ties must agree), invariants on random matrices, the guard, row slices and threads.
#include "core/refine_recon.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/masks.h"
#include "core/refine_dsnot.h"
#include "core/tensor.h"
#include "support/mask_test_support.h"

namespace symprune {
namespace {

using symprune::testing::expect_error;
using symprune::testing::mask_from;
using symprune::testing::pruned_columns;

// E_r = Δw G Δwᵀ, summed directly in fp64.
double row_error(const Tensor& w, const std::vector<double>& gram, const Mask& mask, int64_t r) {
  const int64_t n = w.dim(1);
  double e = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (!mask.pruned(r, i)) continue;
    for (int64_t j = 0; j < n; ++j)
      if (mask.pruned(r, j))
        e += static_cast<double>(w[r * n + i]) * gram[static_cast<size_t>(i * n + j)] * w[r * n + j];
  }
  return e;
}

double total_error(const Tensor& w, const std::vector<double>& gram, const Mask& mask) {
  double e = 0.0;
  for (int64_t r = 0; r < w.dim(0); ++r) e += row_error(w, gram, mask, r);
  return e;
}

// Every column in the pool and every pair evaluated: the exact greedy best swap per cycle.
ReconOptions exhaustive(int64_t n, int max_cycles = 50) {
  ReconOptions options;
  options.max_cycles = max_cycles;
  options.pool = static_cast<int>(n);
  options.shortlist = static_cast<int>(n);
  return options;
}

// Hand trace (the cross term decides). n = 4, w = 1 1 -1 1, pruned {0, 1}. G: diagonal 4 4 4 3 and
// G[1,2] = G[2,1] = 2. Δw = (1,1,0,0): E = 8, g = GΔw = (4,4,2,0).
//   δ_grow(0) = 4 − 8 = −4, δ_grow(1) = −4; δ_prune(2) = 4 + 2·(−1)·2 = 0, δ_prune(3) = 3.
//   swaps: (0,2) −4 + 0 − 2·1·(−1)·0 = −4   (1,2) −4 + 0 − 2·1·(−1)·2 = 0   (0,3), (1,3) −1.
// Cycle 1 regrows 0 and prunes 2, although column 2's saliency w²G_cc = 4 is above column 3's 3: its
// weight cancels the error of the pruned column 1 it is correlated with. E = 4, Δw = (0,1,−1,0), g =
// (0,2,−2,0):
//   δ_grow(1) = 4 − 4 = 0, δ_grow(2) = 4 − 4 = 0, δ_prune(0) = 4, δ_prune(3) = 3: no pair below 0, stop.
const std::vector<double> kTraceGram = {4, 0, 0, 0, 0, 4, 2, 0, 0, 2, 4, 0, 0, 0, 0, 3};

TEST(RefineRecon, HandTracedCrossTermPicksTheCorrelatedWeight) {
  const Tensor w({1, 4}, {1.0f, 1.0f, -1.0f, 1.0f});
  Mask mask = mask_from(1, 4, {{0, 1}});
  const RefineStats stats = refine_recon(w, kTraceGram.data(), 4, mask, ReconOptions{});
  EXPECT_EQ(stats.swaps, 1);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{1, 2}));
  EXPECT_EQ(stats.recon_sq_change.value(), -4.0);
  EXPECT_EQ(row_error(w, kTraceGram, mask, 0), 4.0);
}

// Hand trace (ties). Same G, w = 1 1 1 1, pruned {0, 1}: E = 8, g = (4,4,2,0).
//   δ_grow(0) = δ_grow(1) = −4; δ_prune(2) = 4 + 4 = 8, δ_prune(3) = 3.
//   swaps: (0,2) −4 + 8 − 0 = 4   (1,2) −4 + 8 − 2·2 = 0   (0,3) −1   (1,3) −1.
// (0,3) and (1,3) tie: the lower regrow column wins, pruned {1, 3}, E = 7. Then Δw = (0,1,0,1), g =
// (0,4,2,3):
//   δ_grow(1) = −4, δ_grow(3) = 3 − 6 = −3; δ_prune(0) = 4, δ_prune(2) = 4 + 4 = 8:
//   (1,0) 0, (1,2) −4 + 8 − 4 = 0, (3,0) 1, (3,2) 5: stop.
TEST(RefineRecon, HandTracedTieGoesToTheLowerColumn) {
  const Tensor w({1, 4}, {1.0f, 1.0f, 1.0f, 1.0f});
  Mask mask = mask_from(1, 4, {{0, 1}});
  const RefineStats stats = refine_recon(w, kTraceGram.data(), 4, mask, ReconOptions{});
  EXPECT_EQ(stats.swaps, 1);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{1, 3}));
  EXPECT_EQ(stats.recon_sq_change.value(), -1.0);
}

// A diagonal G has no cross terms: a swap lowers E_r only if the regrown weight's saliency w²·G_cc exceeds
// the pruned one's, so a mask that prunes the smallest saliencies (Wanda's with α = 1, squared) stops at
// once, and any other mask moves towards it.
TEST(RefineRecon, RowStopsAtOnceWhenNoSwapHelps) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  const int64_t m = 8, n = 32;
  Tensor w({m, n}), saliency({m, n});
  std::vector<double> gram(static_cast<size_t>(n * n), 0.0);
  for (int64_t c = 0; c < n; ++c) gram[static_cast<size_t>(c * n + c)] = 0.5 + static_cast<double>(c % 7);
  for (int64_t i = 0; i < m * n; ++i) {
    w[i] = normal(rng);
    const double g = gram[static_cast<size_t>((i % n) * n + i % n)];
    saliency[i] = static_cast<float>(static_cast<double>(w[i]) * w[i] * g);
  }
  for (const MaskSpec& spec : {MaskSpec::row(0.6), MaskSpec::nm(2, 4)}) {
    const Mask initial = select_mask(saliency, spec);
    Mask mask = initial;
    std::optional<NmPattern> nm;
    if (spec.kind == MaskSpec::kNM) nm = NmPattern{2, 4};
    const RefineStats stats = refine_recon(w, gram.data(), n, mask, exhaustive(n), nm);
    EXPECT_EQ(stats.swaps, 0) << describe(spec);
    EXPECT_EQ(mask, initial) << describe(spec);
    EXPECT_EQ(stats.recon_sq_change.value(), 0.0);
  }
  // A magnitude mask ignores G: recon moves it to the saliency order, and every swap lowers E.
  Tensor magnitude = w;
  for (auto& v : magnitude.values()) v = std::fabs(v);
  Mask mask = select_mask(magnitude, MaskSpec::row(0.6));
  const double before = total_error(w, gram, mask);
  const RefineStats stats = refine_recon(w, gram.data(), n, mask, exhaustive(n));
  EXPECT_GT(stats.swaps, 0);
  EXPECT_EQ(mask, select_mask(saliency, MaskSpec::row(0.6)));
  EXPECT_NEAR(total_error(w, gram, mask) - before, stats.recon_sq_change.value(), 1e-9 * before);
}

// ---- Random data ----

struct Problem {
  Tensor w;
  std::vector<double> gram;  // XᵀX, n × n
  Tensor wanda;              // |W|·‖X_c‖ (the initial score)
  std::vector<double> mean;  // column means of X (DSnoT's μ̃ up to a factor)
};

// X [tokens, n] with per-channel scales, a shared mean and two common factors (correlated channels). With
// integer_values, X and W hold small integers, so every product and sum below is exact in fp64.
Problem random_problem(int64_t m, int64_t n, uint32_t seed, bool integer_values = false) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  std::uniform_int_distribution<int> small(-3, 3);
  const int64_t tokens = 2 * n + 8;
  std::vector<double> scale(static_cast<size_t>(n)), x(static_cast<size_t>(tokens * n));
  for (auto& s : scale) s = std::exp(0.5 * normal(rng));
  std::vector<double> factor(static_cast<size_t>(2 * n));
  for (auto& f : factor) f = normal(rng);
  for (int64_t t = 0; t < tokens; ++t) {
    const double z0 = normal(rng), z1 = normal(rng);
    for (int64_t c = 0; c < n; ++c) {
      const auto uc = static_cast<size_t>(c);
      x[static_cast<size_t>(t * n + c)] =
          integer_values
              ? small(rng)
              : scale[uc] * (0.3 + z0 * factor[uc] + z1 * factor[uc + static_cast<size_t>(n)] + normal(rng));
    }
  }
  Problem p{Tensor({m, n}), std::vector<double>(static_cast<size_t>(n * n), 0.0), Tensor({m, n}),
            std::vector<double>(static_cast<size_t>(n), 0.0)};
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < n; ++c)
      p.mean[static_cast<size_t>(c)] += x[static_cast<size_t>(t * n + c)] / tokens;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0;
      for (int64_t t = 0; t < tokens; ++t)
        sum += x[static_cast<size_t>(t * n + i)] * x[static_cast<size_t>(t * n + j)];
      p.gram[static_cast<size_t>(i * n + j)] = sum;
    }
  std::uniform_int_distribution<int> weight(-4, 4);
  for (int64_t i = 0; i < m * n; ++i) {
    int v = 0;
    while (integer_values && v == 0) v = weight(rng);
    p.w[i] = integer_values ? static_cast<float>(v) : static_cast<float>(0.1 * normal(rng));
    const int64_t c = i % n;
    p.wanda[i] = static_cast<float>(std::fabs(static_cast<double>(p.w[i])) *
                                    std::sqrt(p.gram[static_cast<size_t>(c * n + c)]));
  }
  return p;
}

// The exhaustive greedy reference: every cycle tries every allowed swap by recomputing E_r directly and
// takes the lowest (ties: lowest regrow column, then lowest prune column) while it is below the current E_r.
int64_t greedy_reference(const Tensor& w, const std::vector<double>& gram, Mask& mask, int max_cycles,
                         std::optional<NmPattern> nm) {
  const int64_t n = w.dim(1);
  int64_t swaps = 0;
  for (int64_t r = 0; r < w.dim(0); ++r) {
    for (int cycle = 0; cycle < max_cycles; ++cycle) {
      double current = row_error(w, gram, mask, r), best = current;
      int64_t best_c = -1, best_k = -1;
      for (int64_t c = 0; c < n; ++c) {
        if (!mask.pruned(r, c)) continue;
        for (int64_t k = 0; k < n; ++k) {
          if (mask.pruned(r, k) || (nm && c / nm->m != k / nm->m)) continue;
          mask.set(r, c, false);
          mask.set(r, k, true);
          const double e = row_error(w, gram, mask, r);
          mask.set(r, c, true);
          mask.set(r, k, false);
          if (e < best) {
            best = e;
            best_c = c;
            best_k = k;
          }
        }
      }
      if (best_c < 0) break;
      mask.set(r, best_c, false);
      mask.set(r, best_k, true);
      ++swaps;
      current = best;
    }
  }
  return swaps;
}

// With every column in the pool and every pair evaluated, recon is the exact greedy: the O(1) deltas and the
// O(n) updates of g choose what recomputing Δw G Δwᵀ for every candidate chooses, ties included.
TEST(RefineRecon, ExhaustiveSearchMatchesDirectRecomputation) {
  for (const auto& [spec, nm] : {std::pair{MaskSpec::row(0.5), std::optional<NmPattern>{}},
                                 std::pair{MaskSpec::row(0.75), std::optional<NmPattern>{}},
                                 std::pair{MaskSpec::nm(2, 4), std::optional<NmPattern>{NmPattern{2, 4}}}}) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      const Problem p = random_problem(6, 16, seed, /*integer_values=*/true);
      const Mask initial = select_mask(p.wanda, spec);
      for (int cycles : {1, 3, 50}) {
        Mask expected = initial, mask = initial;
        const int64_t swaps = greedy_reference(p.w, p.gram, expected, cycles, nm);
        const RefineStats stats = refine_recon(p.w, p.gram.data(), 16, mask, exhaustive(16, cycles), nm);
        EXPECT_EQ(mask, expected) << describe(spec) << " seed " << seed << " cycles " << cycles;
        EXPECT_EQ(stats.swaps, swaps);
        EXPECT_EQ(stats.recon_sq_change.value(),
                  total_error(p.w, p.gram, mask) - total_error(p.w, p.gram, initial));
        if (cycles == 50) EXPECT_GT(swaps, 0);
      }
    }
  }
}

// Default options (pool smaller than n, shortlists): per row, E_r never rises, the pruned count and the N:M
// pattern stay, the weights are untouched and recon_sq_change is the direct change.
TEST(RefineRecon, RandomRowsNeverGetWorse) {
  for (const auto& [spec, nm] : {std::pair{MaskSpec::row(0.5), std::optional<NmPattern>{}},
                                 std::pair{MaskSpec::row(0.7), std::optional<NmPattern>{}},
                                 std::pair{MaskSpec::layer(0.6), std::optional<NmPattern>{}},
                                 std::pair{MaskSpec::nm(2, 4), std::optional<NmPattern>{NmPattern{2, 4}}},
                                 std::pair{MaskSpec::nm(4, 8), std::optional<NmPattern>{NmPattern{4, 8}}}}) {
    const int64_t m = 24, n = 256;
    const Problem p = random_problem(m, n, 17);
    const Tensor w_copy = p.w;
    const Mask initial = select_mask(p.wanda, spec);
    Mask mask = initial;
    const RefineStats stats = refine_recon(p.w, p.gram.data(), n, mask, ReconOptions{}, nm);
    EXPECT_GT(stats.swaps, 0) << describe(spec);
    EXPECT_LT(stats.recon_sq_change.value(), 0.0);
    double before_total = 0.0, change = 0.0;
    for (int64_t r = 0; r < m; ++r) {
      const double before = row_error(p.w, p.gram, initial, r), after = row_error(p.w, p.gram, mask, r);
      EXPECT_LE(after, before + 1e-12 * before) << describe(spec) << " row " << r;
      before_total += before;
      change += after - before;
      EXPECT_EQ(mask.row_count(r), initial.row_count(r));
      if (nm)
        for (int64_t g = 0; g < n; g += nm->m) {
          int pruned = 0;
          for (int64_t c = g; c < g + nm->m; ++c) pruned += mask.pruned(r, c);
          EXPECT_EQ(pruned, nm->n) << "row " << r << " group " << g;
        }
    }
    EXPECT_NEAR(stats.recon_sq_change.value(), change, 1e-9 * before_total);
    EXPECT_EQ(std::vector<float>(p.w.values().begin(), p.w.values().end()),
              std::vector<float>(w_copy.values().begin(), w_copy.values().end()));
    std::printf("[%s] swaps %lld, E %.6g -> %.6g\n", describe(spec).c_str(),
                static_cast<long long>(stats.swaps), before_total, before_total + change);
  }
}

// A model pruned before holds zero weights. Regrowing one changes nothing (δ = 0, no cross term), so a
// "swap" with it would prune one more weight for free; pruning a kept zero would regrow one. Zeros take
// no part in swaps: every zero weight keeps its initial mask bit and the written zeros stay those of the
// initial mask, unstructured and N:M.
TEST(RefineRecon, ZeroWeightsAreNeverSwapped) {
  for (const auto& [spec, nm] : {std::pair{MaskSpec::row(0.5), std::optional<NmPattern>{}},
                                 std::pair{MaskSpec::nm(1, 4), std::optional<NmPattern>{NmPattern{1, 4}}},
                                 std::pair{MaskSpec::nm(2, 4), std::optional<NmPattern>{NmPattern{2, 4}}}}) {
    const int64_t m = 16, n = 64;
    Problem p = random_problem(m, n, 29);
    // Zero columns (a pruned input channel) and scattered zeros, some kept by the initial mask.
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c)
        if (c == 7 || c == 21 || (r * 5 + c) % 13 == 0) p.w[r * n + c] = 0.0f;
    const Mask initial = select_mask(p.wanda, spec);
    Mask mask = initial;
    ReconOptions options = exhaustive(n);
    const RefineStats stats = refine_recon(p.w, p.gram.data(), n, mask, options, nm);
    EXPECT_GT(stats.swaps, 0) << describe(spec);
    int64_t zeros_before = 0, zeros_after = 0;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c) {
        const bool zero = p.w[r * n + c] == 0.0f;
        if (zero)
          EXPECT_EQ(mask.pruned(r, c), initial.pruned(r, c)) << describe(spec) << " " << r << "," << c;
        zeros_before += initial.pruned(r, c) || zero;
        zeros_after += mask.pruned(r, c) || zero;
      }
    EXPECT_EQ(zeros_after, zeros_before) << describe(spec);
  }
}

TEST(RefineRecon, MaxCyclesBoundsTheSwaps) {
  const Problem p = random_problem(10, 64, 3);
  const Mask initial = select_mask(p.wanda, MaskSpec::row(0.5));
  Mask mask = initial;
  ReconOptions options;
  options.max_cycles = 0;
  EXPECT_EQ(refine_recon(p.w, p.gram.data(), 64, mask, options).swaps, 0);
  EXPECT_EQ(mask, initial);
  options.max_cycles = 2;
  const RefineStats stats = refine_recon(p.w, p.gram.data(), 64, mask, options);
  EXPECT_GT(stats.swaps, 0);
  EXPECT_LE(stats.swaps, 2 * 10);
  for (int64_t r = 0; r < 10; ++r) {
    int changed = 0;
    for (int64_t c = 0; c < 64; ++c) changed += mask.pruned(r, c) != initial.pruned(r, c);
    EXPECT_LE(changed, 4) << "row " << r;
  }
}

// A distributed run holds a slice of the rows and the whole G: each slice refines exactly like those rows of
// the whole matrix. The result does not depend on the thread count either.
TEST(RefineRecon, RowSlicesAndThreadsGiveTheSameMasks) {
  const int64_t m = 40, n = 192, split = 17;
  const Problem p = random_problem(m, n, 11);
  for (const auto& [spec, nm] : {std::pair{MaskSpec::row(0.6), std::optional<NmPattern>{}},
                                 std::pair{MaskSpec::nm(2, 4), std::optional<NmPattern>{NmPattern{2, 4}}}}) {
    const Mask initial = select_mask(p.wanda, spec);
    Mask one = initial, two = initial;
    omp_set_num_threads(1);
    const RefineStats s1 = refine_recon(p.w, p.gram.data(), n, one, ReconOptions{}, nm);
    omp_set_num_threads(2);
    const RefineStats s2 = refine_recon(p.w, p.gram.data(), n, two, ReconOptions{}, nm);
    EXPECT_EQ(one, two);
    EXPECT_EQ(s1.swaps, s2.swaps);
    EXPECT_EQ(s1.recon_sq_change.value(), s2.recon_sq_change.value());
    EXPECT_NE(one, initial);
    for (const auto& [begin, end] :
         {std::pair<int64_t, int64_t>{0, split}, std::pair<int64_t, int64_t>{split, m}}) {
      Tensor w({end - begin, n});
      Mask mask(end - begin, n);
      for (int64_t r = begin; r < end; ++r)
        for (int64_t c = 0; c < n; ++c) {
          w[(r - begin) * n + c] = p.w[r * n + c];
          mask.set(r - begin, c, initial.pruned(r, c));
        }
      refine_recon(w, p.gram.data(), n, mask, ReconOptions{}, nm);
      for (int64_t r = begin; r < end; ++r)
        for (int64_t c = 0; c < n; ++c)
          ASSERT_EQ(mask.pruned(r - begin, c), one.pruned(r, c)) << r << "," << c;
    }
  }
}

// ---- The guard (--refine-guard) ----

// DSnoT steers only the mean error, so on random data some rows get worse: the guard restores exactly those,
// after which no row is worse than the initial mask and the others keep DSnoT's swaps.
TEST(RefineGuard, RestoresExactlyTheRowsThatRose) {
  const int64_t m = 48, n = 128;
  const Problem p = random_problem(m, n, 23);
  std::vector<double> var(static_cast<size_t>(n), 1.0), act(static_cast<size_t>(n));
  for (int64_t c = 0; c < n; ++c)
    act[static_cast<size_t>(c)] = std::sqrt(p.gram[static_cast<size_t>(c * n + c)]);
  Tensor magnitude = p.w;
  for (auto& v : magnitude.values()) v = std::fabs(v);
  const Mask initial = select_mask(magnitude, MaskSpec::row(0.6));
  Mask refined = initial;
  DsnotOptions options;
  options.threshold = 0.0;
  ASSERT_GT(refine_dsnot(p.w, p.mean, var, act, refined, options).swaps, 0);
  const Mask unguarded = refined;
  std::vector<double> changes = recon_row_changes(p.w, p.gram.data(), n, initial, refined);
  int64_t rose = 0, fell = 0;
  for (int64_t r = 0; r < m; ++r) {
    const double before = row_error(p.w, p.gram, initial, r), after = row_error(p.w, p.gram, refined, r);
    EXPECT_NEAR(changes[static_cast<size_t>(r)], after - before, 1e-12 * before) << "row " << r;
    rose += changes[static_cast<size_t>(r)] > 0.0;
    fell += changes[static_cast<size_t>(r)] < 0.0;
  }
  ASSERT_GT(rose, 0);
  ASSERT_GT(fell, 0);
  EXPECT_EQ(revert_rows_that_rose(initial, refined, changes), rose);
  for (int64_t r = 0; r < m; ++r) {
    const bool reverted = row_error(p.w, p.gram, unguarded, r) > row_error(p.w, p.gram, initial, r);
    for (int64_t c = 0; c < n; ++c)
      EXPECT_EQ(refined.pruned(r, c), (reverted ? initial : unguarded).pruned(r, c)) << r << "," << c;
    EXPECT_LE(row_error(p.w, p.gram, refined, r), row_error(p.w, p.gram, initial, r));
    EXPECT_LE(changes[static_cast<size_t>(r)], 0.0);
  }
  // Nothing left to revert, and an unchanged mask has no change at all.
  std::vector<double> again = recon_row_changes(p.w, p.gram.data(), n, initial, refined);
  EXPECT_EQ(revert_rows_that_rose(initial, refined, again), 0);
  for (double c : recon_row_changes(p.w, p.gram.data(), n, initial, initial)) EXPECT_EQ(c, 0.0);
}

// ---- Errors ----

TEST(RefineRecon, BadInputErrors) {
  const Tensor w({1, 4}, {1.0f, 1.0f, -1.0f, 1.0f});
  Mask mask = mask_from(1, 4, {{0, 1}});
  ReconOptions options;
  options.max_cycles = -1;
  expect_error([&] { refine_recon(w, kTraceGram.data(), 4, mask, options); },
               "--max-cycles must be >= 0, got -1");
  options = {};
  options.pool = 1;
  expect_error([&] { refine_recon(w, kTraceGram.data(), 4, mask, options); }, "pool must be >= 2, got 1");
  options = {};
  options.shortlist = 0;
  expect_error([&] { refine_recon(w, kTraceGram.data(), 4, mask, options); },
               "shortlist must be >= 1, got 0");
  expect_error([&] { refine_recon(w, kTraceGram.data(), 3, mask, ReconOptions{}); },
               "the Gram matrix is 3 x 3 but the weight [1, 4] has 4 columns");
  Mask wrong(2, 4);
  expect_error([&] { refine_recon(w, kTraceGram.data(), 4, wrong, ReconOptions{}); },
               "mask is [2, 4] but the weight is [1, 4]");
  expect_error(
      [&] {
        refine_recon(w, kTraceGram.data(), 4, mask, ReconOptions{}, NmPattern{2, 3});
      },
      "N:M pattern 2:3 does not fit a weight with 4 columns");
  Tensor bad = w;
  bad[2] = std::numeric_limits<float>::infinity();
  expect_error([&] { refine_recon(bad, kTraceGram.data(), 4, mask, ReconOptions{}); },
               "has a non-finite value at [0, 2]");
  std::vector<double> gram = kTraceGram;
  gram[5] = -1.0;
  expect_error([&] { refine_recon(w, gram.data(), 4, mask, ReconOptions{}); },
               "Gram matrix diagonal entry 1 is -1, not a finite number >= 0");
  expect_error([&] { recon_row_changes(w, kTraceGram.data(), 4, mask, wrong); },
               "refined mask is [2, 4] but the weight is [1, 4]");
  std::vector<double> changes(3, 0.0);
  expect_error([&] { revert_rows_that_rose(mask, mask, changes); }, "with 3 row changes do not match");
}

}  // namespace
}  // namespace symprune
