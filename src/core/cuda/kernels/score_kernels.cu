// Score kernels (see score_kernels.h). fp64 with explicit round-to-nearest operations (__dadd_rn,
// __dmul_rn: nvcc would otherwise contract a·b + c into an FMA, which the CPU does not do) and the
// CPU's reduction order, so the fp32 scores equal the CPU's bit for bit.
#include <cfloat>

#include "core/cuda/kernel_platform.cuh"
#include "core/cuda/kernels/launch_shape.cuh"
#include "core/cuda/kernels/score_kernels.h"

namespace symprune::cuda {
namespace {

using namespace kernels;

enum NormCode { kCount = 0, kL1 = 1, kL2 = 2, kL3 = 3, kL4 = 4, kMax = 5 };
enum Form { kProduct = 0, kHypot = 1, kRatio = 2 };  // ScorePlan::Form

int norm_code(double p) {
  if (p == 0.0) return kCount;
  if (p == 1.0) return kL1;
  if (p == 2.0) return kL2;
  if (p == 3.0) return kL3;
  if (p == 4.0) return kL4;
  return kMax;  // p = ∞ (validate_score_options admits nothing else)
}

// core::norm_accumulate, operation for operation.
__device__ __forceinline__ double norm_add(int code, double acc, double a) {
  switch (code) {
    case kL1:
      return __dadd_rn(acc, a);
    case kL2:
      return __dadd_rn(acc, __dmul_rn(a, a));
    case kCount:
      return __dadd_rn(acc, a != 0.0 ? 1.0 : 0.0);
    case kMax:
      return acc < a ? a : acc;
    case kL3:
      return __dadd_rn(acc, __dmul_rn(__dmul_rn(a, a), a));
    default:
      return __dadd_rn(acc, __dmul_rn(__dmul_rn(a, a), __dmul_rn(a, a)));
  }
}

// fabs, as the CPU takes it (-0 becomes +0).
__device__ __forceinline__ double magnitude(float w) {
  return fabs(static_cast<double>(w));
}

__global__ void first_nonfinite_kernel(const float* __restrict__ values, int64_t count,
                                       unsigned long long* first) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    if ((__float_as_uint(values[i]) & 0x7f800000u) == 0x7f800000u)
      atomicMin(first, static_cast<unsigned long long>(i));
}

// One thread per row, columns in order (the CPU's order). Rows are few (m ≤ 10⁵), so this is a small
// part of a block's work.
__global__ void row_norm_sums_kernel(const float* __restrict__ weight, int64_t m, int64_t n, int code,
                                     double* __restrict__ sums) {
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; r < m;
       r += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float* row = weight + r * n;
    double acc = 0.0;
    for (int64_t c = 0; c < n; ++c) acc = norm_add(code, acc, magnitude(row[c]));
    sums[r] = acc;
  }
}

// One thread per column, rows in order: neighbouring threads read neighbouring addresses.
__global__ void column_norm_sums_kernel(const float* __restrict__ weight, int64_t m, int64_t n, int code,
                                        double* __restrict__ sums) {
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < n;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double acc = 0.0;
    for (int64_t r = 0; r < m; ++r) acc = norm_add(code, acc, magnitude(weight[r * n + c]));
    sums[c] = acc;
  }
}

__global__ void plan_scores_kernel(const float* __restrict__ weight, int64_t n, int64_t row_begin,
                                   int64_t count, int form, const double* __restrict__ u,
                                   const double* __restrict__ v, const double* __restrict__ f,
                                   float* __restrict__ scores) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = row_begin + i / n, c = i % n;
    const double w = magnitude(weight[r * n + c]);
    const double sum_uv =
        form == kHypot ? __dadd_rn(__dmul_rn(u[r], u[r]), __dmul_rn(v[c], v[c])) : __dadd_rn(u[r], v[c]);
    double x;
    if (form == kProduct)
      x = __dmul_rn(w, sum_uv);
    else if (form == kHypot)
      x = __dmul_rn(w, __dsqrt_rn(sum_uv));
    else
      x = sum_uv > 0.0 ? __ddiv_rn(w, sum_uv) : 0.0;
    if (f != nullptr) x = __dmul_rn(x, f[c]);
    scores[i] = x > static_cast<double>(FLT_MAX) ? FLT_MAX : static_cast<float>(x);
  }
}

// One thread per row or column, samples in order (the CPU's).
__global__ void sampled_abs_sums_kernel(const float* __restrict__ weight, int64_t n,
                                        const int32_t* __restrict__ picks, int64_t begin, int64_t end,
                                        int64_t tau, bool columns, double* __restrict__ sums) {
  // Index i's samples are columns of row i (entry i·n + pick) or rows of column i (entry pick·n + i).
  const int64_t index_stride = columns ? 1 : n, pick_stride = columns ? n : 1;
  for (int64_t i = begin + static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < end;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t* own = picks + (i - begin) * tau;
    double acc = 0.0;
    for (int64_t k = 0; k < tau; ++k)
      acc = __dadd_rn(acc, magnitude(weight[i * index_stride + own[k] * pick_stride]));
    sums[i] = acc;
  }
}

}  // namespace

void launch_first_nonfinite(const float* values, int64_t count, int64_t* first, DeviceStream stream) {
  if (count <= 0) return;
  SYMPRUNE_LAUNCH(first_nonfinite_kernel, grid_for(count), kThreads, 0, native(stream), values, count,
                  reinterpret_cast<unsigned long long*>(first));
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_row_norm_sums(const float* weight, int64_t m, int64_t n, double p, double* sums,
                          DeviceStream stream) {
  if (m <= 0) return;
  SYMPRUNE_LAUNCH(row_norm_sums_kernel, grid_for(m), kThreads, 0, native(stream), weight, m, n, norm_code(p),
                  sums);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_sampled_abs_sums(const float* weight, int64_t n, const int32_t* picks, int64_t begin, int64_t end,
                             int64_t tau, bool columns, double* sums, DeviceStream stream) {
  if (end <= begin) return;
  SYMPRUNE_LAUNCH(sampled_abs_sums_kernel, grid_for(end - begin), kThreads, 0, native(stream), weight, n,
                  picks, begin, end, tau, columns, sums);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_column_norm_sums(const float* weight, int64_t m, int64_t n, double p, double* sums,
                             DeviceStream stream) {
  if (n <= 0) return;
  SYMPRUNE_LAUNCH(column_norm_sums_kernel, grid_for(n), kThreads, 0, native(stream), weight, m, n,
                  norm_code(p), sums);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_plan_scores(const float* weight, int64_t n, int64_t row_begin, int64_t row_end, int form,
                        const double* u, const double* v, const double* f, float* scores,
                        DeviceStream stream) {
  const int64_t count = (row_end - row_begin) * n;
  if (count <= 0) return;
  SYMPRUNE_LAUNCH(plan_scores_kernel, grid_for(count), kThreads, 0, native(stream), weight, n, row_begin,
                  count, form, u, v, f, scores);
  SYMPRUNE_CHECK_LAUNCH();
}

}  // namespace symprune::cuda
