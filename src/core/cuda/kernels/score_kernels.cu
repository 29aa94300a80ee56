// Score kernels (see score_kernels.h). fp64 with explicit round-to-nearest operations (__dadd_rn,
// __dmul_rn: nvcc would otherwise contract a·b + c into an FMA, which the CPU does not do) and the
// CPU's reduction order, so the fp32 scores equal the CPU's bit for bit.
#include <algorithm>
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

// Norm sums along the lines of a matrix [m, n]: its rows (a line's elements are its columns) or its columns
// (a line's elements are its rows), one fp64 chain per line adding its elements in order (the CPU's order,
// so the sums are its sums bit for bit). The chains are sequential; what makes them fast is the loads: a
// block takes kSumLines lines, all its warps stage tiles of kSumTile elements of those lines in shared memory
// with coalesced reads (a warp reads 32 consecutive floats of one row), and warp 0's lanes run the 32 chains
// over one tile while the next tile's loads are in flight. (One thread per line reading global memory
// directly left a few warps per SM waiting on one load at a time: about 1 ms per 7B matrix, not 0.05.)
constexpr int kSumLines = 32;
constexpr int kSumTile = 128;                               // elements of each line per tile
constexpr int kSumLoads = kSumLines * kSumTile / kThreads;  // floats each thread stages per tile
constexpr int kSumGroup = 16;                               // tile elements read ahead of the chain

// kCode (NormCode) is a template argument: with a run-time code the chain branched on it at every element,
// and no shared-memory read went ahead of the one being added.
template <bool kRows, int kCode>
__global__ void line_norm_sums_kernel(const float* __restrict__ weight, const uint8_t* __restrict__ skip,
                                      int64_t m, int64_t n, double* __restrict__ sums) {
  // [line][element], padded: lane L reads line L's elements in order at banks distinct from the others'.
  __shared__ float tile[2][kSumLines][kSumTile + 1];
  const int64_t lines = kRows ? m : n, length = kRows ? n : m;
  const int64_t first_line = static_cast<int64_t>(blockIdx.x) * kSumLines;
  const int tid = static_cast<int>(threadIdx.x);
  // The j-th float a thread stages: consecutive threads take consecutive columns of one row, which are
  // consecutive elements of one line (rows) or the same element of consecutive lines (columns).
  const auto line_of = [&](int j) {
    const int f = j * kThreads + tid;
    return kRows ? f / kSumTile : f % kSumLines;
  };
  const auto element_of = [&](int j) {
    const int f = j * kThreads + tid;
    return kRows ? f % kSumTile : f / kSumLines;
  };
  float staged[kSumLoads];
  const auto load = [&](int64_t first_element) {
    SYMPRUNE_UNROLL
    for (int j = 0; j < kSumLoads; ++j) {
      const int64_t line = first_line + line_of(j), element = first_element + element_of(j);
      const int64_t r = kRows ? line : element, c = kRows ? element : line;
      // A skipped entry counts as a zero, which leaves every kind of sum as it is (see the chain below).
      staged[j] = r < m && c < n && (skip == nullptr || skip[r * n + c] == 0) ? weight[r * n + c] : 0.0f;
    }
  };
  const auto store = [&](int buffer) {
    SYMPRUNE_UNROLL
    for (int j = 0; j < kSumLoads; ++j) tile[buffer][line_of(j)][element_of(j)] = staged[j];
  };
  const int64_t tiles = (length + kSumTile - 1) / kSumTile;
  double acc = 0.0;
  if (tiles > 0) {
    load(0);
    store(0);
  }
  __syncthreads();
  for (int64_t t = 0; t < tiles; ++t) {
    const bool more = t + 1 < tiles;
    if (more) load((t + 1) * kSumTile);
    if (tid < kSumLines) {
      // The whole tile, in groups whose reads go ahead of their additions: past the line's end the tile
      // holds zeros, and adding the norm of a zero leaves every kind of sum as it is (acc ≥ +0).
      const float* own = tile[t & 1][tid];
      for (int e0 = 0; e0 < kSumTile; e0 += kSumGroup) {
        float values[kSumGroup];
        SYMPRUNE_UNROLL
        for (int k = 0; k < kSumGroup; ++k) values[k] = own[e0 + k];
        SYMPRUNE_UNROLL
        for (int k = 0; k < kSumGroup; ++k) acc = norm_add(kCode, acc, magnitude(values[k]));
      }
    }
    if (more) store(static_cast<int>((t + 1) & 1));
    __syncthreads();
  }
  if (tid < kSumLines && first_line + tid < lines) sums[first_line + tid] = acc;
}

__global__ void plan_scores_kernel(const float* __restrict__ weight, int64_t n, int64_t row_begin,
                                   int64_t rows, int64_t rows_per_block, int form,
                                   const double* __restrict__ u, const double* __restrict__ v,
                                   const double* __restrict__ f, float* __restrict__ scores,
                                   unsigned long long* __restrict__ first_saturated) {
  // A block takes consecutive rows, its threads a row's columns: no 64-bit division per element (it costs
  // more than the element's fp64 arithmetic).
  const int64_t first = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t last = first + rows_per_block < rows ? first + rows_per_block : rows;
  for (int64_t local_row = first; local_row < last; ++local_row) {
    const int64_t r = row_begin + local_row;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
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
      const float rounded = x > static_cast<double>(FLT_MAX) ? FLT_MAX : static_cast<float>(x);
      // Saturated (scores.h's score_saturates): above FLT_MAX, or positive and rounded to 0.
      if (x > static_cast<double>(FLT_MAX) || (x > 0.0 && rounded == 0.0f))
        atomicMin(first_saturated, static_cast<unsigned long long>(r * n + c));
      scores[local_row * n + c] = rounded;
    }
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
    const float* line = weight + i * index_stride;
    double acc = 0.0;
    int64_t k = 0;
    // kSumGroup samples loaded before they are added (the picks, then the weights they point at), not
    // one pair of dependent loads per addition.
    for (; k + kSumGroup <= tau; k += kSumGroup) {
      float values[kSumGroup];
      SYMPRUNE_UNROLL
      for (int j = 0; j < kSumGroup; ++j) values[j] = line[own[k + j] * pick_stride];
      SYMPRUNE_UNROLL
      for (int j = 0; j < kSumGroup; ++j) acc = __dadd_rn(acc, magnitude(values[j]));
    }
    for (; k < tau; ++k) acc = __dadd_rn(acc, magnitude(line[own[k] * pick_stride]));
    sums[i] = acc;
  }
}

using LineNormSumsKernel = void (*)(const float*, const uint8_t*, int64_t, int64_t, double*);

template <bool kRows>
void launch_line_norm_sums(const float* weight, const uint8_t* skip, int64_t m, int64_t n, double p,
                           double* sums, DeviceStream stream) {
  const int64_t lines = kRows ? m : n;
  if (lines <= 0) return;
  const int code = norm_code(p);
  const LineNormSumsKernel kernel = code == kCount ? line_norm_sums_kernel<kRows, kCount>
                                    : code == kL1  ? line_norm_sums_kernel<kRows, kL1>
                                    : code == kL2  ? line_norm_sums_kernel<kRows, kL2>
                                    : code == kL3  ? line_norm_sums_kernel<kRows, kL3>
                                    : code == kL4  ? line_norm_sums_kernel<kRows, kL4>
                                                   : line_norm_sums_kernel<kRows, kMax>;
  SYMPRUNE_LAUNCH(kernel, static_cast<int>((lines + kSumLines - 1) / kSumLines), kThreads, 0, native(stream),
                  weight, skip, m, n, sums);
  SYMPRUNE_CHECK_LAUNCH();
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
  launch_line_norm_sums<true>(weight, nullptr, m, n, p, sums, stream);
}

void launch_sampled_abs_sums(const float* weight, int64_t n, const int32_t* picks, int64_t begin, int64_t end,
                             int64_t tau, bool columns, double* sums, DeviceStream stream) {
  if (end <= begin) return;
  SYMPRUNE_LAUNCH(sampled_abs_sums_kernel, grid_for(end - begin), kThreads, 0, native(stream), weight, n,
                  picks, begin, end, tau, columns, sums);
  SYMPRUNE_CHECK_LAUNCH();
}

void launch_column_norm_sums(const float* weight, int64_t m, int64_t n, double p, double* sums,
                             DeviceStream stream, const uint8_t* skip) {
  launch_line_norm_sums<false>(weight, skip, m, n, p, sums, stream);
}

void launch_plan_scores(const float* weight, int64_t n, int64_t row_begin, int64_t row_end, int form,
                        const double* u, const double* v, const double* f, float* scores,
                        int64_t* first_saturated, DeviceStream stream) {
  const int64_t rows = row_end - row_begin;
  if (rows <= 0 || n <= 0) return;
  // As many blocks as a grid-stride loop over the elements would have, each with whole rows.
  const int64_t blocks = std::min<int64_t>(grid_for(rows * n), rows);
  const int64_t rows_per_block = (rows + blocks - 1) / blocks;
  SYMPRUNE_LAUNCH(plan_scores_kernel, static_cast<int>((rows + rows_per_block - 1) / rows_per_block),
                  kThreads, 0, native(stream), weight, n, row_begin, rows, rows_per_block, form, u, v, f,
                  scores, reinterpret_cast<unsigned long long*>(first_saturated));
  SYMPRUNE_CHECK_LAUNCH();
}

}  // namespace symprune::cuda
