// Activation statistics kernels (see stats_kernels.h): one thread per (channel, sequence) for the
// per-sequence sums, neighbouring threads on neighbouring channels (coalesced reads of a token row), then
// one thread per channel for the ordered combination. fp64; the products that could be contracted into
// FMAs are written with __dmul_rn/__dadd_rn (x·x of a float is exact in fp64, so the first kernel needs
// none).
#include "core/cuda/kernel_platform.cuh"
#include "core/cuda/kernels/launch_shape.cuh"
#include "core/cuda/kernels/stats_kernels.h"

namespace symprune::cuda {
namespace {

using namespace kernels;

__global__ void sequence_sums_kernel(const float* __restrict__ x, const float* __restrict__ offset,
                                     int64_t seq_len, int64_t width, double* __restrict__ seq_sumsq,
                                     double* __restrict__ seq_sum) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t s = blockIdx.y;
  if (c >= width) return;
  const float* column = x + s * seq_len * width + c;
  const double shift = offset != nullptr ? static_cast<double>(offset[c]) : 0.0;
  double sumsq = 0.0, sum = 0.0;
  // Unrolled so that many loads are in flight per thread (the sums must stay in token order, so a thread
  // has a whole column of a sequence and there are only seqs · width threads).
  SYMPRUNE_UNROLL_BY(16)
  for (int64_t t = 0; t < seq_len; ++t) {
    const double v = offset != nullptr ? __dsub_rn(static_cast<double>(column[t * width]), shift)
                                       : static_cast<double>(column[t * width]);
    sumsq = __dadd_rn(sumsq, __dmul_rn(v, v));
    sum = __dadd_rn(sum, v);
  }
  seq_sumsq[s * width + c] = sumsq;
  if (seq_sum != nullptr) seq_sum[s * width + c] = sum;
}

__global__ void combine_sequences_kernel(const double* __restrict__ seq_sumsq,
                                         const double* __restrict__ seq_sum, int64_t seqs, int64_t width,
                                         double* __restrict__ sumsq, double* __restrict__ sum,
                                         double* __restrict__ seqsq) {
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < width;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    double call_sumsq = 0.0, call_sum = 0.0, call_seqsq = 0.0;
    for (int64_t s = 0; s < seqs; ++s) {
      call_sumsq = __dadd_rn(call_sumsq, seq_sumsq[s * width + c]);
      if (seq_sum != nullptr) {
        const double part = seq_sum[s * width + c];
        call_sum = __dadd_rn(call_sum, part);
        call_seqsq = __dadd_rn(call_seqsq, __dmul_rn(part, part));
      }
    }
    sumsq[c] = __dadd_rn(sumsq[c], call_sumsq);
    if (seq_sum != nullptr) {
      sum[c] = __dadd_rn(sum[c], call_sum);
      seqsq[c] = __dadd_rn(seqsq[c], call_seqsq);
    }
  }
}

}  // namespace

void launch_sequence_sums(const float* x, const float* offset, int64_t seqs, int64_t seq_len, int64_t width,
                          double* seq_sumsq, double* seq_sum, DeviceStream stream, int64_t seqs_per_launch) {
  if (seqs <= 0 || width <= 0) return;
  // Sequences along y.
  for_each_grid_slice(seqs, seqs_per_launch, [&](int64_t first, int64_t count) {
    const dim3 grid(static_cast<unsigned>((width + kThreads - 1) / kThreads), static_cast<unsigned>(count));
    SYMPRUNE_LAUNCH(sequence_sums_kernel, grid, kThreads, 0, native(stream), x + first * seq_len * width,
                    offset, seq_len, width, seq_sumsq + first * width,
                    seq_sum != nullptr ? seq_sum + first * width : nullptr);
    SYMPRUNE_CHECK_LAUNCH();
  });
}

void launch_combine_sequences(const double* seq_sumsq, const double* seq_sum, int64_t seqs, int64_t width,
                              double* sumsq, double* sum, double* seqsq, DeviceStream stream) {
  if (width <= 0) return;
  SYMPRUNE_LAUNCH(combine_sequences_kernel, grid_for(width), kThreads, 0, native(stream), seq_sumsq, seq_sum,
                  seqs, width, sumsq, sum, seqsq);
  SYMPRUNE_CHECK_LAUNCH();
}

}  // namespace symprune::cuda
