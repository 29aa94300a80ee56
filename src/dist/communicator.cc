#include "dist/communicator.h"

#include "core/error.h"

namespace symprune::dist {

std::vector<size_t> gather_offsets(std::span<const int64_t> counts, int size, int rank, size_t local_bytes,
                                   size_t gathered_bytes) {
  SYMPRUNE_CHECK(counts.size() == static_cast<size_t>(size),
                 "all_gather_v: {} counts given for a communicator of size {}", counts.size(), size);
  std::vector<size_t> offsets(counts.size() + 1, 0);
  for (size_t r = 0; r < counts.size(); ++r) {
    SYMPRUNE_CHECK(counts[r] >= 0, "all_gather_v: counts[{}] is negative ({})", r, counts[r]);
    offsets[r + 1] = offsets[r] + static_cast<size_t>(counts[r]);
  }
  SYMPRUNE_CHECK(static_cast<size_t>(counts[static_cast<size_t>(rank)]) == local_bytes,
                 "all_gather_v: rank {} contributes {} bytes but counts[{}] is {}", rank, local_bytes, rank,
                 counts[static_cast<size_t>(rank)]);
  SYMPRUNE_CHECK(gathered_bytes == offsets.back(), "all_gather_v: output has {} bytes, expected {}",
                 gathered_bytes, offsets.back());
  return offsets;
}

}  // namespace symprune::dist
