#pragma once
// Host-only header: the live device allocations counted by hand, where no stream-ordered pool counts them
// (the CPU emulation; a device without memory pools, whose memory comes from cudaMalloc). It answers
// device_pool_memory as a pool would: reserved = used, since nothing freed is kept.
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "core/cuda/device_memory.h"

namespace symprune::cuda {

class AllocationLedger {
 public:
  void add(const void* pointer, int64_t bytes);
  // Whether `pointer` was counted here (and is no longer): device_free tells its allocations apart by it.
  bool remove(const void* pointer);
  DevicePoolMemory memory() const;
  // The peak starts again from what is held now.
  void reset_peak();

 private:
  mutable std::mutex mutex_;
  std::unordered_map<const void*, int64_t> bytes_;
  int64_t held_ = 0, peak_ = 0;
};

}  // namespace symprune::cuda
