// Element dtype conversion (see convert_kernels.h): one grid-stride kernel per (source, destination) pair,
// through fp32.
#include "core/cuda/kernel_platform.cuh"
#include "core/cuda/kernels/convert_kernels.h"
#include "core/cuda/kernels/launch_shape.cuh"

namespace symprune::cuda {
namespace {

using namespace kernels;

struct F32 {
  using Element = float;
  __device__ static float load(float v) { return v; }
  __device__ static float store(float v) { return v; }
};
struct BF16 {
  using Element = uint16_t;
  __device__ static float load(uint16_t v) { return bf16_bits_to_float(v); }
  __device__ static uint16_t store(float v) { return float_to_bf16_bits(v); }
};
struct F16 {
  using Element = uint16_t;
  __device__ static float load(uint16_t v) { return fp16_bits_to_float(v); }
  __device__ static uint16_t store(float v) { return float_to_fp16_bits(v); }
};

template <typename Src, typename Dst>
__global__ void convert_kernel(const typename Src::Element* __restrict__ src,
                               typename Dst::Element* __restrict__ dst, int64_t count) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = Dst::store(Src::load(src[i]));
}

template <typename Src, typename Dst>
void launch_pair(const void* src, void* dst, int64_t count, DeviceStream stream) {
  auto* kernel = convert_kernel<Src, Dst>;
  SYMPRUNE_LAUNCH(kernel, grid_for(count), kThreads, 0, native(stream),
                  static_cast<const typename Src::Element*>(src), static_cast<typename Dst::Element*>(dst),
                  count);
  SYMPRUNE_CHECK_LAUNCH();
}

template <typename Src>
void launch_from(const void* src, void* dst, DType dst_dtype, int64_t count, DeviceStream stream) {
  switch (dst_dtype) {
    case DType::kF32:
      return launch_pair<Src, F32>(src, dst, count, stream);
    case DType::kBF16:
      return launch_pair<Src, BF16>(src, dst, count, stream);
    case DType::kF16:
      return launch_pair<Src, F16>(src, dst, count, stream);
    default:
      return;  // not a weight dtype: device tensors never hold one (Tensor::in_device_memory)
  }
}

}  // namespace

void launch_convert(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t count,
                    DeviceStream stream) {
  if (count <= 0) return;
  if (src_dtype == dst_dtype) {
    copy_on_device(dst, src, static_cast<size_t>(count * dtype_size(src_dtype)), stream);
    return;
  }
  switch (src_dtype) {
    case DType::kF32:
      return launch_from<F32>(src, dst, dst_dtype, count, stream);
    case DType::kBF16:
      return launch_from<BF16>(src, dst, dst_dtype, count, stream);
    case DType::kF16:
      return launch_from<F16>(src, dst, dst_dtype, count, stream);
    default:
      return;  // as above
  }
}

}  // namespace symprune::cuda
