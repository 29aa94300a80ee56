// Device memory and streams with the CUDA runtime (see device_memory.h).
#include "core/cuda/device_memory.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "core/cuda/cuda_check.h"
#include "core/cuda/kernels/allocation_ledger.h"
#include "core/error.h"

namespace symprune::cuda {
namespace {

cudaStream_t native(DeviceStream stream) {
  return static_cast<cudaStream_t>(stream.handle);
}

// The current device's default pool, from which device_allocate takes its memory.
cudaMemPool_t default_pool() {
  int device = 0;
  cudaMemPool_t pool = nullptr;
  SYMPRUNE_CUDA_CHECK(cudaGetDevice(&device));
  SYMPRUNE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  return pool;
}

// Allocations are stream-ordered (cudaMallocAsync on the default stream) from the device's default pool,
// told to keep freed memory: the kernels' entry points allocate small scratch arrays per call, and plain
// cudaMalloc/cudaFree cost about a millisecond each (cudaFree also synchronizes the device).
void keep_pool_memory() {
  static const bool done = [] {
    uint64_t threshold = UINT64_MAX;
    SYMPRUNE_CUDA_CHECK(cudaMemPoolSetAttribute(default_pool(), cudaMemPoolAttrReleaseThreshold, &threshold));
    return true;
  }();
  (void)done;
}

// Without pools (cudaMallocAsync would fail with cudaErrorNotSupported), cudaMalloc and cudaFree, whose
// allocations this ledger counts. -1: not decided yet (the first allocation asks the current device).
std::atomic<int> plain_mode{-1};
AllocationLedger& plain_allocations() {
  static AllocationLedger ledger;
  return ledger;
}

[[noreturn]] void allocation_failed(size_t bytes, cudaError_t status) {
  (void)cudaGetLastError();
  size_t free_bytes = 0, total_bytes = 0;
  (void)cudaMemGetInfo(&free_bytes, &total_bytes);
  (void)cudaGetLastError();
  fail("CUDA: cannot allocate {:.1f} MiB of device memory ({:.1f} MiB free of {:.1f} MiB): {}",
       static_cast<double>(bytes) / (1 << 20), static_cast<double>(free_bytes) / (1 << 20),
       static_cast<double>(total_bytes) / (1 << 20), cudaGetErrorString(status));
}

}  // namespace

bool plain_device_allocations() {
  int mode = plain_mode.load();
  if (mode < 0) {
    int device = 0, pools = 0;
    SYMPRUNE_CUDA_CHECK(cudaGetDevice(&device));
    SYMPRUNE_CUDA_CHECK(cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, device));
    plain_mode.compare_exchange_strong(mode, pools != 0 ? 0 : 1);
    mode = plain_mode.load();
  }
  return mode == 1;
}

void throw_argument_error(const std::string& message) {
  throw Error(message);
}

void* device_allocate(size_t bytes, DeviceStream stream) {
  void* pointer = nullptr;
  if (plain_device_allocations()) {
    const cudaError_t status = cudaMalloc(&pointer, bytes);
    if (status != cudaSuccess) allocation_failed(bytes, status);
    plain_allocations().add(pointer, static_cast<int64_t>(bytes));
    return pointer;
  }
  keep_pool_memory();
  const cudaError_t status = cudaMallocAsync(&pointer, bytes, native(stream));
  if (status != cudaSuccess) allocation_failed(bytes, status);
  return pointer;
}

void use_plain_device_allocations(bool plain) {
  plain_mode.store(plain ? 1 : -1);  // -1: the next allocation asks the device again
}

void device_memory_info(int64_t* free_bytes, int64_t* total_bytes) {
  size_t free_memory = 0, total_memory = 0;
  SYMPRUNE_CUDA_CHECK(cudaMemGetInfo(&free_memory, &total_memory));
  *free_bytes = static_cast<int64_t>(free_memory);
  *total_bytes = static_cast<int64_t>(total_memory);
}

DevicePoolMemory device_pool_memory() {
  if (plain_device_allocations()) return plain_allocations().memory();
  const cudaMemPool_t pool = default_pool();
  const auto read = [pool](cudaMemPoolAttr attribute) {
    uint64_t value = 0;
    SYMPRUNE_CUDA_CHECK(cudaMemPoolGetAttribute(pool, attribute, &value));
    return static_cast<int64_t>(value);
  };
  return {read(cudaMemPoolAttrUsedMemCurrent), read(cudaMemPoolAttrReservedMemCurrent),
          read(cudaMemPoolAttrUsedMemHigh), read(cudaMemPoolAttrReservedMemHigh)};
}

void reset_device_memory_peak() {
  if (plain_device_allocations()) {
    plain_allocations().reset_peak();
    return;
  }
  const cudaMemPool_t pool = default_pool();
  uint64_t zero = 0;  // the only value these may be set to: they then follow what is held again
  SYMPRUNE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero));
  SYMPRUNE_CUDA_CHECK(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero));
}

void device_free(void* pointer) noexcept {
  if (pointer == nullptr) return;
  // cudaFree waits for the whole device; a pool's free is ordered after the work already queued on the
  // default stream, which every kernel entry point uses.
  if (plain_allocations().remove(pointer))
    (void)cudaFree(pointer);
  else
    (void)cudaFreeAsync(pointer, nullptr);
}

void device_free_on(int device, void* pointer) noexcept {
  if (pointer == nullptr) return;
  int previous = -1;
  if (cudaGetDevice(&previous) == cudaSuccess && previous != device) (void)cudaSetDevice(device);
  device_free(pointer);
  if (previous >= 0 && previous != device) (void)cudaSetDevice(previous);
}

DeviceStream create_stream() {
  cudaStream_t stream = nullptr;
  SYMPRUNE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  return DeviceStream{stream};
}

void destroy_stream(DeviceStream stream) noexcept {
  if (stream.handle != nullptr) (void)cudaStreamDestroy(native(stream));
}

void* pinned_allocate(size_t bytes) {
  void* pointer = nullptr;
  SYMPRUNE_CUDA_CHECK(cudaMallocHost(&pointer, bytes));
  return pointer;
}

void pinned_free(void* pointer) noexcept {
  if (pointer != nullptr) (void)cudaFreeHost(pointer);
}

int current_device() {
  int device = 0;
  SYMPRUNE_CUDA_CHECK(cudaGetDevice(&device));
  return device;
}

void set_current_device(int device) {
  SYMPRUNE_CUDA_CHECK(cudaSetDevice(device));
}

void copy_to_device(void* device_destination, const void* host_source, size_t bytes, DeviceStream stream) {
  SYMPRUNE_CUDA_CHECK(
      cudaMemcpyAsync(device_destination, host_source, bytes, cudaMemcpyHostToDevice, native(stream)));
}

void copy_to_host(void* host_destination, const void* device_source, size_t bytes, DeviceStream stream) {
  SYMPRUNE_CUDA_CHECK(
      cudaMemcpyAsync(host_destination, device_source, bytes, cudaMemcpyDeviceToHost, native(stream)));
  // The host reads the destination next: pageable copies are synchronous only up to staging.
  SYMPRUNE_CUDA_CHECK(cudaStreamSynchronize(native(stream)));
}

void copy_on_device(void* device_destination, const void* device_source, size_t bytes, DeviceStream stream) {
  SYMPRUNE_CUDA_CHECK(
      cudaMemcpyAsync(device_destination, device_source, bytes, cudaMemcpyDeviceToDevice, native(stream)));
}

void zero_device(void* device_destination, size_t bytes, DeviceStream stream) {
  SYMPRUNE_CUDA_CHECK(cudaMemsetAsync(device_destination, 0, bytes, native(stream)));
}

void synchronize(DeviceStream stream) {
  SYMPRUNE_CUDA_CHECK(cudaStreamSynchronize(native(stream)));
}

}  // namespace symprune::cuda
