// Mask selection (DESIGN.md §3.3, reference-implementations.md §4): exact masks on hand-written
// matrices, tie rules, count truncation, and random matrices against a full stable-sort reference.
#include "core/masks.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace symprune {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor matrix(int64_t rows, int64_t cols, std::vector<float> values) {
  return Tensor({rows, cols}, std::move(values));
}

// Flat indices of the pruned entries, ascending.
std::vector<int64_t> pruned_indices(const Mask& mask) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < mask.size(); ++i)
    if (mask.flat()[static_cast<size_t>(i)]) out.push_back(i);
  return out;
}

// Runs `body` and expects a symprune::Error whose message contains every string of `parts`.
template <typename F>
void expect_error(F body, std::vector<std::string> parts) {
  try {
    body();
    ADD_FAILURE() << "expected symprune::Error containing '" << parts.front() << "'";
  } catch (const Error& e) {
    for (const std::string& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "message: " << e.what() << "\nmissing: " << part;
  }
}

// ---- Brute-force references: a full stable sort by float comparison, ties kept in index order. ----

std::vector<int64_t> stable_order(const float* s, int64_t count) {
  std::vector<int64_t> idx(static_cast<size_t>(count));
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return s[a] < s[b]; });
  return idx;
}

std::vector<uint8_t> reference_row(const Tensor& s, double rho) {
  const int64_t rows = s.dim(0), cols = s.dim(1);
  const int64_t k = static_cast<int64_t>(static_cast<double>(cols) * rho);
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols), 0);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<int64_t> order = stable_order(s.data() + r * cols, cols);
    for (int64_t i = 0; i < k; ++i) out[static_cast<size_t>(r * cols + order[static_cast<size_t>(i)])] = 1;
  }
  return out;
}

std::vector<uint8_t> reference_layer(const Tensor& s, double rho) {
  const int64_t size = s.numel();
  const int64_t k = static_cast<int64_t>(static_cast<double>(size) * rho);
  std::vector<uint8_t> out(static_cast<size_t>(size), 0);
  const std::vector<int64_t> order = stable_order(s.data(), size);
  for (int64_t i = 0; i < k; ++i) out[static_cast<size_t>(order[static_cast<size_t>(i)])] = 1;
  return out;
}

// torch: theta = sort(S.flatten())[k] with NaN last; mask = S <= theta.
std::vector<uint8_t> reference_layer_le(const Tensor& s, double rho) {
  const int64_t size = s.numel();
  const int64_t k = static_cast<int64_t>(static_cast<double>(size) * rho);
  std::vector<float> sorted(s.data(), s.data() + size);
  std::stable_sort(sorted.begin(), sorted.end(), [](float a, float b) {
    if (std::isnan(a)) return false;
    if (std::isnan(b)) return true;
    return a < b;
  });
  const float theta = sorted[static_cast<size_t>(k)];
  std::vector<uint8_t> out(static_cast<size_t>(size), 0);
  for (int64_t i = 0; i < size; ++i) out[static_cast<size_t>(i)] = s[i] <= theta ? 1 : 0;
  return out;
}

std::vector<uint8_t> reference_nm(const Tensor& s, int n, int m) {
  const int64_t rows = s.dim(0), cols = s.dim(1);
  std::vector<uint8_t> out(static_cast<size_t>(rows * cols), 0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < cols / m; ++g) {
      const int64_t base = r * cols + g * m;
      const std::vector<int64_t> order = stable_order(s.data() + base, m);
      for (int i = 0; i < n; ++i) out[static_cast<size_t>(base + order[static_cast<size_t>(i)])] = 1;
    }
  return out;
}

std::vector<uint8_t> as_vector(const Mask& mask) {
  return {mask.flat().begin(), mask.flat().end()};
}

// Continuous scores (ties essentially absent) or scores from a small set (ties everywhere, both zeros).
Tensor random_scores(int64_t rows, int64_t cols, uint32_t seed, bool with_ties) {
  Tensor t({rows, cols});
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> cont(-2.0f, 2.0f);
  std::uniform_int_distribution<int> level(-3, 3);
  std::bernoulli_distribution sign(0.5);
  for (float& v : t.values()) {
    if (with_ties) {
      v = static_cast<float>(level(gen)) * 0.25f;
      if (v == 0.0f && sign(gen)) v = -0.0f;
    } else {
      v = cont(gen);
    }
  }
  return t;
}

// ------------------------------------------------------------------------------------------------

TEST(PruneCount, TruncatesLikeTheReferenceRepos) {
  EXPECT_EQ(prune_count(4096, 0.6), 2457);
  EXPECT_EQ(prune_count(11008, 0.7), 7705);
  EXPECT_EQ(prune_count(4096, 0.5), 2048);
  EXPECT_EQ(prune_count(10, 0.0), 0);
  EXPECT_EQ(prune_count(7, 0.99), 6);
  for (int64_t n : {1, 3, 100, 4096, 5120, 11008, 13824})
    for (double rho : {0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8, 0.9})
      EXPECT_EQ(prune_count(n, rho), static_cast<long>(static_cast<double>(n) * rho)) << n << " " << rho;
}

TEST(ScoreOrderKey, MonotoneAndZerosEqual) {
  const std::vector<float> ascending = {-kInf,  -3.5f, -1.0f, -1e-40f, 0.0f, 1e-45f,
                                        1e-38f, 1.0f,  2.0f,  3e38f,   kInf};
  for (size_t i = 0; i + 1 < ascending.size(); ++i)
    EXPECT_LT(score_order_key(ascending[i]), score_order_key(ascending[i + 1])) << ascending[i];
  EXPECT_EQ(score_order_key(-0.0f), score_order_key(0.0f));
  EXPECT_EQ(score_order_key(kNaN), 0xFFFFFFFFu);
  EXPECT_EQ(score_order_key(-kNaN), 0xFFFFFFFFu);
  EXPECT_GT(score_order_key(kNaN), score_order_key(kInf));
  for (float v : ascending) EXPECT_EQ(score_from_order_key(score_order_key(v)), v);
  EXPECT_FALSE(std::signbit(score_from_order_key(score_order_key(-0.0f))));
}

// ---- Row mode ----

TEST(RowMask, HandWrittenWithTies) {
  // k = int(6 * 0.5) = 3 per row.
  const Tensor s = matrix(3, 6,
                          {0.5f, -1.0f, 3.0f, 0.2f, 0.2f, 7.0f,   // clear: columns 1, 3, 4
                           1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f,    // all equal: lowest indices 0, 1, 2
                           3.0f, 1.0f, 2.0f, 2.0f, 2.0f, 0.0f});  // tie straddles k: 5, 1, then 2 (not 3, 4)
  const Mask mask = select_mask(s, MaskSpec::row(0.5), "m");
  EXPECT_EQ(pruned_indices(mask), (std::vector<int64_t>{1, 3, 4, 6, 7, 8, 13, 14, 17}));
  for (int64_t r = 0; r < 3; ++r) EXPECT_EQ(mask.row_count(r), 3);
  EXPECT_EQ(mask.count(), 9);
  EXPECT_DOUBLE_EQ(mask.sparsity(), 0.5);
}

TEST(RowMask, NegativeAndPositiveZeroAreEqual) {
  // Compared as bits, -0.0 would sort first and columns 1, 3 would be pruned.
  const Tensor s = matrix(1, 4, {0.0f, -0.0f, 0.0f, -0.0f});
  EXPECT_EQ(pruned_indices(select_mask(s, MaskSpec::row(0.5), "m")), (std::vector<int64_t>{0, 1}));
  const Tensor t = matrix(1, 4, {1.0f, -0.0f, 0.0f, -1.0f});
  EXPECT_EQ(pruned_indices(select_mask(t, MaskSpec::row(0.5), "m")), (std::vector<int64_t>{1, 3}));
}

TEST(RowMask, InfinitiesOrdered) {
  const Tensor s = matrix(1, 5, {kInf, -kInf, 0.0f, kInf, 1.0f});
  EXPECT_EQ(pruned_indices(select_mask(s, MaskSpec::row(0.8), "m")), (std::vector<int64_t>{0, 1, 2, 4}));
}

TEST(RowMask, TruncatedCounts) {
  const Tensor a = random_scores(3, 4096, 11, false);
  const Mask ma = select_mask(a, MaskSpec::row(0.6), "a");
  for (int64_t r = 0; r < 3; ++r) EXPECT_EQ(ma.row_count(r), 2457);
  EXPECT_EQ(as_vector(ma), reference_row(a, 0.6));
  const Tensor b = random_scores(2, 11008, 12, true);
  const Mask mb = select_mask(b, MaskSpec::row(0.7), "b");
  for (int64_t r = 0; r < 2; ++r) EXPECT_EQ(mb.row_count(r), 7705);
  EXPECT_EQ(as_vector(mb), reference_row(b, 0.7));
}

TEST(RowMask, ZeroSparsityPrunesNothing) {
  const Tensor s = random_scores(4, 9, 3, true);
  EXPECT_EQ(select_mask(s, MaskSpec::row(0.0), "m").count(), 0);
  // k = int(9 * 0.1) = 0 too.
  EXPECT_EQ(select_mask(s, MaskSpec::row(0.1), "m").count(), 0);
}

TEST(RowMask, RandomAgainstStableSort) {
  uint32_t seed = 100;
  for (bool ties : {false, true})
    for (auto [rows, cols] :
         std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 7}, {17, 64}, {8, 333}, {5, 1000}})
      for (double rho : {0.1, 0.25, 0.5, 0.6, 0.7, 0.9, 0.999}) {
        const Tensor s = random_scores(rows, cols, ++seed, ties);
        const Mask mask = select_mask(s, MaskSpec::row(rho), "m");
        ASSERT_EQ(as_vector(mask), reference_row(s, rho))
            << rows << "x" << cols << " rho " << rho << " ties " << ties;
        for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(mask.row_count(r), prune_count(cols, rho));
      }
}

// ---- Layer mode ----

TEST(LayerMask, HandWrittenTiesAcrossRowsByFlatIndex) {
  // All equal: k = int(12 * 0.5) = 6 lowest flat indices, i.e. rows 0 and the first half of row 1.
  const Tensor s = matrix(3, 4, std::vector<float>(12, 2.0f));
  EXPECT_EQ(pruned_indices(select_mask(s, MaskSpec::layer(0.5), "m")),
            (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));
  // The tie at the boundary spans rows: 0 (flat 11), 1 (flat 2), then four of the five 2s in flat
  // order: 1, 5, 6, 8 -- not 10.
  const Tensor t = matrix(3, 4,
                          {5.0f, 2.0f, 1.0f, 3.0f,  //
                           4.0f, 2.0f, 2.0f, 9.0f,  //
                           2.0f, 7.0f, 2.0f, 0.0f});
  const Mask mask = select_mask(t, MaskSpec::layer(0.5), "m");
  EXPECT_EQ(pruned_indices(mask), (std::vector<int64_t>{1, 2, 5, 6, 8, 11}));
  EXPECT_EQ(mask.row_count(0), 2);
  EXPECT_EQ(mask.row_count(1), 2);
  EXPECT_EQ(mask.row_count(2), 2);
  const Mask mask5 = select_mask(t, MaskSpec::layer(5.0 / 12.0 + 1e-9), "m");  // k = 5
  EXPECT_EQ(pruned_indices(mask5), (std::vector<int64_t>{1, 2, 5, 6, 11}));
}

TEST(LayerMask, ZerosOfBothSignsTieByFlatIndex) {
  const Tensor s = matrix(2, 3, {-0.0f, 1.0f, 0.0f, -0.0f, -1.0f, 0.0f});
  EXPECT_EQ(pruned_indices(select_mask(s, MaskSpec::layer(0.5), "m")), (std::vector<int64_t>{0, 2, 4}));
}

TEST(LayerMask, ZeroSparsityPrunesNothing) {
  EXPECT_EQ(select_mask(random_scores(5, 5, 4, true), MaskSpec::layer(0.0), "m").count(), 0);
}

TEST(LayerMask, RandomAgainstStableSort) {
  uint32_t seed = 500;
  for (bool ties : {false, true})
    for (auto [rows, cols] :
         std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 9}, {4, 7}, {31, 64}, {64, 333}})
      for (double rho : {0.01, 0.25, 0.5, 0.6, 0.7, 0.9, 0.999}) {
        const Tensor s = random_scores(rows, cols, ++seed, ties);
        const Mask mask = select_mask(s, MaskSpec::layer(rho), "m");
        ASSERT_EQ(as_vector(mask), reference_layer(s, rho))
            << rows << "x" << cols << " rho " << rho << " ties " << ties;
        ASSERT_EQ(mask.count(), prune_count(rows * cols, rho));
      }
}

TEST(LayerMask, WideRangeOfMagnitudes) {
  // Exercises every radix digit: values spread over many exponents, with duplicates and infinities.
  Tensor s({50, 200});
  std::mt19937 gen(77);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-140, 120);
  for (float& v : s.values()) v = std::ldexp(mant(gen), expo(gen));
  for (int i = 0; i < 300; ++i) s[i * 7] = s[i * 11];
  s[3] = kInf;
  s[17] = -kInf;
  s[99] = -kInf;
  for (double rho : {0.0001, 0.3, 0.5, 0.77, 0.9999}) {
    EXPECT_EQ(as_vector(select_mask(s, MaskSpec::layer(rho), "m")), reference_layer(s, rho)) << rho;
    EXPECT_EQ(as_vector(select_mask(s, MaskSpec::layer(rho, true), "m")), reference_layer_le(s, rho)) << rho;
  }
}

// ---- Compat "<= theta" (layer) ----

TEST(LayerMaskCompat, ThresholdRuleIncludesTies) {
  // sorted = 0 1 2 2 2 3; k = 3; theta = sorted[3] = 2; every S <= 2 pruned: 5 entries > k.
  const Tensor s = matrix(2, 3, {1.0f, 2.0f, 2.0f, 2.0f, 3.0f, 0.0f});
  const Mask compat = select_mask(s, MaskSpec::layer(0.5, true), "m");
  EXPECT_EQ(pruned_indices(compat), (std::vector<int64_t>{0, 1, 2, 3, 5}));
  // The default rule prunes exactly k = 3: 0, 1 and the first 2 by flat index.
  EXPECT_EQ(pruned_indices(select_mask(s, MaskSpec::layer(0.5), "m")), (std::vector<int64_t>{0, 1, 5}));
  // Without ties at theta the rule prunes exactly k + 1.
  const Tensor t = matrix(2, 4, {8.0f, 1.0f, 7.0f, 2.0f, 6.0f, 3.0f, 5.0f, 4.0f});
  const Mask le = select_mask(t, MaskSpec::layer(0.5, true), "m");
  EXPECT_EQ(le.count(), 5);
  EXPECT_EQ(pruned_indices(le), (std::vector<int64_t>{1, 3, 5, 6, 7}));
}

TEST(LayerMaskCompat, ZeroSparsityStillPrunesTheMinimum) {
  // theta = sorted[0]: the reference rule prunes the minimum and every tie with it even at rho = 0.
  const Tensor s = matrix(2, 2, {3.0f, -1.0f, -1.0f, 0.0f});
  EXPECT_EQ(pruned_indices(select_mask(s, MaskSpec::layer(0.0, true), "m")), (std::vector<int64_t>{1, 2}));
}

TEST(LayerMaskCompat, NaNNeverPrunedAndNaNThresholdPrunesNothing) {
  const Tensor s = matrix(2, 2, {kNaN, 1.0f, 2.0f, kNaN});
  // k = 1: theta = 2, NaN <= 2 is false.
  EXPECT_EQ(pruned_indices(select_mask(s, MaskSpec::layer(0.25, true), "m")), (std::vector<int64_t>{1, 2}));
  // k = 2: theta = NaN (sorted last) and S <= NaN is false everywhere, as in torch.
  EXPECT_EQ(select_mask(s, MaskSpec::layer(0.5, true), "m").count(), 0);
}

TEST(LayerMaskCompat, NegativeZeroEqualsPositiveZero) {
  const Tensor s = matrix(1, 4, {0.0f, 1.0f, -0.0f, -1.0f});
  // sorted: -1, 0, 0, 1; k = 1 -> theta = 0 -> {-1, 0.0, -0.0} pruned.
  EXPECT_EQ(pruned_indices(select_mask(s, MaskSpec::layer(0.25, true), "m")),
            (std::vector<int64_t>{0, 2, 3}));
}

TEST(LayerMaskCompat, RandomAgainstTorchRule) {
  uint32_t seed = 900;
  for (bool ties : {false, true})
    for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 5}, {6, 7}, {40, 96}})
      for (double rho : {0.0, 0.2, 0.5, 0.7, 0.95}) {
        Tensor s = random_scores(rows, cols, ++seed, ties);
        if (!ties) s[0] = kNaN;  // NaN allowed under the compat rule
        const Mask mask = select_mask(s, MaskSpec::layer(rho, true), "m");
        ASSERT_EQ(as_vector(mask), reference_layer_le(s, rho)) << rows << "x" << cols << " rho " << rho;
        if (ties) ASSERT_GT(mask.count(), prune_count(rows * cols, rho));
      }
}

TEST(RowMask, CompatFlagIgnoredOutsideLayerMode) {
  const Tensor s = random_scores(4, 8, 5, true);
  MaskSpec spec = MaskSpec::row(0.5);
  spec.compat_threshold_le = true;
  EXPECT_EQ(select_mask(s, spec, "m"), select_mask(s, MaskSpec::row(0.5), "m"));
}

// ---- N:M ----

TEST(NmMask, TwoFourHandWritten) {
  const Tensor s = matrix(1, 16,
                          {4, 3, 2, 1,    // clear: 2, 3
                           5, 5, 5, 5,    // all equal: 4, 5
                           1, 2, 2, 0,    // clear: 8, 11
                           1, 2, 2, 2});  // tie straddling N: 12, 13
  const Mask mask = select_mask(s, MaskSpec::nm(2, 4), "m");
  EXPECT_EQ(pruned_indices(mask), (std::vector<int64_t>{2, 3, 4, 5, 8, 11, 12, 13}));
}

TEST(NmMask, FourEightAndOneThreeWithTies) {
  const Tensor s = matrix(2, 8,
                          {3, 3, 1, 3, 3, 0, 3, 3,          // 5, 2, then 3s at 0, 1
                           -1, 2, -0.0f, 0, 0, 9, -1, 0});  // -1 at 0, 6; zeros at 2, 3
  EXPECT_EQ(pruned_indices(select_mask(s, MaskSpec::nm(4, 8), "m")),
            (std::vector<int64_t>{0, 1, 2, 5, 8, 10, 11, 14}));
  const Tensor t = matrix(2, 6,
                          {7, 7, 7, 2, 1, 1,        // group 0: 0; group 1: 4
                           0, -0.0f, 5, 9, 8, 8});  // group 0: 0 (zeros equal); group 1: 4
  EXPECT_EQ(pruned_indices(select_mask(t, MaskSpec::nm(1, 3), "m")), (std::vector<int64_t>{0, 4, 6, 10}));
}

TEST(NmMask, RandomAgainstStableSort) {
  uint32_t seed = 1300;
  for (bool ties : {false, true})
    for (auto [n, m] :
         std::vector<std::pair<int, int>>{{1, 2}, {2, 4}, {4, 8}, {1, 3}, {3, 7}, {5, 40}, {31, 64}})
      for (int64_t rows : {1, 9}) {
        const int64_t cols = static_cast<int64_t>(m) * 5;
        const Tensor s = random_scores(rows, cols, ++seed, ties);
        const Mask mask = select_mask(s, MaskSpec::nm(n, m), "m");
        ASSERT_EQ(as_vector(mask), reference_nm(s, n, m)) << n << ":" << m << " ties " << ties;
        for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(mask.row_count(r), static_cast<int64_t>(n) * 5);
      }
}

TEST(NmMask, SparsityFieldIgnored) {
  const Tensor s = random_scores(3, 16, 8, false);
  MaskSpec spec = MaskSpec::nm(2, 4);
  spec.sparsity = 0.9;
  EXPECT_EQ(select_mask(s, spec, "m").count(), 24);
}

// ---- Thread-count independence ----

TEST(Masks, SameResultForAnyThreadCount) {
  // Large enough (> 2^15 entries) for the parallel paths to run.
  const Tensor s = random_scores(129, 512, 2024, true);
  const std::vector<MaskSpec> specs = {MaskSpec::row(0.5), MaskSpec::layer(0.6), MaskSpec::layer(0.6, true),
                                       MaskSpec::nm(2, 4)};
  const int saved = omp_get_max_threads();
  for (const MaskSpec& spec : specs) {
    omp_set_num_threads(1);
    const Mask one = select_mask(s, spec, "m");
    omp_set_num_threads(5);
    const Mask five = select_mask(s, spec, "m");
    EXPECT_EQ(one, five) << describe(spec);
    if (spec.kind == MaskSpec::kUnstructuredLayer && !spec.compat_threshold_le)
      EXPECT_EQ(as_vector(five), reference_layer(s, 0.6));
    if (spec.kind == MaskSpec::kUnstructuredRow) EXPECT_EQ(as_vector(five), reference_row(s, 0.5));
    if (spec.kind == MaskSpec::kNM) EXPECT_EQ(as_vector(five), reference_nm(s, 2, 4));
  }
  omp_set_num_threads(saved);
}

// ---- apply ----

TEST(MaskApply, ZeroesExactlyThePrunedEntries) {
  Tensor w = random_scores(6, 10, 31, false);
  w[5] = -0.0f;
  w[7] = kNaN;  // unpruned NaN weight stays bit-identical
  const Tensor before = w;
  const Mask mask = select_mask(random_scores(6, 10, 32, false), MaskSpec::row(0.5), "m");
  mask.apply(w);
  int64_t zeros = 0;
  for (int64_t i = 0; i < w.numel(); ++i) {
    const uint32_t got = std::bit_cast<uint32_t>(w[i]);
    if (mask.flat()[static_cast<size_t>(i)]) {
      EXPECT_EQ(got, 0u) << i;  // +0.0 exactly
      ++zeros;
    } else {
      EXPECT_EQ(got, std::bit_cast<uint32_t>(before[i])) << i;
    }
  }
  EXPECT_EQ(zeros, 30);
}

TEST(MaskApply, ShapeMismatchIsAnError) {
  Tensor w({4, 6});
  expect_error([&] { Mask(4, 5).apply(w); }, {"[4, 5]", "[4, 6]"});
  Tensor v({24});
  expect_error([&] { Mask(4, 6).apply(v); }, {"[4, 6]", "[24]"});
}

// ---- bit packing ----

TEST(MaskBits, KnownLayoutLsbFirst) {
  Mask mask(2, 5);  // 10 bits -> 2 bytes
  mask.set(0, 0, true);
  mask.set(0, 3, true);
  mask.set(1, 2, true);  // flat 7
  mask.set(1, 3, true);  // flat 8
  const std::vector<uint8_t> bits = mask.pack_bits();
  EXPECT_EQ(bits, (std::vector<uint8_t>{0x89, 0x01}));
  EXPECT_EQ(Mask::unpack_bits(2, 5, bits), mask);
}

TEST(MaskBits, RoundTripRandomShapes) {
  std::mt19937 gen(5);
  std::bernoulli_distribution coin(0.4);
  for (auto [rows, cols] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {1, 1}, {1, 7}, {3, 8}, {5, 13}, {64, 100}}) {
    Mask mask(rows, cols);
    for (uint8_t& v : mask.flat()) v = coin(gen) ? 1 : 0;
    const std::vector<uint8_t> bits = mask.pack_bits();
    EXPECT_EQ(static_cast<int64_t>(bits.size()), (rows * cols + 7) / 8);
    const Mask back = Mask::unpack_bits(rows, cols, bits);
    EXPECT_EQ(back, mask) << rows << "x" << cols;
    EXPECT_EQ(back.count(), mask.count());
  }
}

// Eight entries at a time: bit j of byte b is entry 8b + j for every byte value (any nonzero byte is
// pruned, e.g. 0x80 or 0x10 whose low bit is clear), with tails of every length and a mask large enough for
// the parallel loop.
TEST(MaskBits, WordPackingMatchesTheBitDefinition) {
  std::mt19937 gen(11);
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{{1, 9}, {3, 21}, {300, 301}, {2, 4}}) {
    Mask mask(rows, cols);
    std::vector<uint8_t> values(mask.flat().size());
    for (size_t i = 0; i < values.size(); ++i) {
      const uint32_t r = gen();
      values[i] = (r & 3) == 0 ? static_cast<uint8_t>(1u << ((r >> 2) % 8)) : (r & 4) ? 1 : 0;
      mask.flat()[i] = values[i];
    }
    const std::vector<uint8_t> bits = mask.pack_bits();
    ASSERT_EQ(static_cast<int64_t>(bits.size()), (rows * cols + 7) / 8);
    for (size_t i = 0; i < values.size(); ++i)
      ASSERT_EQ((bits[i / 8] >> (i % 8)) & 1u, values[i] != 0 ? 1u : 0u)
          << rows << "x" << cols << " entry " << i;
    const Mask back = Mask::unpack_bits(rows, cols, bits);
    for (size_t i = 0; i < values.size(); ++i)
      ASSERT_EQ(back.flat()[i], values[i] != 0 ? 1 : 0) << rows << "x" << cols << " entry " << i;
  }
}

TEST(MaskBits, UnpackErrors) {
  expect_error([] { Mask::unpack_bits(2, 5, std::vector<uint8_t>{0}); }, {"[2, 5]", "needs 2 bytes, got 1"});
  expect_error([] { Mask::unpack_bits(2, 5, std::vector<uint8_t>{0, 0x04}); }, {"[2, 5]", "padding bits"});
  expect_error([] { Mask::from_bits(2, 5, std::vector<uint8_t>{0}); }, {"[2, 5]", "needs 2 bytes, got 1"});
  expect_error([] { Mask::from_bits(2, 5, std::vector<uint8_t>{0, 0x04}); }, {"[2, 5]", "padding bits"});
}

// A random mask of `rows` x `cols` and its packed form.
std::pair<Mask, std::vector<uint8_t>> random_mask(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 gen(seed);
  std::bernoulli_distribution coin(0.4);
  Mask mask(rows, cols);
  for (uint8_t& v : mask.flat()) v = coin(gen) ? 1 : 0;
  return {mask, mask.pack_bits()};
}

// A mask kept packed answers count, row_count, pack_bits and == (against a packed or a byte mask) from its
// bits, without unpacking; copies and moves keep it packed; the shapes cover tails of every alignment to a
// 64-bit word and the parallel popcount (2 x 300001: rows of over 4096 words, starting mid-word).
TEST(MaskBits, PackedMaskCountsAndPacksWithoutUnpacking) {
  for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
           {0, 0}, {1, 1}, {3, 21}, {5, 64}, {7, 65}, {300, 301}, {2, 300001}}) {
    const auto [bytes, bits] = random_mask(rows, cols, static_cast<uint32_t>(rows * 1000 + cols));
    const Mask packed = Mask::from_bits(rows, cols, bits);
    EXPECT_EQ(packed.rows(), rows);
    EXPECT_EQ(packed.cols(), cols);
    EXPECT_EQ(packed.count(), bytes.count()) << rows << "x" << cols;
    for (int64_t r = 0; r < rows; ++r) ASSERT_EQ(packed.row_count(r), bytes.row_count(r)) << "row " << r;
    EXPECT_EQ(packed.pack_bits(), bits);
    EXPECT_EQ(packed.sparsity(), bytes.sparsity());
    const Mask copy = packed;
    Mask moved = Mask::from_bits(rows, cols, bits);
    const Mask target = std::move(moved);
    EXPECT_EQ(copy, packed);
    EXPECT_EQ(packed, bytes);
    EXPECT_EQ(bytes, packed);
    EXPECT_EQ(target.pack_bits(), bits);
    EXPECT_EQ(moved.size(), 0);
    EXPECT_TRUE(packed.packed_only());  // none of the above unpacked it
    EXPECT_TRUE(copy.packed_only() && target.packed_only());
  }
}

// Reading entries unpacks once, to the same entries as unpack_bits, and keeps the packed copy; writing
// an entry drops it, and pack_bits then packs the written entries.
TEST(MaskBits, PackedMaskUnpacksOnReadAndRepacksAfterAWrite) {
  const auto [bytes, bits] = random_mask(37, 53, 9);
  Mask mask = Mask::from_bits(37, 53, bits);
  const Mask& view = mask;
  EXPECT_EQ(view.pruned(3, 7), bytes.pruned(3, 7));
  EXPECT_FALSE(mask.packed_only());
  EXPECT_TRUE(std::ranges::equal(view.flat(), bytes.flat()));
  EXPECT_EQ(mask, bytes);
  EXPECT_EQ(mask.pack_bits(), bits);
  const bool was = view.pruned(36, 52);
  mask.set(36, 52, !was);
  Mask expected = bytes;
  expected.set(36, 52, !was);
  EXPECT_EQ(mask.pack_bits(), expected.pack_bits());
  EXPECT_EQ(mask.count(), expected.count());
  EXPECT_EQ(mask, expected);
  Tensor w({37, 53}, std::vector<float>(37 * 53, 1.0f));
  Mask::from_bits(37, 53, bits).apply(w);
  for (int64_t i = 0; i < 37 * 53; ++i) ASSERT_EQ(w[i], bytes.flat()[static_cast<size_t>(i)] ? 0.0f : 1.0f);
}

// A backend's copy of the packed bits travels with them: copies and moves share it, reading entries keeps
// it, writing an entry drops it (it would be stale), and so does a mask made without one.
TEST(MaskBits, BackendCopyOfTheBitsLivesAsLongAsThePackedBits) {
  struct Tagged : BackendBits {
    int tag = 7;
  };
  const auto [bytes, bits] = random_mask(9, 40, 11);
  auto tagged = std::make_shared<Tagged>();
  const BackendBits* held = tagged.get();
  Mask mask = Mask::from_bits(9, 40, bits, tagged);
  tagged.reset();
  EXPECT_EQ(mask.backend_bits(), held);
  const Mask copy = mask;
  EXPECT_EQ(copy.backend_bits(), held);
  Mask moved = Mask(mask);
  const Mask target = std::move(moved);
  EXPECT_EQ(target.backend_bits(), held);
  EXPECT_EQ(moved.backend_bits(), nullptr);
  EXPECT_EQ(mask.pruned(2, 3), bytes.pruned(2, 3));  // a read keeps the bits and their copy
  EXPECT_EQ(mask.backend_bits(), held);
  EXPECT_EQ(dynamic_cast<const Tagged*>(mask.backend_bits())->tag, 7);
  mask.set(2, 3, !bytes.pruned(2, 3));
  EXPECT_EQ(mask.backend_bits(), nullptr);
  EXPECT_EQ(copy.backend_bits(), held);  // the copy's bits are still its own
  EXPECT_EQ(Mask::from_bits(9, 40, bits).backend_bits(), nullptr);
  EXPECT_EQ(bytes.backend_bits(), nullptr);
}

// packed_bits reads a packed mask's own bits without a copy and packs a byte mask; release_bits moves a
// packed mask's bits out (same bytes, same storage) and leaves an empty mask.
TEST(MaskBits, PackedBitsAreLentOrReleasedWithoutACopy) {
  const auto [bytes, bits] = random_mask(13, 29, 5);
  const Mask packed = Mask::from_bits(13, 29, bits);
  std::vector<uint8_t> scratch;
  const std::span<const uint8_t> lent = packed.packed_bits(scratch);
  EXPECT_TRUE(scratch.empty());
  EXPECT_TRUE(std::ranges::equal(lent, bits));
  EXPECT_EQ(lent.data(), packed.packed_bits(scratch).data());
  EXPECT_TRUE(std::ranges::equal(bytes.packed_bits(scratch), bits));
  EXPECT_EQ(scratch, bits);

  Mask dropped = Mask::from_bits(13, 29, bits);
  const uint8_t* storage = dropped.packed_bits(scratch).data();
  const std::vector<uint8_t> released = std::move(dropped).release_bits();
  EXPECT_EQ(released, bits);
  EXPECT_EQ(released.data(), storage);
  EXPECT_EQ(dropped.size(), 0);
  EXPECT_EQ(Mask(bytes).release_bits(), bits);  // a byte mask is packed
}

// Many threads reading (or each writing its own rows of) one packed mask at once, as the CPU refinements'
// row loops do: each sees the whole mask's entries and the writes all land; a thread counting a row that
// no thread writes, while the others write theirs, counts it right.
TEST(MaskBits, PackedMaskIsUnpackedOnceWhenThreadsReadItAtOnce) {
  const auto [bytes, bits] = random_mask(64, 4096, 3);
  const Mask shared = Mask::from_bits(64, 4096, bits);
  std::vector<int64_t> counts(64, -1);
#pragma omp parallel for num_threads(8) schedule(static, 1)
  for (int64_t r = 0; r < 64; ++r) {
    int64_t total = 0;
    for (uint8_t v : shared.row(r)) total += v;
    counts[static_cast<size_t>(r)] = total;
  }
  for (int64_t r = 0; r < 64; ++r)
    EXPECT_EQ(counts[static_cast<size_t>(r)], bytes.row_count(r)) << "row " << r;
  Mask written = Mask::from_bits(64, 4096, bits);
  std::vector<int64_t> row_zero_counts(64, -1);
#pragma omp parallel for num_threads(8) schedule(static, 1)
  for (int64_t r = 0; r < 64; ++r) {
    if (r % 8 == 0) {
      row_zero_counts[static_cast<size_t>(r)] = written.row_count(0);
    } else {
      written.row(r)[0] = 1;
    }
  }
  for (int64_t r = 0; r < 64; r += 8) EXPECT_EQ(row_zero_counts[static_cast<size_t>(r)], bytes.row_count(0));
  Mask expected = bytes;
  for (int64_t r = 0; r < 64; ++r)
    if (r % 8 != 0) expected.set(r, 0, true);
  EXPECT_EQ(written, expected);
  EXPECT_EQ(written.pack_bits(), expected.pack_bits());
}

// ---- Errors ----

TEST(MaskErrors, SparsityOutOfRange) {
  const Tensor s = random_scores(2, 4, 1, false);
  expect_error([&] { select_mask(s, MaskSpec::row(-0.1), "model.layers.0.self_attn.q_proj"); },
               {"model.layers.0.self_attn.q_proj", "sparsity -0.1 is outside [0, 1)"});
  expect_error([&] { select_mask(s, MaskSpec::layer(1.0), "w"); },
               {"matrix w", "sparsity 1 is outside [0, 1)"});
  expect_error([&] { select_mask(s, MaskSpec::row(std::nan("")), "w"); }, {"matrix w", "outside [0, 1)"});
  expect_error([&] { validate_mask_spec(MaskSpec::layer(1.5), 2, 4, "w"); }, {"sparsity 1.5"});
}

TEST(MaskErrors, BadNmSpecs) {
  const Tensor s = random_scores(2, 12, 1, false);
  expect_error([&] { select_mask(s, MaskSpec::nm(4, 4), "w"); },
               {"matrix w", "4:4", "N must be smaller than M"});
  expect_error([&] { select_mask(s, MaskSpec::nm(5, 2), "w"); }, {"5:2", "N must be smaller than M"});
  expect_error([&] { select_mask(s, MaskSpec::nm(0, 4), "w"); }, {"0:4", "positive"});
  expect_error([&] { select_mask(s, MaskSpec::nm(2, 8), "model.layers.3.mlp.down_proj"); },
               {"model.layers.3.mlp.down_proj", "2:8", "multiple of 8", "it is 12"});
  EXPECT_NO_THROW(validate_mask_spec(MaskSpec::nm(2, 4), 3, 12, "w"));
  EXPECT_NO_THROW(validate_mask_spec(MaskSpec::nm(1, 3), 3, 12, "w"));
}

TEST(MaskErrors, ScoresNotAMatrix) {
  expect_error([] { select_mask(Tensor({8}), MaskSpec::row(0.5), "w"); }, {"matrix w", "[8]"});
}

TEST(MaskErrors, NaNScoreInExactModes) {
  const Tensor s = matrix(2, 4, {1, 2, 3, 4, 5, 6, kNaN, 8});
  for (const MaskSpec& spec : {MaskSpec::row(0.5), MaskSpec::layer(0.5), MaskSpec::nm(2, 4)})
    expect_error([&] { select_mask(s, spec, "model.layers.1.mlp.up_proj"); },
                 {"NaN score in matrix model.layers.1.mlp.up_proj", "row 1, column 2"});
  // Even at sparsity 0 a NaN score is a bug upstream.
  expect_error([&] { select_mask(s, MaskSpec::row(0.0), "w"); }, {"NaN score in matrix w"});
}

TEST(ParseNm, Valid) {
  const NmPattern a = parse_nm("2:4");
  EXPECT_EQ(a.n, 2);
  EXPECT_EQ(a.m, 4);
  const NmPattern b = parse_nm("4:8");
  EXPECT_EQ(b.n, 4);
  EXPECT_EQ(b.m, 8);
  const NmPattern c = parse_nm("1:3");
  EXPECT_EQ(c.n, 1);
  EXPECT_EQ(c.m, 3);
  const MaskSpec spec = MaskSpec::nm(parse_nm("16:32"));
  EXPECT_EQ(spec.kind, MaskSpec::kNM);
  EXPECT_EQ(describe(spec), "16:32");
}

TEST(ParseNm, Malformed) {
  for (const char* text :
       {"2-4", "a:b", "2:", ":4", "", "2:4:8", " 2:4", "2:4 ", "+2:4", "-2:4", "2.0:4", "99999999999:4"})
    expect_error([&] { parse_nm(text); }, {std::string("invalid N:M pattern '") + text + "'", "such as 2:4"});
  expect_error([] { parse_nm("4:2"); }, {"'4:2'", "N (4) must be smaller than M (2)"});
  expect_error([] { parse_nm("4:4"); }, {"'4:4'", "smaller"});
  expect_error([] { parse_nm("0:4"); }, {"'0:4'", "positive"});
}

TEST(Describe, Specs) {
  EXPECT_EQ(describe(MaskSpec::row(0.5)), "row 50%");
  EXPECT_EQ(describe(MaskSpec::layer(0.7)), "layer 70%");
  EXPECT_EQ(describe(MaskSpec::layer(0.6, true)), "layer 60% (compat <= threshold)");
  // Ten significant digits: a target just below 1 is not shown as 100 %, and 0.6 * 100 stays "60".
  EXPECT_EQ(describe(MaskSpec::layer(0.9999999)), "layer 99.99999%");
  EXPECT_EQ(describe(MaskSpec::row(0.6)), "row 60%");
}

}  // namespace
}  // namespace symprune
