#pragma once
// A dense row-major tensor, in host memory or in a device backend's memory (TensorStorage). Host tensors
// are fp32 (storage dtypes of files are converted on load, core/dtype.h); a device tensor is fp32 or, for
// a run in lower precision (--dtype), bf16/fp16 (dtype()), which only the device backend's ops read.
// A device tensor has a shape and a device pointer only: its host accessors (data(), values(), row(),
// operator[]) see no elements (data() is null), so host code given one fails at once instead of reading
// device memory; backends reach its memory through device_data() (fp32) or device_bytes().
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace symprune {

int64_t shape_numel(const std::vector<int64_t>& shape);  // overflow-checked

// Memory a device backend owns for a tensor (the tensor keeps it alive; copies share it).
class TensorStorage {
 public:
  virtual ~TensorStorage() = default;
  virtual void* bytes() = 0;  // a device pointer
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::vector<int64_t> shape);  // zero-filled
  Tensor(std::vector<int64_t> shape, std::vector<float> values);

  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int axis) const;  // negative axis counts from the end
  int64_t numel() const { return storage_ ? shape_numel(shape_) : static_cast<int64_t>(data_.size()); }
  bool empty() const { return numel() == 0; }

  // A tensor of `shape` with elements of `dtype` (a weight dtype) in a device backend's memory.
  static Tensor in_device_memory(std::vector<int64_t> shape, std::shared_ptr<TensorStorage> storage,
                                 DType dtype = DType::kF32);
  bool on_device() const { return storage_ != nullptr; }
  // The element dtype: kF32 for every host tensor.
  DType dtype() const { return dtype_; }
  // The device backend's storage object (null for a host tensor), for state the backend keeps with it.
  TensorStorage* storage() const { return storage_.get(); }
  void* device_bytes() { return storage_ ? storage_->bytes() : nullptr; }
  const void* device_bytes() const { return storage_ ? storage_->bytes() : nullptr; }
  // The memory of an fp32 device tensor (null for a host one); asserts the dtype.
  float* device_data();
  const float* device_data() const;

  float* data() { return data_.data(); }
  const float* data() const { return data_.data(); }
  std::span<float> values() { return data_; }
  std::span<const float> values() const { return data_; }
  float& operator[](int64_t i) { return data_[static_cast<size_t>(i)]; }
  float operator[](int64_t i) const { return data_[static_cast<size_t>(i)]; }
  // Row `r` of a tensor viewed as [numel / dim(-1), dim(-1)].
  std::span<float> row(int64_t r);
  std::span<const float> row(int64_t r) const;

  // Same data, new shape (element count must match).
  void reshape(std::vector<int64_t> shape);
  // Reallocates to `shape` (zero-filled, in host memory) if it differs; keeps the buffer when it matches.
  // A device tensor of another shape becomes a host tensor (device backends allocate their outputs).
  void resize(std::vector<int64_t> shape);
  void fill(float value);

  std::string shape_string() const;  // "[4, 64]"

 private:
  std::vector<int64_t> shape_;
  std::vector<float> data_;
  std::shared_ptr<TensorStorage> storage_;  // set for a device tensor (data_ is then empty)
  DType dtype_ = DType::kF32;
};

std::string shape_to_string(const std::vector<int64_t>& shape);

// out [cols, rows] = inᵀ for row-major in [rows, cols] (host memory).
void transpose_matrix(const float* in, int64_t rows, int64_t cols, float* out);

// The flat index of the first NaN or Inf of a host tensor, or -1 when every value is finite (scanned in
// parallel, then the first one found again in order).
int64_t first_non_finite(const Tensor& t);

}  // namespace symprune
