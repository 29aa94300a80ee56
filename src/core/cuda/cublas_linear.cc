// launch_linear with cuBLAS (see kernels/linear.h): one handle per process, fp32 without TF32 (the CPU
// backend is the spec), the bias added by the kernel that adds position rows (a table of one row).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"
#include "core/cuda/kernels/forward_kernels.h"
#include "core/cuda/kernels/linear.h"

namespace symprune::cuda {
namespace {

cublasHandle_t handle() {
  static cublasHandle_t shared = [] {
    cublasHandle_t h = nullptr;
    SYMPRUNE_CUBLAS_CHECK(cublasCreate(&h));
    SYMPRUNE_CUBLAS_CHECK(cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH));
    return h;
  }();
  return shared;
}

}  // namespace

void launch_linear(const float* x, const float* w, const float* bias, int64_t rows, int64_t n, int64_t m,
                   float* y, DeviceStream stream) {
  if (rows <= 0 || m <= 0) return;
  if (n <= 0) {
    zero_device(y, static_cast<size_t>(rows * m) * sizeof(float), stream);
  } else {
    cublasHandle_t h = handle();
    SYMPRUNE_CUBLAS_CHECK(cublasSetStream(h, static_cast<cudaStream_t>(stream.handle)));
    // Row-major y [rows, m] is column-major yᵀ [m, rows] = W xᵀ (see cuda_gemm.cu).
    const float alpha = 1.0f, beta = 0.0f;
    SYMPRUNE_CUBLAS_CHECK(
        cublasSgemm_64(h, CUBLAS_OP_T, CUBLAS_OP_N, m, rows, n, &alpha, w, n, x, n, &beta, y, m));
  }
  if (bias != nullptr) launch_add_position_rows(y, bias, rows, 1, 0, m, stream);
}

}  // namespace symprune::cuda
