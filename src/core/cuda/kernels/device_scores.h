#pragma once
// Host-only header: core::compute_scores for a weight held on the device. The plan (core::plan_scores)
// is the CPU's; its norms are reduced on the device, and the scores are written to device memory, equal
// to the CPU's bit for bit.
#include <cstdint>

#include "core/cuda/device_memory.h"
#include "core/scores.h"

namespace symprune::cuda {

// weight: device pointer, row-major fp32 [m, n]; scores: device pointer [rows, n] for options' row range.
// host_weight is the same weight in host memory, read only by --compat ria (whose fp16 arithmetic runs on
// the host, its scores then uploaded); it may be null otherwise (stochria's samples are drawn on the host
// and summed on the device). Errors are the CPU's (same text).
void compute_scores_on_device(ScoreMethod method, const float* weight, int64_t m, int64_t n,
                              const Tensor* host_weight, const ActivationStats* stats,
                              const ScoreOptions& options, float* scores);

}  // namespace symprune::cuda
