#pragma once
// Accelerator probing, implemented by src/core/cuda (SYMPRUNE_WITH_CUDA=ON) or src/core/no_accel.
// Never throws: any driver/runtime error (no driver, no device) reads as zero devices, so the
// binaries start on machines without a GPU.
#include <string>
#include <string_view>
#include <vector>

namespace symprune {
class Backend;
}

namespace symprune::accel {

struct DeviceInfo {
  int index = 0;
  std::string name;
  size_t total_memory_bytes = 0;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  // Stream-ordered memory pools (cudaMallocAsync); without them allocations are plain cudaMalloc/cudaFree.
  bool memory_pools = false;
};

bool compiled_with_cuda();
int device_count();
std::vector<DeviceInfo> devices();
// Why there are no devices (driver missing, ...) or empty; for `symprune info`.
std::string unavailable_reason();

// The CUDA device of a node-local rank: local_rank % device_count(), so ranks share devices when there are
// fewer devices than ranks (0 without devices). The device the backend and the NCCL communicator use.
inline int device_for_local_rank(int local_rank) {
  const int count = device_count();
  return count > 0 ? local_rank % count : 0;
}

// How many of a node's local_size ranks use local_rank's device (device_for_local_rank): they share its
// memory (1 without devices).
inline int ranks_sharing_device(int local_rank, int local_size) {
  const int count = device_count();
  if (count <= 0) return 1;
  const int device = local_rank % count;  // ranks device, device + count, ... below local_size
  return device < local_size ? (local_size - device + count - 1) / count : 1;
}

// The backend for --device: "cpu"; "cuda" (device_for_local_rank(local_rank) is made current; an
// Error says why there is none); "auto" (cuda when a device is present, else cpu). Other names: Error.
Backend& backend_for_device(std::string_view device, int local_rank = 0);

}  // namespace symprune::accel
