// The causal softmax of the 16-bit attention (see attention_kernels.h): one warp per score row, fp32
// max and sum reduced by shuffles, probabilities rounded to 16 bits for the tensor-core product with V.
#include <math.h>

#include "core/cuda/kernel_platform.cuh"
#include "core/cuda/kernels/attention_kernels.h"
#include "core/cuda/kernels/launch_shape.cuh"

namespace symprune::cuda {
namespace {

using namespace kernels;

template <bool kBf16>
__global__ void __launch_bounds__(kThreads)
    causal_softmax_kernel(const float* __restrict__ scores, int64_t rows, int64_t tile, int64_t keys,
                          int64_t first_query, uint16_t* __restrict__ probs) {
  const int lane = threadIdx.x % 32;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarps) {
    const float* s = scores + row * keys;
    uint16_t* p = probs + row * keys;
    const int64_t visible = first_query + row % tile + 1;
    float max = -INFINITY;
    for (int64_t j = lane; j < visible; j += 32) max = s[j] > max ? s[j] : max;
    for (int offset = 16; offset > 0; offset /= 2) {
      const float other = __shfl_xor_sync(kFullMask, max, offset);
      max = other > max ? other : max;
    }
    float sum = 0.0f;
    for (int64_t j = lane; j < visible; j += 32) sum += expf(s[j] - max);
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
    const float inv = 1.0f / sum;
    for (int64_t j = lane; j < keys; j += 32) {
      const float value = j < visible ? expf(s[j] - max) * inv : 0.0f;
      p[j] = kBf16 ? float_to_bf16_bits(value) : float_to_fp16_bits(value);
    }
  }
}

}  // namespace

void launch_causal_softmax_16bit(const float* scores, int64_t heads, int64_t tile, int64_t keys,
                                 int64_t first_query, DType dtype, void* probs, DeviceStream stream) {
  const int64_t rows = heads * tile;
  if (rows <= 0 || keys <= 0) return;
  if (first_query + tile > keys || (dtype != DType::kBF16 && dtype != DType::kF16))
    throw_argument_error("causal softmax: a tile past its keys, or not a 16-bit dtype");
  const int64_t blocks_needed = (rows + kWarps - 1) / kWarps;
  const dim3 grid(static_cast<unsigned>(blocks_needed < 65535 ? blocks_needed : 65535));
  auto* kernel = dtype == DType::kBF16 ? causal_softmax_kernel<true> : causal_softmax_kernel<false>;
  SYMPRUNE_LAUNCH(kernel, grid, kThreads, 0, native(stream), scores, rows, tile, keys, first_query,
                  static_cast<uint16_t*>(probs));
  SYMPRUNE_CHECK_LAUNCH();
}

}  // namespace symprune::cuda
