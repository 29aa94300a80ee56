// Tiled fp32 GEMM (see gemm_kernels.h): 64 × 64 output tiles, 256 threads computing 4 × 4 each, k in
// steps of 16 staged through shared memory.
#include <string>

#include "core/cuda/kernel_platform.cuh"
#include "core/cuda/kernels/gemm_kernels.h"
#include "core/cuda/kernels/launch_shape.cuh"

namespace symprune::cuda {
namespace {

using namespace kernels;

constexpr int kTile = 64;      // output rows and columns per block
constexpr int kStep = 16;      // k per shared-memory stage
constexpr int kPerThread = 4;  // outputs per thread along each axis (16 × 16 threads × 4 × 4 = 64 × 64)

__global__ void __launch_bounds__(kThreads)
    linear_tiled_kernel(const float* __restrict__ x, const float* __restrict__ w,
                        const float* __restrict__ bias, int64_t rows, int64_t n, int64_t m,
                        float* __restrict__ y) {
  __shared__ float x_stage[kTile][kStep + 1];  // +1: no bank conflicts on the transposed reads
  __shared__ float w_stage[kTile][kStep + 1];
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile,
                col0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int tr = threadIdx.x / 16, tc = threadIdx.x % 16;
  float acc[kPerThread][kPerThread] = {};
  for (int64_t k0 = 0; k0 < n; k0 += kStep) {
    for (int e = threadIdx.x; e < kTile * kStep; e += kThreads) {
      const int r = e / kStep, k = e % kStep;
      const int64_t gk = k0 + k;
      x_stage[r][k] = row0 + r < rows && gk < n ? x[(row0 + r) * n + gk] : 0.0f;
      w_stage[r][k] = col0 + r < m && gk < n ? w[(col0 + r) * n + gk] : 0.0f;
    }
    __syncthreads();
    for (int k = 0; k < kStep; ++k)
      for (int i = 0; i < kPerThread; ++i)
        for (int j = 0; j < kPerThread; ++j)
          acc[i][j] += x_stage[tr * kPerThread + i][k] * w_stage[tc * kPerThread + j][k];
    __syncthreads();
  }
  for (int i = 0; i < kPerThread; ++i)
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t r = row0 + tr * kPerThread + i, c = col0 + tc * kPerThread + j;
      if (r < rows && c < m) y[r * m + c] = acc[i][j] + (bias != nullptr ? bias[c] : 0.0f);
    }
}

}  // namespace

void launch_linear_tiled(const float* x, const float* w, const float* bias, int64_t rows, int64_t n,
                         int64_t m, float* y, DeviceStream stream) {
  if (rows <= 0 || m <= 0) return;
  const dim3 grid(static_cast<unsigned>((m + kTile - 1) / kTile),
                  static_cast<unsigned>((rows + kTile - 1) / kTile));
  if (grid.y > 65535) throw_argument_error("linear_tiled: " + std::to_string(rows) + " rows exceed the grid");
  SYMPRUNE_LAUNCH(linear_tiled_kernel, grid, kThreads, 0, native(stream), x, w, bias, rows, n, m, y);
  SYMPRUNE_CHECK_LAUNCH();
}

}  // namespace symprune::cuda
