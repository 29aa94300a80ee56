#pragma once
// Contiguous, balanced partitions of index ranges over ranks (DESIGN.md §4): part p of `total` items over
// `parts` is [total·p/parts, total·(p+1)/parts), so sizes differ by at most one and every part is
// contiguous, whatever the numbers (parts may exceed total: some parts are then empty).
#include <cstdint>

namespace symprune::dist {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
  bool operator==(const Range&) const = default;
};

// total · (part + 1) overflows int64 for totals past 2^63 / parts: 128-bit products (a GCC/Clang
// extension, marked so that -Wpedantic accepts it).
__extension__ using PartitionWide = __int128;

inline Range partition(int64_t total, int parts, int part) {
  const auto p = static_cast<PartitionWide>(part), n = static_cast<PartitionWide>(parts),
             t = static_cast<PartitionWide>(total);
  return {static_cast<int64_t>(t * p / n), static_cast<int64_t>(t * (p + 1) / n)};
}

}  // namespace symprune::dist
