// PythonRandom against CPython 3.11's `random` module. Every constant below was printed by the
// project venv's Python (e.g. `random.seed(0); [random.getrandbits(32) for _ in range(6)]`).
#include "io/python_random.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace symprune::io {
namespace {

std::vector<uint64_t> u32s(PythonRandom& rng, int n) {
  std::vector<uint64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(rng.getrandbits(32));
  return out;
}

std::vector<int64_t> randints(uint64_t seed, int64_t a, int64_t b, int n) {
  PythonRandom rng(seed);
  std::vector<int64_t> out;
  for (int i = 0; i < n; ++i) out.push_back(rng.randint(a, b));
  return out;
}

TEST(PythonRandom, GetrandbitsThirtyTwoMatchesCPythonForOneAndTwoWordSeeds) {
  struct Case {
    uint64_t seed;
    std::vector<uint64_t> expected;
  };
  const std::vector<Case> cases = {
      {0, {3626764237u, 1654615998u, 3255389356u, 3823568514u, 1806341205u, 173879092u}},
      {1, {577090037u, 2444712010u, 3639700191u, 3445702192u, 3280387012u, 271041745u}},
      {42, {2746317213u, 478163327u, 107420369u, 3184935163u, 1181241943u, 1051802512u}},
      // random.seed(2**32 + 7): key [7, 1].
      {4294967303ull, {968553300u, 3287823873u, 1540179448u, 1473205320u, 3432680139u, 267413182u}},
      // random.seed(2**64 - 1): key [0xffffffff, 0xffffffff].
      {18446744073709551615ull, {93740670u, 1068495656u, 1452108352u, 2657516307u, 910393425u, 1958779474u}},
  };
  for (const auto& c : cases) {
    PythonRandom rng(c.seed);
    EXPECT_EQ(u32s(rng, 6), c.expected) << "seed " << c.seed;
  }
}

TEST(PythonRandom, NextU32EqualsGetrandbits32AndCrossesStateRegenerations) {
  PythonRandom a(0), b(0);
  std::vector<uint32_t> values;
  for (int i = 0; i < 2000; ++i) {
    values.push_back(a.next_u32());
    ASSERT_EQ(values.back(), b.getrandbits(32));
  }
  // random.seed(0); x = [random.getrandbits(32) for _ in range(2000)]; x[623], x[624], x[1247], x[1999]
  EXPECT_EQ(values[623], 2390040247u);
  EXPECT_EQ(values[624], 2229104038u);
  EXPECT_EQ(values[1247], 577331751u);
  EXPECT_EQ(values[1999], 3908016617u);
}

TEST(PythonRandom, ReseedingRestartsTheStream) {
  PythonRandom rng(42);
  u32s(rng, 700);
  rng.seed_int(0);
  EXPECT_EQ(rng.next_u32(), 3626764237u);
}

TEST(PythonRandom, RandintSmallBound) {
  EXPECT_EQ(randints(0, 0, 355, 12),
            (std::vector<int64_t>{197, 215, 20, 132, 261, 248, 207, 155, 244, 183, 298, 111}));
  EXPECT_EQ(randints(1, 0, 355, 12),
            (std::vector<int64_t>{68, 291, 32, 130, 60, 253, 230, 241, 333, 194, 107, 48}));
  EXPECT_EQ(randints(42, 0, 355, 12),
            (std::vector<int64_t>{327, 57, 12, 140, 125, 114, 71, 52, 346, 279, 44, 302}));
}

TEST(PythonRandom, RandintBoundTwoToThe31NeedsThirtyTwoBits) {
  EXPECT_EQ(randints(0, 0, 1ll << 31, 6),
            (std::vector<int64_t>{1654615998, 1806341205, 173879092, 1112038970, 2087043557, 1739178872}));
  EXPECT_EQ(randints(1, 0, 1ll << 31, 6),
            (std::vector<int64_t>{577090037, 271041745, 1095513148, 506456969, 2127877499, 1930549411}));
  EXPECT_EQ(randints(42, 0, 1ll << 31, 6),
            (std::vector<int64_t>{478163327, 107420369, 1181241943, 1051802512, 958682846, 599310825}));
}

TEST(PythonRandom, RandintAboveTwoToThe32UsesMultiWordGetrandbits) {
  const int64_t b = (1ll << 32) + 5;
  EXPECT_EQ(randints(0, 0, b, 6),
            (std::vector<int64_t>{3626764237, 1806341205, 2195908194, 2046968324, 3900315155, 2167613558}));
  EXPECT_EQ(randints(1, 0, b, 6),
            (std::vector<int64_t>{3280387012, 1095513148, 1930549411, 2798570523, 3387541014, 403123852}));
  EXPECT_EQ(randints(42, 0, b, 6),
            (std::vector<int64_t>{2746317213, 1181241943, 958682846, 3163119785, 1812140441, 127978094}));
}

TEST(PythonRandom, RandintNegativeLowerBound) {
  EXPECT_EQ(randints(0, -5, 5, 10), (std::vector<int64_t>{1, 1, -5, -1, 3, 2, 1, -1, 2, 0}));
  EXPECT_EQ(randints(1, -5, 5, 10), (std::vector<int64_t>{-3, 4, -4, -1, -4, 2, 2, 2, 5, 1}));
  EXPECT_EQ(randints(42, -5, 5, 10), (std::vector<int64_t>{5, -4, -5, -1, -2, -2, -3, -4, 5, 3}));
}

TEST(PythonRandom, GetrandbitsOfVariousWidths) {
  // [random.getrandbits(k) for k in (64, 40, 1, 0, 33, 63)]; getrandbits(0) draws nothing.
  struct Case {
    uint64_t seed;
    std::vector<uint64_t> expected;
  };
  const std::vector<Case> cases = {
      {0, {7106521602475165645ull, 978212965548ull, 0, 0, 173879092ull, 4715676943270851834ull}},
      {1, {10499958131665514997ull, 884107995871ull, 1, 0, 271041745ull, 4569582132408609673ull}},
      {42, {2053695854357871005ull, 811856239313ull, 0, 0, 1051802512ull, 6792748013404602857ull}},
  };
  for (const auto& c : cases) {
    PythonRandom rng(c.seed);
    std::vector<uint64_t> got;
    for (int k : {64, 40, 1, 0, 33, 63}) got.push_back(rng.getrandbits(k));
    EXPECT_EQ(got, c.expected) << "seed " << c.seed;
  }
}

TEST(PythonRandom, RandomDoublesAreBitExact) {
  struct Case {
    uint64_t seed;
    std::vector<double> expected;
  };
  const std::vector<Case> cases = {
      {0, {0.8444218515250481, 0.7579544029403025, 0.420571580830845, 0.25891675029296335}},
      {1, {0.13436424411240122, 0.8474337369372327, 0.763774618976614, 0.2550690257394217}},
      {42, {0.6394267984578837, 0.025010755222666936, 0.27502931836911926, 0.22321073814882275}},
  };
  for (const auto& c : cases) {
    PythonRandom rng(c.seed);
    for (double expected : c.expected) EXPECT_EQ(rng.random(), expected) << "seed " << c.seed;
  }
}

TEST(PythonRandom, MixedCallsShareOneStream) {
  // random.seed(0); randint(0, 999), random(), randint(0, 2**40), getrandbits(7), randint(10, 10)
  PythonRandom rng(0);
  EXPECT_EQ(rng.randint(0, 999), 864);
  EXPECT_EQ(rng.random(), 0.3852453064766108);
  EXPECT_EQ(rng.randint(0, 1ll << 40), 927241537154);
  EXPECT_EQ(rng.getrandbits(7), 5u);
  EXPECT_EQ(rng.randint(10, 10), 10);
}

TEST(PythonRandom, RandbelowOfOneStillConsumesADraw) {
  // CPython's _randbelow(1) calls getrandbits(1) until it returns 0, so the stream advances.
  PythonRandom a(0), b(0);
  EXPECT_EQ(a.randbelow(1), 0u);
  b.next_u32();  // seed 0's first word is odd (3626764237), so getrandbits(1)=1 and is rejected once
  b.next_u32();
  EXPECT_EQ(a.next_u32(), b.next_u32());
}

}  // namespace
}  // namespace symprune::io
