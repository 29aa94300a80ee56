#pragma once
// Host-only header: a plain fp32 tiled matrix product on DEVICE pointers, y = x · Wᵀ (+ bias), the
// Backend::linear layout. cuBLAS does this faster on a GPU (core/cuda/cuda_gemm.h); this kernel is the
// linear op of the CPU emulation (cuBLAS cannot run there) and a cuBLAS-free parity reference on the GPU.
#include <cstdint>

#include "core/cuda/device_memory.h"

namespace symprune::cuda {

// y[rows, m] = x[rows, n] · w[m, n]ᵀ + bias[m] (bias may be null); fp32 accumulation in k order.
void launch_linear_tiled(const float* x, const float* w, const float* bias, int64_t rows, int64_t n,
                         int64_t m, float* y, DeviceStream stream);

}  // namespace symprune::cuda
