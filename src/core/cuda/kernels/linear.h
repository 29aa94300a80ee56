#pragma once
// Host-only header: the linear product the CUDA backend uses, y[rows, m] = x[rows, n] · w[m, n]ᵀ (+ bias),
// on DEVICE pointers in fp32. Under CUDA it is cuBLAS SGEMM with TF32 off (core/cuda/cublas_linear.cc);
// in the CPU emulation it is the tiled kernel of gemm_kernels.cu (emulation/linear_emulated.cc).
#include <cstdint>

#include "core/cuda/device_memory.h"

namespace symprune::cuda {

void launch_linear(const float* x, const float* w, const float* bias, int64_t rows, int64_t n, int64_t m,
                   float* y, DeviceStream stream);

}  // namespace symprune::cuda
