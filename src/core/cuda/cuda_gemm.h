#pragma once
// Host-only header (no CUDA types): the first pieces of the CUDA backend, callable from plain C++.
//
// These take HOST pointers and copy to and from the device on every call, so they are for parity
// tests and small jobs only; device-resident tensors, streams and a persistent cuBLAS handle come
// with the CUDA backend issue, behind the backend interface (DESIGN.md §6, §7.2).
// Errors (no driver, no device, out of memory, bad sizes) throw symprune::Error.
#include <cstdint>

namespace symprune::cuda {

// y[t, o] = Σ_i x[t, i] · w[o, i] + bias[o]  (nn.Linear layout: y = x Wᵀ + b), in fp32 on device 0
// (the current device) with cuBLAS SGEMM; fp32 math, no TF32. Row-major: x is [tokens, in], w is
// [out, in], y is [tokens, out]; bias is [out] or nullptr for no bias. in == 0 gives y = bias (or 0).
void cuda_linear(const float* x, const float* w, const float* bias, float* y, int64_t tokens, int64_t in,
                 int64_t out);

}  // namespace symprune::cuda
