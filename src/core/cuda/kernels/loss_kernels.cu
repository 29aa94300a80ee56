// Row NLL (see loss_kernels.h): one block per row; the max and the fp64 sum of exponentials are block
// reductions, so the sum's order differs from the CPU's sequential one by fp64 rounding only.
#include <cmath>

#include "core/cuda/kernel_platform.cuh"
#include "core/cuda/kernels/launch_shape.cuh"
#include "core/cuda/kernels/loss_kernels.h"

namespace symprune::cuda {
namespace {

using namespace kernels;

__global__ void __launch_bounds__(kThreads)
    row_nll_kernel(const float* __restrict__ logits, const int32_t* __restrict__ targets, int64_t vocab,
                   double* __restrict__ nll) {
  __shared__ float warp_max[kWarps];
  __shared__ double warp_sum[kWarps];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += kThreads) mx = row[j] > mx ? row[j] : mx;
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(kFullMask, mx, offset);
    mx = other > mx ? other : mx;
  }
  if (lane == 0) warp_max[warp] = mx;
  __syncthreads();
  mx = warp_max[0];
  for (int w = 1; w < kWarps; ++w) mx = warp_max[w] > mx ? warp_max[w] : mx;
  const double row_max = mx;
  double sum = 0.0;
  for (int64_t j = threadIdx.x; j < vocab; j += kThreads) sum += exp(static_cast<double>(row[j]) - row_max);
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(kFullMask, sum, offset);
  if (lane == 0) warp_sum[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kWarps; ++w) total += warp_sum[w];
    nll[blockIdx.x] = log(total) + row_max - static_cast<double>(row[targets[blockIdx.x]]);
  }
}

}  // namespace

void launch_row_nll(const float* logits, const int32_t* targets, int64_t rows, int64_t vocab, double* nll,
                    DeviceStream stream) {
  if (rows <= 0) return;
  if (vocab <= 0) throw_argument_error("row_nll: empty vocabulary");
  SYMPRUNE_LAUNCH(row_nll_kernel, static_cast<unsigned>(rows), kThreads, 0, native(stream), logits, targets,
                  vocab, nll);
  SYMPRUNE_CHECK_LAUNCH();
}

}  // namespace symprune::cuda
