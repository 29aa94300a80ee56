// download_bytes (device_memory.h), written on the interface's copy and pinned-memory functions only, so
// that the emulation runs the same staging loop as the device.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <vector>

#include "core/cuda/device_memory.h"

namespace symprune::cuda {

std::vector<uint8_t> download_bytes(const void* device_source, size_t bytes) {
  constexpr size_t kStagingBytes = size_t{8} << 20;
  static std::mutex mutex;
  static void* staging = nullptr;  // kept for the process's life
  std::vector<uint8_t> host;
  host.reserve(bytes);
  if (bytes == 0) return host;
  const std::lock_guard lock(mutex);
  if (staging == nullptr) staging = pinned_allocate(kStagingBytes);
  const auto* source = static_cast<const uint8_t*>(device_source);
  const auto* staged = static_cast<const uint8_t*>(staging);
  for (size_t offset = 0; offset < bytes; offset += kStagingBytes) {
    const size_t chunk = std::min(kStagingBytes, bytes - offset);
    copy_to_host(staging, source + offset, chunk);  // synchronous: the staging buffer is read next
    host.insert(host.end(), staged, staged + chunk);
  }
  return host;
}

}  // namespace symprune::cuda
