#include "dist/communicator.h"

#include <algorithm>

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

std::optional<RankFailure> first_failure(Communicator& comm, int64_t status, const std::string& message) {
  std::vector<int64_t> statuses(static_cast<size_t>(comm.size()), 0);
  statuses[static_cast<size_t>(comm.rank())] = status;
  comm.all_reduce_sum(statuses);
  const auto failed = std::find_if(statuses.begin(), statuses.end(), [](int64_t s) { return s != 0; });
  if (failed == statuses.end()) return std::nullopt;
  RankFailure failure{static_cast<int>(failed - statuses.begin()), *failed, message};
  int64_t length = static_cast<int64_t>(message.size());
  comm.broadcast(std::as_writable_bytes(std::span<int64_t>(&length, 1)), failure.rank);
  failure.message.resize(static_cast<size_t>(length));
  comm.broadcast(std::as_writable_bytes(std::span<char>(failure.message.data(), failure.message.size())),
                 failure.rank);
  return failure;
}

}  // namespace symprune::dist
