#include "io/tensor_source.h"

#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"

namespace symprune::io {

Tensor TensorSource::load_f32(std::string_view name, const std::vector<int64_t>* expected_shape) const {
  const TensorInfo& ti = info(name);
  if (expected_shape) {
    SYMPRUNE_CHECK(ti.shape == *expected_shape, "tensor '{}' in {} has shape {} but {} was expected", name,
                   location(name), shape_to_string(ti.shape), shape_to_string(*expected_shape));
  }
  SYMPRUNE_CHECK(is_weight_dtype(ti.dtype),
                 "{}: tensor '{}': unsupported dtype {} (supported: F32, F16, BF16)", location(name), name,
                 dtype_name(ti.dtype));
  std::vector<std::byte> bytes;
  read_bytes(name, bytes);
  Tensor tensor(ti.shape);
  if (tensor.numel() > 0) convert_to_f32(ti.dtype, bytes.data(), tensor.data(), tensor.numel());
  return tensor;
}

}  // namespace symprune::io
