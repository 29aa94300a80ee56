// Device allocations counted by hand (see allocation_ledger.h).
#include "core/cuda/kernels/allocation_ledger.h"

#include <algorithm>

namespace symprune::cuda {

void AllocationLedger::add(const void* pointer, int64_t bytes) {
  const std::lock_guard lock(mutex_);
  bytes_.emplace(pointer, bytes);
  held_ += bytes;
  peak_ = std::max(peak_, held_);
}

bool AllocationLedger::remove(const void* pointer) {
  const std::lock_guard lock(mutex_);
  const auto it = bytes_.find(pointer);
  if (it == bytes_.end()) return false;
  held_ -= it->second;
  bytes_.erase(it);
  return true;
}

DevicePoolMemory AllocationLedger::memory() const {
  const std::lock_guard lock(mutex_);
  return {held_, held_, peak_, peak_};
}

void AllocationLedger::reset_peak() {
  const std::lock_guard lock(mutex_);
  peak_ = held_;
}

}  // namespace symprune::cuda
