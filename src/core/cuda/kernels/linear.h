#pragma once
// Host-only header: the linear product the CUDA backend uses, y[rows, m] = x[rows, n] · w[m, n]ᵀ (+ bias),
// on DEVICE pointers in fp32. Under CUDA it is cuBLAS SGEMM with TF32 off (core/cuda/cublas_linear.cc);
// in the CPU emulation it is the tiled kernel of gemm_kernels.cu (emulation/linear_emulated.cc).
#include <cstdint>

#include "core/cuda/device_memory.h"
#include "core/dtype.h"

namespace symprune::cuda {

void launch_linear(const float* x, const float* w, const float* bias, int64_t rows, int64_t n, int64_t m,
                   float* y, DeviceStream stream);

// g[n, n] = XᵀX for x [rows, n] (the Gram matrix of x's rows) in fp32: under CUDA one cuBLAS SGEMM with
// TF32 off; in the emulation, the tiled kernel on a transposed copy. rows = 0 gives zeros.
void launch_gram(const float* x, int64_t rows, int64_t n, float* g, DeviceStream stream);

// The same product in lower precision: w [m, n] and x_rounded [rows, n] in bf16 or fp16 (dtype; the caller
// rounds x), the 16-bit products accumulated in fp32 and y in fp32. Under CUDA it is cuBLAS GemmEx on tensor
// cores; in the emulation, the tiled kernel on the widened values.
void launch_linear_16bit(const void* x_rounded, const void* w, DType dtype, const float* bias, int64_t rows,
                         int64_t n, int64_t m, float* y, DeviceStream stream);

// A strided batch of C_b = alpha · op(A_b) · op(B_b) in cuBLAS's column-major convention (op = transpose
// when trans_a / trans_b; op(A_b) is m × k, op(B_b) is k × n, C_b is m × n with leading dimension ldc), for
// b < batch with X_b = X + b · stride_x elements: A and B in bf16/fp16 (dtype), C in fp32, products
// accumulated in fp32. Under CUDA it is cuBLAS GemmStridedBatchedEx on tensor cores; in the emulation, a
// host loop on the widened values.
struct StridedOperand {
  const void* data;
  int64_t ld, stride;
  bool transposed;
};
void launch_gemm_strided_batched_16bit(int64_t m, int64_t n, int64_t k, float alpha, StridedOperand a,
                                       StridedOperand b, DType dtype, float* c, int64_t ldc, int64_t stride_c,
                                       int64_t batch, DeviceStream stream);

}  // namespace symprune::cuda
