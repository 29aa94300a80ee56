// Device memory for the CPU emulation of the kernels: host memory, synchronous copies (launches are
// synchronous there too). Fresh allocations are filled with 0xFF bytes, as cudaMalloc gives no zeros.
#include <cstdlib>
#include <cstring>
#include <new>

#include "core/cuda/device_memory.h"
#include "core/cuda/kernels/allocation_ledger.h"
#include "core/error.h"
#include "core/system_memory.h"

namespace symprune::cuda {

namespace {

// Every live allocation, for device_pool_memory (as a pool counts them).
AllocationLedger& ledger() {
  static AllocationLedger allocations;
  return allocations;
}

}  // namespace

void throw_argument_error(const std::string& message) {
  throw Error(message);
}

void* device_allocate(size_t bytes, DeviceStream) {
  void* pointer = std::malloc(bytes == 0 ? 1 : bytes);
  if (pointer == nullptr) fail("emulated CUDA: cannot allocate {} bytes", bytes);
  std::memset(pointer, 0xFF, bytes);
  ledger().add(pointer, static_cast<int64_t>(bytes));
  return pointer;
}

DevicePoolMemory device_pool_memory() {
  return ledger().memory();
}

void reset_device_memory_peak() {
  ledger().reset_peak();
}

// The emulation has no pool: its allocations are always counted by hand.
void use_plain_device_allocations(bool) {}
bool plain_device_allocations() {
  return true;
}

void device_memory_info(int64_t* free_bytes, int64_t* total_bytes) {
  const auto available = available_memory_bytes();
  *free_bytes = available ? static_cast<int64_t>(*available) : int64_t{1} << 40;
  *total_bytes = *free_bytes;
}

void device_free(void* pointer) noexcept {
  if (pointer == nullptr) return;
  ledger().remove(pointer);
  std::free(pointer);
}
void device_free_on(int, void* pointer) noexcept {
  device_free(pointer);  // one device
}

// Streams are the default stream (everything is synchronous), pinned memory is host memory and there is
// one device.
DeviceStream create_stream() {
  return {};
}
void destroy_stream(DeviceStream) noexcept {}
void* pinned_allocate(size_t bytes) {
  void* pointer = std::malloc(bytes == 0 ? 1 : bytes);
  if (pointer == nullptr) fail("emulated CUDA: cannot allocate {} bytes of host memory", bytes);
  return pointer;
}
void pinned_free(void* pointer) noexcept {
  std::free(pointer);
}
int current_device() {
  return 0;
}
void set_current_device(int) {}

void copy_to_device(void* device_destination, const void* host_source, size_t bytes, DeviceStream) {
  if (bytes > 0) std::memcpy(device_destination, host_source, bytes);
}

void copy_to_host(void* host_destination, const void* device_source, size_t bytes, DeviceStream) {
  if (bytes > 0) std::memcpy(host_destination, device_source, bytes);
}

void copy_on_device(void* device_destination, const void* device_source, size_t bytes, DeviceStream) {
  if (bytes > 0) std::memmove(device_destination, device_source, bytes);
}

void zero_device(void* device_destination, size_t bytes, DeviceStream) {
  if (bytes > 0) std::memset(device_destination, 0, bytes);
}

void synchronize(DeviceStream) {}

}  // namespace symprune::cuda
