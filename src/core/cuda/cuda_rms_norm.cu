// Per-row RMSNorm: one thread block per row, a two-level (warp shuffle, then shared memory)
// reduction of Σ x² in fp32, then a scaling pass (host-pointer API, see cuda_rms_norm.h).
#include <cuda_runtime.h>

#include <string>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_rms_norm.h"
#include "core/cuda/device_buffer.cuh"

namespace symprune::cuda {
namespace {

constexpr int kThreads = 256;  // a multiple of the warp size
constexpr int kWarpSize = 32;

__device__ float warp_sum(float value) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    value += __shfl_down_sync(0xffffffffu, value, offset);
  return value;
}

// Sum of `value` over the block; every thread gets the result.
__device__ float block_sum(float value) {
  __shared__ float warp_partials[kThreads / kWarpSize];
  __shared__ float total;
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  value = warp_sum(value);
  if (lane == 0) warp_partials[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < kThreads / kWarpSize ? warp_partials[lane] : 0.0f;
    value = warp_sum(value);
    if (lane == 0) total = value;
  }
  __syncthreads();
  return total;
}

// Grid-stride over rows so any number of rows fits the grid; every thread of a block takes the same
// path through the loop, so the __syncthreads in block_sum are reached uniformly.
__global__ void rms_norm_kernel(const float* x, const float* weight, float* y, int64_t rows, int64_t dim,
                                float eps) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* in = x + row * dim;
    float sumsq = 0.0f;
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) sumsq += in[c] * in[c];
    const float inv_rms = rsqrtf(block_sum(sumsq) / static_cast<float>(dim) + eps);
    float* out_row = y + row * dim;
    for (int64_t c = threadIdx.x; c < dim; c += blockDim.x) out_row[c] = weight[c] * (in[c] * inv_rms);
  }
}

}  // namespace

void cuda_rms_norm(const float* x, const float* weight, float* y, int64_t rows, int64_t dim, float eps) {
  if (rows < 0 || dim < 1) {
    detail::throw_error("cuda_rms_norm: invalid shape (rows " + std::to_string(rows) + ", dim " +
                        std::to_string(dim) + "): rows must be >= 0 and dim >= 1");
  }
  if (!(eps >= 0.0f)) detail::throw_error("cuda_rms_norm: eps must be >= 0, got " + std::to_string(eps));
  if (rows == 0) return;
  if (x == nullptr || weight == nullptr || y == nullptr) {
    detail::throw_error("cuda_rms_norm: null x, weight or y pointer (rows " + std::to_string(rows) +
                        ", dim " + std::to_string(dim) + ")");
  }

  detail::DeviceBuffer<float> d_x(rows * dim), d_w(dim), d_y(rows * dim);
  d_x.upload(x);
  d_w.upload(weight);
  const int blocks = static_cast<int>(rows < 65535 ? rows : 65535);
  rms_norm_kernel<<<blocks, kThreads>>>(d_x.data(), d_w.data(), d_y.data(), rows, dim, eps);
  SYMPRUNE_CUDA_CHECK(cudaGetLastError());
  d_y.download(y);  // synchronizes; kernel faults surface here
}

}  // namespace symprune::cuda
