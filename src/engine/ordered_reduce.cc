#include "engine/ordered_reduce.h"

#include "core/error.h"

namespace symprune::engine {

std::vector<double> ordered_sum(dist::Communicator& comm, std::span<const double> local, size_t length,
                                int64_t* gathered_bytes) {
  SYMPRUNE_ASSERT(length > 0 && local.size() % length == 0, "{} values are not chunks of {}", local.size(),
                  length);
  std::vector<int64_t> counts(static_cast<size_t>(comm.size()), 0);
  counts[static_cast<size_t>(comm.rank())] = static_cast<int64_t>(local.size() * sizeof(double));
  comm.all_reduce_sum(counts);
  int64_t total_bytes = 0;
  for (int64_t c : counts) total_bytes += c;
  if (gathered_bytes != nullptr) *gathered_bytes = total_bytes;
  std::vector<double> all(static_cast<size_t>(total_bytes) / sizeof(double));
  comm.all_gather_v(std::as_bytes(local), counts, std::as_writable_bytes(std::span<double>(all)));
  std::vector<double> total(length, 0.0);
  for (size_t at = 0; at < all.size(); at += length)
    for (size_t i = 0; i < length; ++i) total[i] += all[at + i];
  return total;
}

OrderedChain::OrderedChain(dist::Communicator& comm, size_t length) : comm_(comm), length_(length) {
  if (comm_.rank() == 0) total_.assign(length_, 0.0);
}

void OrderedChain::add(std::span<const float> partial) {
  SYMPRUNE_ASSERT(partial.size() == length_, "partial of {} values for a chain of {}", partial.size(),
                  length_);
  if (comm_.rank() == 0) {
    for (size_t i = 0; i < length_; ++i) total_[i] += static_cast<double>(partial[i]);
  } else {
    pending_.emplace_back(partial.begin(), partial.end());
  }
}

std::vector<double> OrderedChain::finish() {
  const int rank = comm_.rank(), size = comm_.size();
  if (rank > 0) {
    total_.resize(length_);
    comm_.recv(std::as_writable_bytes(std::span<double>(total_)), rank - 1);
    for (const auto& partial : pending_)
      for (size_t i = 0; i < length_; ++i) total_[i] += static_cast<double>(partial[i]);
    pending_.clear();
  }
  if (rank + 1 < size) comm_.send(std::as_bytes(std::span<const double>(total_)), rank + 1);
  if (size > 1) comm_.broadcast(std::as_writable_bytes(std::span<double>(total_)), size - 1);
  return std::move(total_);
}

}  // namespace symprune::engine
