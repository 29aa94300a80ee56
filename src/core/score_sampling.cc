// stochria's counter-based sampler: τ distinct indices per row/column, independent of threads.
#include "core/score_sampling.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "core/hashing.h"
#include "core/scores.h"

namespace symprune {
namespace {

__extension__ typedef unsigned __int128 Uint128;  // GCC/Clang extension, silences -Wpedantic

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

}  // namespace

SampleKey::SampleKey(uint64_t seed, int64_t block, std::string_view matrix_name, bool column) {
  // Each key part goes through the SplitMix64 finalizer so that nearby seeds/blocks/indices decorrelate.
  uint64_t key = splitmix64(seed + kGolden);
  key = splitmix64(key ^ (static_cast<uint64_t>(block) + 2 * kGolden));
  key = splitmix64(key ^ fnv1a64(matrix_name));
  key = splitmix64(key ^ (column ? 0x636f6c756d6eULL : 0x726f77ULL));  // "column" / "row"
  base_ = key;
}

uint64_t SampleKey::stream(int64_t index) const {
  return splitmix64(base_ ^ splitmix64(static_cast<uint64_t>(index) + kGolden));
}

void sample_without_replacement(uint64_t stream_key, int64_t population, int64_t tau,
                                std::vector<uint8_t>& marks, std::vector<int64_t>& out) {
  SYMPRUNE_ASSERT(tau >= 0 && tau <= population, "tau {} of population {}", tau, population);
  if (static_cast<int64_t>(marks.size()) < population) marks.assign(static_cast<size_t>(population), 0);
  out.clear();
  uint64_t counter = 0;
  // SplitMix64 stream: output k = splitmix64(key + (k+1)·golden).
  auto next = [&] { return splitmix64(stream_key + (++counter) * kGolden); };
  // Uniform integer in [0, range) by Lemire's multiply-shift with rejection (exactly unbiased).
  auto bounded = [&](uint64_t range) {
    Uint128 product = static_cast<Uint128>(next()) * range;
    uint64_t low = static_cast<uint64_t>(product);
    if (low < range) {
      const uint64_t threshold = (0 - range) % range;
      while (low < threshold) {
        product = static_cast<Uint128>(next()) * range;
        low = static_cast<uint64_t>(product);
      }
    }
    return static_cast<int64_t>(product >> 64);
  };
  // Floyd's algorithm: after step j the set is a uniform τ'-subset of [0, j]; j itself is never marked
  // before its step, so a collision inserts j instead.
  for (int64_t j = population - tau; j < population; ++j) {
    const int64_t t = bounded(static_cast<uint64_t>(j) + 1);
    const int64_t pick = marks[static_cast<size_t>(t)] ? j : t;
    marks[static_cast<size_t>(pick)] = 1;
    out.push_back(pick);
  }
  for (int64_t index : out) marks[static_cast<size_t>(index)] = 0;
  // Ascending order: sums run in index order, like the full norms (so a sample of every index, β = 1 on a
  // square matrix where τ = min(m, n) covers both sides, reproduces ria exactly).
  std::sort(out.begin(), out.end());
}

std::vector<int64_t> stochria_sample(uint64_t seed, int64_t block, std::string_view matrix_name, bool column,
                                     int64_t index, int64_t population, int64_t tau) {
  SYMPRUNE_CHECK(population > 0 && tau >= 1 && tau <= population,
                 "stochria sample of {} indices from a population of {}", tau, population);
  const SampleKey key(seed, block, matrix_name, column);
  std::vector<uint8_t> marks;
  std::vector<int64_t> out;
  sample_without_replacement(key.stream(index), population, tau, marks, out);
  return out;
}

void visit_stochria_samples(const ScoreOptions& options, int64_t m, int64_t n, bool columns,
                            int64_t max_bytes, const StochriaVisitor& visit) {
  // Indices are kept in 32 bits (half the bytes of int64 in host memory and on the bus).
  SYMPRUNE_CHECK(m <= INT32_MAX && n <= INT32_MAX,
                 "{}: stochria samples a weight of at most 2^31 - 1 rows and columns, got [{}, {}]",
                 options.matrix_name, m, n);
  const int64_t tau = stochria_tau(options.beta, m, n);
  const int64_t count = columns ? n : m, population = columns ? m : n;
  const int64_t per_range = std::max<int64_t>(1, max_bytes / (tau * static_cast<int64_t>(sizeof(int32_t))));
  const SampleKey key(options.seed, options.block, options.matrix_name, columns);
  std::vector<int32_t> picks;
  for (int64_t begin = 0; begin < count; begin += per_range) {
    const int64_t end = std::min(count, begin + per_range);
    picks.resize(static_cast<size_t>((end - begin) * tau));
    // Each index's stream is its own (counter-based): the picks do not depend on the thread count.
#pragma omp parallel if ((end - begin) * tau >= (int64_t{1} << 16))
    {
      std::vector<uint8_t> marks;
      std::vector<int64_t> picked;
#pragma omp for schedule(static)
      for (int64_t i = begin; i < end; ++i) {
        sample_without_replacement(key.stream(i), population, tau, marks, picked);
        int32_t* out = picks.data() + (i - begin) * tau;
        for (int64_t k = 0; k < tau; ++k) out[k] = static_cast<int32_t>(picked[static_cast<size_t>(k)]);
      }
    }
    visit(begin, end, picks);
  }
}

int64_t stochria_tau(double beta, int64_t m, int64_t n) {
  const double product = std::floor(beta * static_cast<double>(std::min(m, n)));
  return std::max<int64_t>(1, std::min<int64_t>(static_cast<int64_t>(product), std::min(m, n)));
}

}  // namespace symprune
