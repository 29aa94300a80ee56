#pragma once
// Host-only header (no CUDA types). Host pointers, copied to and from the device on every call:
// device residency comes with the CUDA backend issue (see cuda_gemm.h).
#include <cstdint>

namespace symprune::cuda {

// LLaMA RMSNorm per row, as Hugging Face computes it in fp32:
// y[r, :] = x[r, :] / sqrt(mean_c(x[r, c]²) + eps) · weight[:]. x and y are [rows, dim] row-major
// (y may alias x), weight is [dim]. dim must be ≥ 1 and eps ≥ 0; throws symprune::Error otherwise.
void cuda_rms_norm(const float* x, const float* weight, float* y, int64_t rows, int64_t dim, float eps);

}  // namespace symprune::cuda
