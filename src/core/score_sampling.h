#pragma once
// Internal helpers of stochria's sampler (public entry points are in core/scores.h).
#include <cstdint>
#include <string_view>
#include <vector>

namespace symprune {

// The key of one matrix side: (seed, block, FNV-1a(matrix name), row or column).
class SampleKey {
 public:
  SampleKey(uint64_t seed, int64_t block, std::string_view matrix_name, bool column);
  // The key of row/column `index`'s random stream.
  uint64_t stream(int64_t index) const;

 private:
  uint64_t base_ = 0;
};

// τ distinct indices of [0, population), sorted, from the SplitMix64 stream `stream_key` (Floyd's
// algorithm). `marks` is caller scratch (all zero on entry and on return); `out` receives the indices.
void sample_without_replacement(uint64_t stream_key, int64_t population, int64_t tau,
                                std::vector<uint8_t>& marks, std::vector<int64_t>& out);

}  // namespace symprune
