// Element dtype conversion (see convert_kernels.h): one grid-stride kernel per (source, destination) pair,
// through fp32.
#include <cstdint>
#include <type_traits>

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

// fp32 to 16 bits and back, four elements per thread and step (16-byte fp32 and 8-byte 16-bit accesses),
// the last count % 4 one by one; each element converted as by convert_kernel.
template <typename Dst>
__global__ void narrow4_kernel(const float* __restrict__ src, uint16_t* __restrict__ dst, int64_t count) {
  const int64_t head = count / 4;
  SYMPRUNE_GRID_STRIDE(q, head) {
    const float4 v = load_float4(src + 4 * q);
    store_4x16(dst + 4 * q, Dst::store(v.x), Dst::store(v.y), Dst::store(v.z), Dst::store(v.w));
  }
  SYMPRUNE_GRID_STRIDE(j, count - 4 * head) dst[4 * head + j] = Dst::store(src[4 * head + j]);
}
template <typename Src>
__global__ void widen4_kernel(const uint16_t* __restrict__ src, float* __restrict__ dst, int64_t count) {
  const int64_t head = count / 4;
  SYMPRUNE_GRID_STRIDE(q, head) {
    uint16_t v[4];
    load_4x16(src + 4 * q, v);
    store_float4(dst + 4 * q, float4{Src::load(v[0]), Src::load(v[1]), Src::load(v[2]), Src::load(v[3])});
  }
  SYMPRUNE_GRID_STRIDE(j, count - 4 * head) dst[4 * head + j] = Src::load(src[4 * head + j]);
}

template <typename Src, typename Dst>
void launch_pair(const void* src, void* dst, int64_t count, DeviceStream stream) {
  constexpr bool kNarrow = std::is_same_v<Src, F32> && !std::is_same_v<Dst, F32>;
  constexpr bool kWiden = !std::is_same_v<Src, F32> && std::is_same_v<Dst, F32>;
  if constexpr (kNarrow) {
    if (aligned_to(src, 16) && aligned_to(dst, 8)) {
      SYMPRUNE_LAUNCH(narrow4_kernel<Dst>, grid_for(count / 4), kThreads, 0, native(stream),
                      static_cast<const float*>(src), static_cast<uint16_t*>(dst), count);
      SYMPRUNE_CHECK_LAUNCH();
      return;
    }
  }
  if constexpr (kWiden) {
    if (aligned_to(src, 8) && aligned_to(dst, 16)) {
      SYMPRUNE_LAUNCH(widen4_kernel<Src>, grid_for(count / 4), kThreads, 0, native(stream),
                      static_cast<const uint16_t*>(src), static_cast<float*>(dst), count);
      SYMPRUNE_CHECK_LAUNCH();
      return;
    }
  }
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
