// Device memory and streams with the CUDA runtime (see device_memory.h).
#include "core/cuda/device_memory.h"

#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"
#include "core/error.h"

namespace symprune::cuda {
namespace {

cudaStream_t native(DeviceStream stream) {
  return static_cast<cudaStream_t>(stream.handle);
}

}  // namespace

void throw_argument_error(const std::string& message) {
  throw Error(message);
}

void* device_allocate(size_t bytes) {
  void* pointer = nullptr;
  const cudaError_t status = cudaMalloc(&pointer, bytes);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    (void)cudaGetLastError();
    fail("CUDA: cannot allocate {:.1f} MiB of device memory ({:.1f} MiB free of {:.1f} MiB): {}",
         static_cast<double>(bytes) / (1 << 20), static_cast<double>(free_bytes) / (1 << 20),
         static_cast<double>(total_bytes) / (1 << 20), cudaGetErrorString(status));
  }
  return pointer;
}

void device_free(void* pointer) noexcept {
  if (pointer != nullptr) (void)cudaFree(pointer);
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

void zero_device(void* device_destination, size_t bytes, DeviceStream stream) {
  SYMPRUNE_CUDA_CHECK(cudaMemsetAsync(device_destination, 0, bytes, native(stream)));
}

void synchronize(DeviceStream stream) {
  SYMPRUNE_CUDA_CHECK(cudaStreamSynchronize(native(stream)));
}

}  // namespace symprune::cuda
