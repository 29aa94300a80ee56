#pragma once
// RAII device memory for the host-pointer entry points of src/core/cuda (internal to this folder).
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/cuda/cuda_check.h"

namespace symprune::cuda::detail {

template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(int64_t count) : count_(count) {
    if (count_ > 0) SYMPRUNE_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data_), bytes()));
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) (void)cudaFree(data_);  // never throw from a destructor
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() { return data_; }
  size_t bytes() const { return static_cast<size_t>(count_) * sizeof(T); }

  void upload(const T* host) {
    if (count_ > 0) SYMPRUNE_CUDA_CHECK(cudaMemcpy(data_, host, bytes(), cudaMemcpyHostToDevice));
  }
  void download(T* host) const {
    if (count_ > 0) SYMPRUNE_CUDA_CHECK(cudaMemcpy(host, data_, bytes(), cudaMemcpyDeviceToHost));
  }

 private:
  int64_t count_ = 0;
  T* data_ = nullptr;
};

}  // namespace symprune::cuda::detail
