#pragma once
// Host-only header: activation statistics (core/activation_stats.h) of device-held activations, summed
// in the CPU's order (per sequence, then sequences in order), so the fp64 sums equal the CPU's bit for bit.
#include <cstdint>

#include "core/cuda/device_memory.h"

namespace symprune::cuda {

// x is [seqs · seq_len, width] row-major fp32; offset [width] or null (a linear's bias: each value is
// x − offset[c] in fp64). For every channel c and sequence s: seq_sumsq[s, c] = Σ_t x², seq_sum[s, c] = Σ_t x
// (t in order from zero); seq_sum may be null (only the squares are needed, as for output statistics).
// Launched seqs_per_launch sequences at a time (the grid's y; 65535 is CUDA's limit, tests pass fewer to
// cover the split).
void launch_sequence_sums(const float* x, const float* offset, int64_t seqs, int64_t seq_len, int64_t width,
                          double* seq_sumsq, double* seq_sum, DeviceStream stream,
                          int64_t seqs_per_launch = 65535);
// Adds the call's totals to the running sums: sumsq[c] += Σ_s seq_sumsq[s, c]; when seq_sum is given,
// sum[c] += Σ_s seq_sum[s, c] and seqsq[c] += Σ_s seq_sum[s, c]² (each Σ over s in order from zero).
void launch_combine_sequences(const double* seq_sumsq, const double* seq_sum, int64_t seqs, int64_t width,
                              double* sumsq, double* sum, double* seqsq, DeviceStream stream);

}  // namespace symprune::cuda
