// DSnoT refinement (reference-implementations.md §5.2, §5.3): hand-traced cycles on tiny rows, the
// guards of refine_dsnot.h, and invariants on random matrices.
#include "core/refine_dsnot.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/masks.h"
#include "core/tensor.h"
#include "support/mask_test_support.h"

namespace symprune {
namespace {

using symprune::testing::expect_error;
using symprune::testing::mask_from;
using symprune::testing::pruned_columns;

// With μ̃ = v = a = 1: D = W, regrow key G = W on pruned entries, Wanda score = |W|.
const std::vector<double> kOnes8(8, 1.0);

// Row that swaps twice. Pruned {0,1,2,3}: W = 1.0 0.4 -0.2 0.3, e = 1.5. Kept {4..7}: -0.1 0.6 -0.05 0.25.
// A (ascending G, stable): c2(-0.2) c4 c5 c6 c7 (0) c3(0.3) c1(0.4) c0(1.0) = [2,4,5,6,7,3,1,0].
// Kept by Wanda: c6(.05) c4(.1) c7(.25) c5(.6); D<=0: [6,4]; D>0 reversed: [5,7] -> B = [6,4,5,7].
// cycle 1: e=1.5>0: g=A[7]=0, p=B[0]=6, e = 1.5 - 0.05 - 1.0 = 0.45
// cycle 2: e>0: g=A[6]=1, p=B[1]=4, e = 0.45 - 0.1 - 0.4 = -0.05
// cycle 3: |e| <= 0.1 -> stop. Pruned {2,3,4,6}, 2 swaps.
const std::vector<float> kTwoSwapRow = {1.0f, 0.4f, -0.2f, 0.3f, -0.1f, 0.6f, -0.05f, 0.25f};
// Row that stops at once: pruned {0..3} sum to e = 0.02 + -0.01 + 0.03 + 0 = 0.04 <= 0.1.
const std::vector<float> kQuietRow = {0.02f, -0.01f, 0.03f, 0.0f, 0.5f, -0.7f, 0.9f, -0.3f};

TEST(RefineDsnot, RowStopsAtOnceWhenErrorWithinThreshold) {
  Tensor w({1, 8}, kQuietRow);
  Mask mask = mask_from(1, 8, {{0, 1, 2, 3}});
  const Mask before = mask;
  RefineStats stats = refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, DsnotOptions{});
  EXPECT_EQ(stats.swaps, 0);
  EXPECT_EQ(mask, before);
  EXPECT_NEAR(stats.mean_abs_error_before, 0.04, 1e-6);
  EXPECT_EQ(stats.mean_abs_error_after, stats.mean_abs_error_before);
}

TEST(RefineDsnot, RowSwapsTwiceThenStops) {
  Tensor w({1, 8}, kTwoSwapRow);
  Mask mask = mask_from(1, 8, {{0, 1, 2, 3}});
  RefineStats stats = refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, DsnotOptions{});
  EXPECT_EQ(stats.swaps, 2);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{2, 3, 4, 6}));
  EXPECT_NEAR(stats.mean_abs_error_before, 1.5, 1e-6);
  EXPECT_NEAR(stats.mean_abs_error_after, 0.05, 1e-6);
}

TEST(RefineDsnot, SameSignStopsBeforeTheSignFlip) {
  // Same trace as above, but cycle 2 would take e from 0.45 to -0.05: the sign test stops the row.
  Tensor w({1, 8}, kTwoSwapRow);
  Mask mask = mask_from(1, 8, {{0, 1, 2, 3}});
  DsnotOptions options;
  options.same_sign = true;
  RefineStats stats = refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, options);
  EXPECT_EQ(stats.swaps, 1);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{1, 2, 3, 6}));
  EXPECT_NEAR(stats.mean_abs_error_after, 0.45, 1e-6);
}

TEST(RefineDsnot, FrozenRowBesideActiveRow) {
  // Row 0 stops at cycle 1 and is never touched again while row 1 does its two swaps.
  std::vector<float> values = kQuietRow;
  values.insert(values.end(), kTwoSwapRow.begin(), kTwoSwapRow.end());
  Tensor w({2, 8}, values);
  Mask mask = mask_from(2, 8, {{0, 1, 2, 3}, {0, 1, 2, 3}});
  RefineStats stats = refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, DsnotOptions{});
  EXPECT_EQ(stats.swaps, 2);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(pruned_columns(mask, 1), (std::vector<int>{2, 3, 4, 6}));
  EXPECT_NEAR(stats.mean_abs_error_before, (0.04 + 1.5) / 2, 1e-6);
  EXPECT_NEAR(stats.mean_abs_error_after, (0.04 + 0.05) / 2, 1e-6);
}

TEST(RefineDsnot, MaxCyclesZeroAndOneCycle) {
  Tensor w({1, 8}, kTwoSwapRow);
  Mask mask = mask_from(1, 8, {{0, 1, 2, 3}});
  const Mask before = mask;
  DsnotOptions options;
  options.max_cycles = 0;
  RefineStats stats = refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, options);
  EXPECT_EQ(stats.swaps, 0);
  EXPECT_EQ(mask, before);
  EXPECT_EQ(stats.mean_abs_error_after, stats.mean_abs_error_before);
  options.max_cycles = 1;  // only cycle 1 of the trace
  stats = refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, options);
  EXPECT_EQ(stats.swaps, 1);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{1, 2, 3, 6}));
}

TEST(RefineDsnot, VarianceAndMeanEnterKeys) {
  // μ̃ scales D, v divides the regrow key only. Same row as the two-swap trace, but v_1 = 0.1 makes
  // G_1 = 4 the largest key, so cycle 1 regrows c1 instead of c0:
  // cycle 1: g=1, p=B[0]=6: e = 1.5 - 0.05 - 0.4 = 1.05; cycle 2: g=A[6]=0, p=B[1]=4: e = 1.05-0.1-1 = -0.05.
  Tensor w({1, 8}, kTwoSwapRow);
  std::vector<double> var = kOnes8;
  var[1] = 0.1;
  Mask mask = mask_from(1, 8, {{0, 1, 2, 3}});
  DsnotOptions options;
  options.max_cycles = 1;
  refine_dsnot(w, kOnes8, var, kOnes8, mask, options);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{0, 2, 3, 6}));
  // var_power 0 ignores v: back to the plain trace's first cycle.
  mask = mask_from(1, 8, {{0, 1, 2, 3}});
  options.var_power = 0.0;
  refine_dsnot(w, kOnes8, var, kOnes8, mask, options);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{1, 2, 3, 6}));
  // μ̃ = 0.01 everywhere: e = 0.015 <= 0.1, nothing to do.
  mask = mask_from(1, 8, {{0, 1, 2, 3}});
  RefineStats stats = refine_dsnot(w, std::vector<double>(8, 0.01), kOnes8, kOnes8, mask, DsnotOptions{});
  EXPECT_EQ(stats.swaps, 0);
  EXPECT_NEAR(stats.mean_abs_error_before, 0.015, 1e-7);
}

TEST(RefineDsnot, PruneCandidateOfTheWrongSignStopsTheRow) {
  // n = 4, pruned {0,1}: W = 1 1 0.1 0.1, e = 2. A = [2,3,0,1] (zeros first, stable); kept c2,c3 both
  // D > 0 (Wanda tie -> c2 first), reversed: B = [3,2]. e > 0 needs a kept weight with D <= 0 and there
  // is none: the row stops at once. (The reference's front pointer would run into the D > 0 part of B
  // and prune c3 and then c2, its highest-scoring kept weights.)
  Tensor w({1, 4}, {1.0f, 1.0f, 0.1f, 0.1f});
  const std::vector<double> ones(4, 1.0);
  Mask mask = mask_from(1, 4, {{0, 1}});
  RefineStats stats = refine_dsnot(w, ones, ones, ones, mask, DsnotOptions{});
  EXPECT_EQ(stats.swaps, 0);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{0, 1}));
  // Row with one kept D < 0 weight: one swap (g = c1, p = c2, e = 2 - 0.1 - 1 = 0.9), then the next
  // candidate c3 has D > 0: stop.
  Tensor w2({1, 4}, {1.0f, 1.0f, -0.1f, 0.5f});
  mask = mask_from(1, 4, {{0, 1}});
  stats = refine_dsnot(w2, ones, ones, ones, mask, DsnotOptions{});
  EXPECT_EQ(stats.swaps, 1);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{0, 2}));
  EXPECT_NEAR(stats.mean_abs_error_after, 0.9, 1e-6);
}

TEST(RefineDsnot, RegrowCandidateOfTheWrongSignStopsTheRow) {
  // n = 4, pruned {0,1}: W = -0.5 0 | kept 0.2 0.3, μ̃ = v = 1, e = -0.5. A = [0,1,2,3] (c1 is pruned
  // with D = 0). Kept c2, c3 both D > 0, reversed: B = [3, 2].
  // cycle 1: e < 0: g = A[0] = c0, p = B[1] = c2, e = -0.5 + 0.2 + 0.5 = 0.2.
  // cycle 2: e > 0: g = A[3] = c3 is kept, and the only pruned weight left with D > 0 does not exist
  // (c1 has D = 0, which cannot reduce e): the row stops with {1, 2}.
  Tensor w({1, 4}, {-0.5f, 0.0f, 0.2f, 0.3f});
  const std::vector<double> ones(4, 1.0);
  Mask mask = mask_from(1, 4, {{0, 1}});
  RefineStats stats = refine_dsnot(w, ones, ones, ones, mask, DsnotOptions{});
  EXPECT_EQ(stats.swaps, 1);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{1, 2}));
}

TEST(RefineDsnot, NanRegrowKeysArePassedOver) {
  // v_3 = 0 and c3 pruned with D = 0: G = 0/0 = NaN, sorted last, where an e > 0 row starts. It is passed
  // over: W = 0.5 0.1 -0.3 0 | pruned {0, 3}, e = 0.5. A = [1, 2, 0, 3(NaN)], B = [2, 1].
  // cycle 1: e > 0: A[3] = c3 is passed over, g = A[2] = c0, p = B[0] = c2, e = 0.5 - 0.3 - 0.5 = -0.3.
  // cycle 2: e < 0: g = A[0] = c1 is kept (D > 0 could not reduce e anyway): stop with {2, 3}.
  Tensor w({1, 4}, {0.5f, 0.1f, -0.3f, 0.0f});
  const std::vector<double> ones(4, 1.0);
  std::vector<double> var = ones;
  var[3] = 0.0;
  Mask mask = mask_from(1, 4, {{0, 3}});
  RefineStats stats = refine_dsnot(w, ones, var, ones, mask, DsnotOptions{});
  EXPECT_EQ(stats.swaps, 1);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{2, 3}));
}

TEST(RefineDsnot, RegrowPointerIntoKeptRegionStopsTheRow) {
  // n = 4, pruned {0}: W = -1 0.3 -0.2 0.5, e = -1. G = [-1,0,0,0] -> A = [0,1,2,3].
  // Kept by Wanda: c2(.2) c1(.3) c3(.5); D<=0: [2]; D>0 reversed: [3,1] -> B = [2,3,1].
  // cycle 1: e<0: g=A[0]=0, p=B[2]=1, e = -1 + 0.3 + 1 = 0.3
  // cycle 2: e>0: g=A[3]=3 which is kept (zero-key middle of A): the row stops, no write.
  Tensor w({1, 4}, {-1.0f, 0.3f, -0.2f, 0.5f});
  const std::vector<double> ones(4, 1.0);
  Mask mask = mask_from(1, 4, {{0}});
  RefineStats stats = refine_dsnot(w, ones, ones, ones, mask, DsnotOptions{});
  EXPECT_EQ(stats.swaps, 1);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{1}));
}

TEST(RefineDsnot, NmPrunesOnlyAKeptEntryThatMovesTheErrorTowardsZero) {
  // 2:4, pruned {0,1 | 4,5}: W = 0.9 0.2 0.25 -0.3 | 0.3 0.1 -0.4 0.7 (μ = 1, so D = W), e = 1.5 (sign +).
  // A = zeros c2 c3 c6 c7, then c5(.1) c1(.2) c4(.3) c0(.9) = [2,3,6,7,5,1,4,0].
  // cycle 1: g=A[7]=0, block 0 kept: c2 (key .25, but D > 0 would move e away from 0) and c3 (key .3,
  //          D < 0) -> p=3, e = 1.5 - .3 - .9 = 0.3. (The reference code takes c2, e = 0.85, and goes on to
  //          two swaps and e = 0.15 with c2 and c6 pruned.)
  // cycle 2: g=A[6]=4, block 1 kept: c6 (D -.4) -> e = 0.3 - .4 - .3 = -0.4: the sign flips, stop.
  Tensor w({1, 8}, {0.9f, 0.2f, 0.25f, -0.3f, 0.3f, 0.1f, -0.4f, 0.7f});
  Mask mask = mask_from(1, 8, {{0, 1, 4, 5}});
  RefineStats stats = refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, DsnotOptions{}, NmPattern{2, 4});
  EXPECT_EQ(stats.swaps, 1);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{1, 3, 4, 5}));
  EXPECT_NEAR(stats.mean_abs_error_after, 0.3, 1e-6);
}

TEST(RefineDsnot, NmPrunesOnlyAPositiveEntryWhenTheErrorIsNegative) {
  // The first row with every sign flipped: e = -1.5, A = c0(-.9) c4(-.3) c1(-.2) c5(-.1), then zeros.
  // cycle 1: g=A[0]=0, block 0 kept: c2 (key .25, D < 0: away from 0) and c3 (D .3) -> p=3, e = -0.3.
  // cycle 2: g=A[1]=4, block 1 kept: c6 (D .4) -> e = -0.3 + .4 + .3 = 0.4: the sign flips, stop.
  Tensor w({1, 8}, {-0.9f, -0.2f, -0.25f, 0.3f, -0.3f, -0.1f, 0.4f, -0.7f});
  Mask mask = mask_from(1, 8, {{0, 1, 4, 5}});
  RefineStats stats = refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, DsnotOptions{}, NmPattern{2, 4});
  EXPECT_EQ(stats.swaps, 1);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{1, 3, 4, 5}));
  EXPECT_NEAR(stats.mean_abs_error_after, 0.3, 1e-6);
}

TEST(RefineDsnot, NmPrunesAZeroTermOnlyWhenTheErrorIsPositive) {
  // D = 0 leaves e where it is: a candidate with e > 0 (as in the unstructured D <= 0 list), not with e < 0.
  // e = 1.5: cycle 1, g=0, block 0 kept: c2 (D 0, key 0) and c3 (D -.3) -> p=2, e = 0.6; cycle 2, g=4,
  // p=6 (D -.4), e = -0.1: the sign flips, stop.
  Tensor positive({1, 8}, {0.9f, 0.2f, 0.0f, -0.3f, 0.3f, 0.1f, -0.4f, 0.7f});
  Mask mask = mask_from(1, 8, {{0, 1, 4, 5}});
  RefineStats stats = refine_dsnot(positive, kOnes8, kOnes8, kOnes8, mask, DsnotOptions{}, NmPattern{2, 4});
  EXPECT_EQ(stats.swaps, 1);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{1, 2, 4, 5}));
  EXPECT_NEAR(stats.mean_abs_error_after, 0.6, 1e-6);
  // e = -1.5: cycle 1, g=0, block 0 kept: c2 (D 0, the smallest key, passed over) and c3 (D .3) -> p=3.
  Tensor negative({1, 8}, {-0.9f, -0.2f, 0.0f, 0.3f, -0.3f, -0.1f, 0.4f, -0.7f});
  mask = mask_from(1, 8, {{0, 1, 4, 5}});
  stats = refine_dsnot(negative, kOnes8, kOnes8, kOnes8, mask, DsnotOptions{}, NmPattern{2, 4});
  EXPECT_EQ(stats.swaps, 1);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{1, 3, 4, 5}));
  EXPECT_NEAR(stats.mean_abs_error_after, 0.3, 1e-6);
}

TEST(RefineDsnot, NmSkipsARegrowCandidateWhoseBlockKeepsOnlyEntriesThatMoveTheErrorAway) {
  // 2:4, pruned {0,1 | 4,5}: W = 0.9 0.2 0.5 0.6 | 0.3 0.1 -0.4 0.7, e = 1.5, A = [2,3,6,7,5,1,4,0].
  // cycle 1: g=A[7]=0, whose block keeps c2 and c3, both with D > 0: pruning either would let |e| grow
  //          (the reference code prunes c2 and makes four swaps, e 1.5 -> 1.1 -> 0.4 -> 0.8 -> 1.4), so this
  //          g is passed over and the cycle is spent.
  // cycle 2: g=A[6]=4, block 1 kept: c6 (D -.4) and c7 (D .7) -> p=6, e = 1.5 - .4 - .3 = 0.8.
  // cycle 3: g=A[5]=1, block 0 again: passed over. cycle 4: g=A[4]=5, block 1's only untouched kept entry
  //          is c7 (D > 0): passed over. cycle 5: g=A[3]=7 is kept: the row stops.
  Tensor w({1, 8}, {0.9f, 0.2f, 0.5f, 0.6f, 0.3f, 0.1f, -0.4f, 0.7f});
  Mask mask = mask_from(1, 8, {{0, 1, 4, 5}});
  RefineStats stats = refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, DsnotOptions{}, NmPattern{2, 4});
  EXPECT_EQ(stats.swaps, 1);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{0, 1, 5, 6}));
  EXPECT_NEAR(stats.mean_abs_error_after, 0.8, 1e-6);
  // e < 0 (every sign flipped): A = [0,4,1,5,2,3,6,7] read from the front; g=0 passed over (c2, c3 have
  // D < 0), g=4 prunes c6 (D .4), e = -0.8; g=1 and g=5 passed over; g=2 is kept: stop.
  Tensor flipped({1, 8}, {-0.9f, -0.2f, -0.5f, -0.6f, -0.3f, -0.1f, 0.4f, -0.7f});
  mask = mask_from(1, 8, {{0, 1, 4, 5}});
  stats = refine_dsnot(flipped, kOnes8, kOnes8, kOnes8, mask, DsnotOptions{}, NmPattern{2, 4});
  EXPECT_EQ(stats.swaps, 1);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{0, 1, 5, 6}));
  EXPECT_NEAR(stats.mean_abs_error_after, 0.8, 1e-6);
  // Passing over spends a cycle: with one cycle the row is unchanged.
  mask = mask_from(1, 8, {{0, 1, 4, 5}});
  DsnotOptions one_cycle;
  one_cycle.max_cycles = 1;
  stats = refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, one_cycle, NmPattern{2, 4});
  EXPECT_EQ(stats.swaps, 0);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{0, 1, 4, 5}));
}

TEST(RefineDsnot, NmTakesTheReferenceCodesPickUnderCompatDsnot) {
  // The row above with the DSnoT code's pick, the block's smallest key whatever its sign:
  // A = [2,3,6,7,5,1,4,0].
  // cycle 1: g=A[7]=0, block 0 kept: c2(.5) c3(.6) -> p=2, e = 1.5 + .5 - .9 = 1.1
  // cycle 2: g=A[6]=4, block 1 kept: c6(.4) c7(.7) -> p=6, e = 1.1 - .4 - .3 = 0.4
  // cycle 3: g=A[5]=1, block 0 untouched kept: c3 -> p=3, e = 0.4 + .6 - .2 = 0.8
  // cycle 4: g=A[4]=5, block 1: c7 -> p=7, e = 0.8 + .7 - .1 = 1.4
  // cycle 5: g=A[3]=7 (pruned in cycle 4), block 1 has no untouched kept entry: stop.
  Tensor w({1, 8}, {0.9f, 0.2f, 0.5f, 0.6f, 0.3f, 0.1f, -0.4f, 0.7f});
  Mask mask = mask_from(1, 8, {{0, 1, 4, 5}});
  DsnotOptions options;
  options.nm_prune_any_sign = true;
  RefineStats stats = refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, options, NmPattern{2, 4});
  EXPECT_EQ(stats.swaps, 4);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{2, 3, 6, 7}));
  EXPECT_NEAR(stats.mean_abs_error_after, 1.4, 1e-6);
}

TEST(RefineDsnot, NmAlwaysAppliesSameSign) {
  // W = 0.9 0.2 -0.4 0.6 | 0.3 0.1 1.4 -1.2, e = 1.5. cycle 1: g=0, p=2 (the block's only D <= 0 kept
  // entry), e = 1.5 - .4 - .9 = 0.2. cycle 2: g=4, p=7 (D -1.2), e = 0.2 - 1.2 - .3 = -1.3: the sign flips,
  // so the row stops after one swap even though same_sign is off in the options.
  Tensor w({1, 8}, {0.9f, 0.2f, -0.4f, 0.6f, 0.3f, 0.1f, 1.4f, -1.2f});
  Mask mask = mask_from(1, 8, {{0, 1, 4, 5}});
  RefineStats stats = refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, DsnotOptions{}, NmPattern{2, 4});
  EXPECT_EQ(stats.swaps, 1);
  EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{1, 2, 4, 5}));
}

struct RandomLayer {
  Tensor w;
  std::vector<double> mu, var, act;
  Tensor wanda;
};

RandomLayer random_layer(int64_t m, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<double> uni(0.5, 2.0);
  RandomLayer layer{Tensor({m, n}), {}, {}, {}, Tensor({m, n})};
  for (int64_t i = 0; i < m * n; ++i) layer.w[i] = 0.1f * normal(rng);
  for (int64_t c = 0; c < n; ++c) {
    layer.mu.push_back(static_cast<double>(normal(rng)));
    layer.var.push_back(uni(rng));
    layer.act.push_back(uni(rng));
  }
  for (int64_t r = 0; r < m; ++r)
    for (int64_t c = 0; c < n; ++c)
      layer.wanda[r * n + c] = static_cast<float>(std::fabs(static_cast<double>(layer.w[r * n + c])) *
                                                  layer.act[static_cast<size_t>(c)]);
  return layer;
}

void check_random(const MaskSpec& spec, std::optional<NmPattern> nm, const char* label, int64_t m = 64,
                  int64_t n = 128, DsnotOptions options = {}, bool expect_reduction = true) {
  double before_sum = 0, after_sum = 0;
  int64_t swaps_total = 0;
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    RandomLayer layer = random_layer(m, n, seed);
    const Tensor w_copy = layer.w;
    const Mask initial = select_mask(layer.wanda, spec);
    Mask one = initial, two = initial;
    omp_set_num_threads(1);
    const RefineStats s1 = refine_dsnot(layer.w, layer.mu, layer.var, layer.act, one, options, nm);
    omp_set_num_threads(2);
    const RefineStats s2 = refine_dsnot(layer.w, layer.mu, layer.var, layer.act, two, options, nm);
    EXPECT_EQ(one, two);
    EXPECT_EQ(s1.swaps, s2.swaps);
    EXPECT_EQ(s1.mean_abs_error_after, s2.mean_abs_error_after);
    EXPECT_NE(one, initial);  // something was refined
    EXPECT_LE(s1.swaps, m * options.max_cycles);
    EXPECT_EQ(std::vector<float>(layer.w.values().begin(), layer.w.values().end()),
              std::vector<float>(w_copy.values().begin(), w_copy.values().end()));
    for (int64_t r = 0; r < m; ++r) {
      EXPECT_EQ(one.row_count(r), initial.row_count(r)) << "row " << r;
      if (nm)
        for (int64_t g = 0; g < n; g += nm->m) {
          int pruned = 0;
          for (int64_t c = g; c < g + nm->m; ++c) pruned += one.pruned(r, c);
          EXPECT_EQ(pruned, nm->n) << "row " << r << " block " << g;
        }
    }
    before_sum += s1.mean_abs_error_before;
    after_sum += s1.mean_abs_error_after;
    swaps_total += s1.swaps;
    std::printf("[%s seed %u] swaps %lld, mean |e| %.4f -> %.4f\n", label, seed,
                static_cast<long long>(s1.swaps), s1.mean_abs_error_before, s1.mean_abs_error_after);
  }
  EXPECT_GT(swaps_total, 0);
  // On average over the layers, not per row (no per-row guarantee: a swap can overshoot).
  if (expect_reduction) EXPECT_LT(after_sum, before_sum);
}

TEST(RefineDsnot, RandomUnstructuredInvariants) {
  check_random(MaskSpec::row(0.5), std::nullopt, "row 50%");
}
TEST(RefineDsnot, RandomNmInvariants) {
  check_random(MaskSpec::nm(2, 4), NmPattern{2, 4}, "2:4");
}

// Narrow rows with threshold 0: rows keep swapping until a pointer runs off its list, crosses the
// other one, or meets a kept entry, so every guard of refine_dsnot.h is hit; the invariants still hold.
// Without the sign test the unstructured rows oscillate around 0 and may end worse than they started
// (as the reference would), so the mean-error reduction is asserted only where it holds.
TEST(RefineDsnot, NarrowRowsExerciseTheGuards) {
  DsnotOptions options;
  options.threshold = 0.0;
  check_random(MaskSpec::row(0.5), std::nullopt, "row 50% n=16 tau=0", 32, 16, options, false);
  check_random(MaskSpec::row(0.75), std::nullopt, "row 75% n=16 tau=0", 32, 16, options, false);
  check_random(MaskSpec::nm(2, 4), NmPattern{2, 4}, "2:4 n=16 tau=0", 32, 16, options);
  options.same_sign = true;
  check_random(MaskSpec::row(0.5), std::nullopt, "row 50% n=16 tau=0 same-sign", 32, 16, options);
}

// ---- R²-DSnoT (DESIGN.md §3.4) ----

DsnotOptions r2_options(bool grow_relative, bool prune_relative, double alpha, double reg_p = 2.0,
                        double gamma_grow = 0.0, double gamma_prune = 0.0) {
  DsnotOptions options;
  options.r2 = R2Options{grow_relative, prune_relative, reg_p, gamma_grow, gamma_prune, alpha};
  return options;
}

const std::vector<double> kOnes4(4, 1.0);

// Row 0 pruned {0,1}: W 0.5 0.4 | kept -0.3 0.2, e = 0.9. Row 1 (e = 0.05, never swaps) keeps c0 = 10
// and c1 = 0.1, so ‖W̃[:,0]‖₁ = 10, ‖W̃[:,1]‖₁ = 0.1, ‖W̃[0,:]‖₁ = 0.5.
// DSnoT: g = c0 (G 0.5 > 0.4), p = c2 (the only D < 0), e = 0.9 - 0.3 - 0.5 = 0.1 -> stop: {1,2}.
// grow-relative: G0 = 0.5·(2 + 0.1) = 1.05, G1 = 0.4·(2 + 10) = 4.8 -> g = c1, p = c2, e = 0.2;
//   cycle 2: the next prune candidate c3 has D > 0 (sign guard): stop with {0,2}.
TEST(RefineR2Dsnot, GrowRelativeReordersTheRegrowList) {
  Tensor w({2, 4}, {0.5f, 0.4f, -0.3f, 0.2f, 10.0f, 0.1f, 0.02f, 0.03f});
  const Mask initial = mask_from(2, 4, {{0, 1}, {2, 3}});
  Mask dsnot = initial, r2 = initial;
  EXPECT_EQ(refine_dsnot(w, kOnes4, kOnes4, kOnes4, dsnot, DsnotOptions{}).swaps, 1);
  EXPECT_EQ(pruned_columns(dsnot, 0), (std::vector<int>{1, 2}));
  EXPECT_EQ(refine_dsnot(w, kOnes4, kOnes4, kOnes4, r2, r2_options(true, false, 1.0)).swaps, 1);
  EXPECT_EQ(pruned_columns(r2, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(pruned_columns(r2, 1), (std::vector<int>{2, 3}));
}

// Row 0 pruned {0,1}: W -0.5 -0.4 | kept 0.3 0.2, e = -0.9, τ = 0.25. Row 1 (e = 0.05) keeps c2 = 10,
// c3 = 0.01. DSnoT prunes the positive kept weight with the smallest Wanda score: c3 (0.2):
// e = -0.9 + 0.2 + 0.5 = -0.2 -> {1,3}. prune-relative: P2 = 0.3·(1/0.5 + 1/10.3) = 0.629,
// P3 = 0.2·(2 + 1/0.21) = 1.352 -> c2: e = -0.9 + 0.3 + 0.5 = -0.1 -> {1,2}.
TEST(RefineR2Dsnot, PruneRelativeReordersThePruneList) {
  Tensor w({2, 4}, {-0.5f, -0.4f, 0.3f, 0.2f, 0.02f, 0.03f, 10.0f, 0.01f});
  const Mask initial = mask_from(2, 4, {{0, 1}, {0, 1}});
  Mask dsnot = initial, r2 = initial;
  DsnotOptions options;
  options.threshold = 0.25;
  refine_dsnot(w, kOnes4, kOnes4, kOnes4, dsnot, options);
  EXPECT_EQ(pruned_columns(dsnot, 0), (std::vector<int>{1, 3}));
  DsnotOptions relative = r2_options(false, true, 1.0);
  relative.threshold = 0.25;
  refine_dsnot(w, kOnes4, kOnes4, kOnes4, r2, relative);
  EXPECT_EQ(pruned_columns(r2, 0), (std::vector<int>{1, 2}));
  EXPECT_EQ(pruned_columns(r2, 1), (std::vector<int>{0, 1}));
}

// Same row 0 as above, one row, a = (1, 1, 0.25, 0.5). Wanda: 0.3·0.25 = 0.075 < 0.2·0.5 = 0.1 -> c2.
// α = 0.5: 0.3·0.5 = 0.15 > 0.2·0.707 = 0.141 -> c3.
TEST(RefineR2Dsnot, SquareRootActivationInThePruneKey) {
  Tensor w({1, 4}, {-0.5f, -0.4f, 0.3f, 0.2f});
  const std::vector<double> act = {1.0, 1.0, 0.25, 0.5};
  const Mask initial = mask_from(1, 4, {{0, 1}});
  Mask dsnot = initial, r2 = initial;
  DsnotOptions options;
  options.threshold = 0.25;
  refine_dsnot(w, kOnes4, kOnes4, act, dsnot, options);
  EXPECT_EQ(pruned_columns(dsnot, 0), (std::vector<int>{1, 2}));
  DsnotOptions sqrt_act = r2_options(false, false, 0.5);
  sqrt_act.threshold = 0.25;
  refine_dsnot(w, kOnes4, kOnes4, act, r2, sqrt_act);
  EXPECT_EQ(pruned_columns(r2, 0), (std::vector<int>{1, 3}));
}

// γ₁ with p = 1, τ = 0.15. Row 0 (e = 0.98 > 0): pruned c0 (W 0.5, μ 1, G 0.5) and c1 (W 1.0, μ 0.48,
// G 0.48); kept -0.6, 0.4 (‖W̃‖₁ = 1). Largest G + γ₁(1 + |W|): 0.5 + 0.15 < 0.48 + 0.2 -> c1 instead
// of DSnoT's c0. Row 1 mirrors it (e < 0): smallest G - γ₁(1 + |W|) is c1 (-0.68 < -0.65).
// Both rows prune c2 (the only kept entry of the needed sign) and stop: DSnoT {1,2}, γ₁ = 0.1 {0,2}.
TEST(RefineR2Dsnot, GrowRegularizerFollowsTheErrorSign) {
  Tensor w({2, 4}, {0.5f, 1.0f, -0.6f, 0.4f, -0.5f, -1.0f, 0.6f, -0.4f});
  const std::vector<double> mu = {1.0, 0.48, 1.0, 1.0};
  const Mask initial = mask_from(2, 4, {{0, 1}, {0, 1}});
  for (double gamma : {0.0, 0.1}) {
    Mask mask = initial;
    DsnotOptions options = r2_options(false, false, 1.0, 1.0, gamma, 0.0);
    options.threshold = 0.15;
    const RefineStats stats = refine_dsnot(w, mu, kOnes4, kOnes4, mask, options);
    EXPECT_EQ(stats.swaps, 2) << "gamma " << gamma;
    const std::vector<int> expected = gamma > 0.0 ? std::vector<int>{0, 2} : std::vector<int>{1, 2};
    EXPECT_EQ(pruned_columns(mask, 0), expected) << "gamma " << gamma;
    EXPECT_EQ(pruned_columns(mask, 1), expected) << "gamma " << gamma;
  }
}

// γ₂ with p = ∞: pruned c0 = -1 (e = -1), kept positives 0.3 (the row maximum), 0.25, 0.1, τ = 0.35.
// ‖W̃ − W[c]e_c‖_∞: c1 -> 0.25 (the second largest), c2, c3 -> 0.3.
// γ₂ = 1: keys 0.55, 0.55, 0.40 -> c3 (as DSnoT). γ₂ = 10: 2.8, 3.25, 3.1 -> c1.
TEST(RefineR2Dsnot, PruneRegularizerInfinityNormUsesTheSecondLargest) {
  Tensor w({1, 4}, {-1.0f, 0.3f, 0.25f, 0.1f});
  const Mask initial = mask_from(1, 4, {{0}});
  for (auto [gamma, pruned] : {std::pair{1.0, 3}, std::pair{10.0, 1}}) {
    Mask mask = initial;
    DsnotOptions options = r2_options(false, false, 1.0, std::numeric_limits<double>::infinity(), 0.0, gamma);
    options.threshold = 0.35;
    EXPECT_EQ(refine_dsnot(w, kOnes4, kOnes4, kOnes4, mask, options).swaps, 1);
    EXPECT_EQ(pruned_columns(mask, 0), (std::vector<int>{pruned})) << "gamma " << gamma;
  }
}

// With both relative factors off, no regularization and α = 1 the keys are DSnoT's: identical masks.
TEST(RefineR2Dsnot, ReducesToDsnotWithoutItsAdditions) {
  for (const auto& [spec, nm, threshold] :
       {std::tuple{MaskSpec::row(0.5), std::optional<NmPattern>{}, 0.1},
        std::tuple{MaskSpec::row(0.7), std::optional<NmPattern>{}, 0.0},
        std::tuple{MaskSpec::nm(2, 4), std::optional<NmPattern>{NmPattern{2, 4}}, 0.1}}) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      RandomLayer layer = random_layer(48, 96, seed);
      layer.var[5] = 0.0;  // NaN / inf keys take the same path too
      const Mask initial = select_mask(layer.wanda, spec);
      Mask dsnot = initial, r2 = initial;
      DsnotOptions plain;
      plain.threshold = threshold;
      DsnotOptions reduced = r2_options(false, false, 1.0);
      reduced.threshold = threshold;
      const RefineStats a = refine_dsnot(layer.w, layer.mu, layer.var, layer.act, dsnot, plain, nm);
      const RefineStats b = refine_dsnot(layer.w, layer.mu, layer.var, layer.act, r2, reduced, nm);
      EXPECT_EQ(dsnot, r2) << describe(spec) << " seed " << seed;
      EXPECT_EQ(a.swaps, b.swaps);
      EXPECT_GT(a.swaps, 0);
    }
  }
}

TEST(RefineR2Dsnot, RandomInvariantsForEveryNormAndRegularizer) {
  check_random(MaskSpec::row(0.5), std::nullopt, "r2 default row 50%", 64, 128, r2_options(true, true, 0.5));
  check_random(MaskSpec::nm(2, 4), NmPattern{2, 4}, "r2 default 2:4", 64, 128, r2_options(true, true, 0.5));
  for (double p : {1.0, 2.0, std::numeric_limits<double>::infinity()}) {
    check_random(MaskSpec::row(0.6), std::nullopt, "r2 grow-rel gammas row 60%", 64, 128,
                 r2_options(true, false, 0.5, p, 1e-3, 1e-3));
    check_random(MaskSpec::nm(2, 4), NmPattern{2, 4}, "r2 prune-rel gammas 2:4", 64, 128,
                 r2_options(false, true, 0.5, p, 1e-3, 1e-3));
  }
  // Large γ₁: the two regrow orders differ a lot, so pointers meet entries regrown the other way.
  DsnotOptions strong = r2_options(true, true, 0.5, 1.0, 10.0, 10.0);
  strong.threshold = 0.0;
  check_random(MaskSpec::row(0.5), std::nullopt, "r2 gamma 10 n=16 tau=0", 32, 16, strong, false);
}

TEST(RefineR2Dsnot, MaxCyclesZeroKeepsTheInitialMask) {
  RandomLayer layer = random_layer(16, 32, 7);
  const Mask initial = select_mask(layer.wanda, MaskSpec::row(0.5));
  Mask mask = initial;
  DsnotOptions options = r2_options(true, true, 0.5, 2.0, 1e-3, 1e-3);
  options.max_cycles = 0;
  EXPECT_EQ(refine_dsnot(layer.w, layer.mu, layer.var, layer.act, mask, options).swaps, 0);
  EXPECT_EQ(mask, initial);
}

// A row partition (as a distributed run holds it) refines exactly like the whole matrix once R²-DSnoT gets
// the whole matrix's column norms: the per-slice column sums add up to them.
TEST(RefineR2Dsnot, RowPartitionsMatchTheWholeMatrix) {
  RandomLayer layer = random_layer(40, 64, 11);
  const Mask initial = select_mask(layer.wanda, MaskSpec::row(0.5));
  const DsnotOptions options = r2_options(true, true, 0.5, 2.0, 1e-3, 1e-3);
  Mask whole = initial;
  refine_dsnot(layer.w, layer.mu, layer.var, layer.act, whole, options);
  const int64_t split = 17, n = 64;
  auto slice = [&](int64_t begin, int64_t end) {
    Tensor w({end - begin, n});
    Mask mask(end - begin, n);
    for (int64_t r = begin; r < end; ++r)
      for (int64_t c = 0; c < n; ++c) {
        w[(r - begin) * n + c] = layer.w[r * n + c];
        mask.set(r - begin, c, initial.pruned(r, c));
      }
    return std::pair{w, mask};
  };
  auto [w0, m0] = slice(0, split);
  auto [w1, m1] = slice(split, 40);
  std::vector<double> col = initial_column_l1(w0, m0);
  const std::vector<double> col1 = initial_column_l1(w1, m1);
  for (size_t c = 0; c < col.size(); ++c) col[c] += col1[c];
  const std::vector<double> expected = initial_column_l1(layer.w, initial);
  for (size_t c = 0; c < col.size(); ++c) EXPECT_NEAR(col[c], expected[c], 1e-12 * expected[c]);
  refine_dsnot(w0, layer.mu, layer.var, layer.act, m0, options, std::nullopt, &expected);
  refine_dsnot(w1, layer.mu, layer.var, layer.act, m1, options, std::nullopt, &expected);
  int64_t changed = 0;
  for (int64_t r = 0; r < 40; ++r)
    for (int64_t c = 0; c < n; ++c) {
      const bool part = r < split ? m0.pruned(r, c) : m1.pruned(r - split, c);
      EXPECT_EQ(part, whole.pruned(r, c)) << r << "," << c;
      changed += whole.pruned(r, c) != initial.pruned(r, c);
    }
  EXPECT_GT(changed, 0);
  // The slice's own column norms differ: without column_l1 the keys (and here the masks) change.
  Mask own = slice(0, split).second;
  refine_dsnot(w0, layer.mu, layer.var, layer.act, own, options);
  EXPECT_NE(own, m0);
}

// The helper the pipeline uses for masks refined another way (recon, or reverted by the guard) reports what
// refine_dsnot reports for its own masks.
TEST(RefineDsnot, AbsExpectedErrorsMatchTheStats) {
  for (const MaskSpec& spec : {MaskSpec::row(0.6), MaskSpec::nm(2, 4)}) {
    RandomLayer layer = random_layer(32, 64, 9);
    const Mask initial = select_mask(layer.wanda, spec);
    Mask mask = initial;
    std::optional<NmPattern> nm;
    if (spec.kind == MaskSpec::kNM) nm = NmPattern{2, 4};
    const RefineStats stats = refine_dsnot(layer.w, layer.mu, layer.var, layer.act, mask, DsnotOptions{}, nm);
    ASSERT_GT(stats.swaps, 0);
    EXPECT_FALSE(stats.recon_sq_change.has_value());  // no G here
    EXPECT_EQ(abs_expected_errors(layer.w, layer.mu, initial), stats.row_abs_error_before);
    EXPECT_EQ(abs_expected_errors(layer.w, layer.mu, mask), stats.row_abs_error_after);
    EXPECT_EQ(mean_of_rows(stats.row_abs_error_before), stats.mean_abs_error_before);
    EXPECT_EQ(mean_of_rows(stats.row_abs_error_after), stats.mean_abs_error_after);
    ASSERT_EQ(stats.row_abs_error_after.size(), 32u);
  }
  expect_error(
      [] {
        abs_expected_errors(Tensor({2, 4}), std::vector<double>(3, 1.0), Mask(2, 4));
      },
      "mask [2, 4] and 3 means do not match the weight [2, 4]");
}

TEST(RefineDsnot, BadInputErrors) {
  Tensor w({1, 8}, kTwoSwapRow);
  Mask mask(1, 8);
  expect_error([&] { refine_dsnot(w, std::vector<double>(7, 1.0), kOnes8, kOnes8, mask, {}); },
               "mean-sum vector (mu) has 7 entries but the weight [1, 8] has 8 columns");
  expect_error([&] { refine_dsnot(w, kOnes8, std::vector<double>(9, 1.0), kOnes8, mask, {}); },
               "variance vector (var) has 9 entries");
  expect_error([&] { refine_dsnot(w, kOnes8, kOnes8, {}, mask, {}); },
               "activation-norm vector (act_norm) has 0 entries");
  Mask wrong(2, 8);
  expect_error([&] { refine_dsnot(w, kOnes8, kOnes8, kOnes8, wrong, {}); },
               "mask is [2, 8] but the weight is [1, 8]");
  DsnotOptions options;
  options.max_cycles = -1;
  expect_error([&] { refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, options); },
               "--max-cycles must be >= 0, got -1");
  options = {};
  options.threshold = std::nan("");
  expect_error([&] { refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, options); },
               "--refine-threshold must be a number >= 0");
  options = {};
  options.r2 = R2Options{};
  options.r2->reg_p = 3;
  expect_error([&] { refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, options); },
               "--reg-p must be 1, 2 or inf, got 3");
  options.r2 = R2Options{};
  options.r2->gamma_grow = -1e-4;
  expect_error([&] { refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, options); },
               "--gamma-grow must be a finite number >= 0");
  options.r2 = R2Options{};
  options.r2->gamma_prune = std::nan("");
  expect_error([&] { refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, options); },
               "--gamma-prune must be a finite number >= 0");
  options.r2 = R2Options{};
  options.r2->alpha = -0.5;
  expect_error([&] { refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, options); },
               "--refine-alpha must be a finite number >= 0, got -0.5");
  expect_error(
      [&] {
        refine_dsnot(w, kOnes8, kOnes8, kOnes8, mask, {}, NmPattern{2, 3});
      },
      "N:M pattern 2:3 does not fit a weight with 8 columns");
  Tensor vec({8});
  expect_error([&] { refine_dsnot(vec, kOnes8, kOnes8, kOnes8, mask, {}); }, "weight must be a matrix");
}

}  // namespace
}  // namespace symprune
