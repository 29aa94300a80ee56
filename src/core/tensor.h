#pragma once
// A dense row-major fp32 host tensor. The model works in fp32 on the CPU backend; storage dtypes
// (bf16/fp16) live only in files and are converted on load (core/dtype.h).
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

namespace symprune {

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::vector<int64_t> shape);  // zero-filled
  Tensor(std::vector<int64_t> shape, std::vector<float> values);

  const std::vector<int64_t>& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int axis) const;  // negative axis counts from the end
  int64_t numel() const { return static_cast<int64_t>(data_.size()); }
  bool empty() const { return data_.empty(); }

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
  // Reallocates to `shape` (zero-filled) if it differs; keeps the buffer when it matches.
  void resize(std::vector<int64_t> shape);
  void fill(float value);

  std::string shape_string() const;  // "[4, 64]"

 private:
  std::vector<int64_t> shape_;
  std::vector<float> data_;
};

int64_t shape_numel(const std::vector<int64_t>& shape);  // overflow-checked
std::string shape_to_string(const std::vector<int64_t>& shape);

}  // namespace symprune
