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

// Each thread has a whole column of one sequence (the sums stay in token order), so there are only
// seqs · width threads: a micro-batch of 8 sequences of a 4096-wide input gives 8 warps per SM. What keeps
// the memory busy is the loads each of them has in flight: kLoadsInFlight tokens are loaded into registers
// before they are added, explicitly (the unrolled loop of one token at a time compiled to 32 registers,
// too few for that many loads outstanding).
constexpr int kLoadsInFlight = 16;

template <bool kShift>
__global__ void sequence_sums_kernel(const float* __restrict__ x, const float* __restrict__ offset,
                                     int64_t seq_len, int64_t width, double* __restrict__ seq_sumsq,
                                     double* __restrict__ seq_sum) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t s = blockIdx.y;
  if (c >= width) return;
  const float* column = x + s * seq_len * width + c;
  const double shift = kShift ? static_cast<double>(offset[c]) : 0.0;
  double sumsq = 0.0, sum = 0.0;
  const auto add = [&](float value) {
    const double v = kShift ? __dsub_rn(static_cast<double>(value), shift) : static_cast<double>(value);
    sumsq = __dadd_rn(sumsq, __dmul_rn(v, v));
    sum = __dadd_rn(sum, v);
  };
  int64_t t = 0;
  for (; t + kLoadsInFlight <= seq_len; t += kLoadsInFlight) {
    float values[kLoadsInFlight];
    SYMPRUNE_UNROLL
    for (int k = 0; k < kLoadsInFlight; ++k) values[k] = column[(t + k) * width];
    SYMPRUNE_UNROLL
    for (int k = 0; k < kLoadsInFlight; ++k) add(values[k]);
  }
  for (; t < seq_len; ++t) add(column[t * width]);
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
    const auto kernel = offset != nullptr ? sequence_sums_kernel<true> : sequence_sums_kernel<false>;
    SYMPRUNE_LAUNCH(kernel, grid, kThreads, 0, native(stream), x + first * seq_len * width, offset, seq_len,
                    width, seq_sumsq + first * width, seq_sum != nullptr ? seq_sum + first * width : nullptr);
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
