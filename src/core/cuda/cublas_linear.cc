// launch_linear with cuBLAS (see kernels/linear.h): fp32 on a handle in pedantic math (no TF32: the CPU
// backend is the spec), bf16/fp16 through GemmEx with fp32 accumulation on a handle in default math (tensor
// cores); the bias added by the kernel that adds position rows (a table of one row).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "core/cuda/cuda_check.h"
#include "core/cuda/kernels/forward_kernels.h"
#include "core/cuda/kernels/linear.h"

namespace symprune::cuda {
namespace {

cublasHandle_t new_handle(cublasMath_t mode) {
  cublasHandle_t h = nullptr;
  SYMPRUNE_CUBLAS_CHECK(cublasCreate(&h));
  SYMPRUNE_CUBLAS_CHECK(cublasSetMathMode(h, mode));
  return h;
}

cublasHandle_t handle() {
  static cublasHandle_t shared = new_handle(CUBLAS_PEDANTIC_MATH);
  return shared;
}

cublasHandle_t handle_16bit() {
  static cublasHandle_t shared = new_handle(CUBLAS_DEFAULT_MATH);
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

void launch_gram(const float* x, int64_t rows, int64_t n, float* g, DeviceStream stream) {
  if (n <= 0) return;
  if (rows <= 0) {
    zero_device(g, static_cast<size_t>(n * n) * sizeof(float), stream);
    return;
  }
  cublasHandle_t h = handle();
  SYMPRUNE_CUBLAS_CHECK(cublasSetStream(h, static_cast<cudaStream_t>(stream.handle)));
  // Row-major x [rows, n] is column-major A = Xᵀ [n, rows]; G = A·Aᵀ = XᵀX (symmetric, so its layout is
  // the same in either order).
  const float alpha = 1.0f, beta = 0.0f;
  SYMPRUNE_CUBLAS_CHECK(
      cublasSgemm_64(h, CUBLAS_OP_N, CUBLAS_OP_T, n, n, rows, &alpha, x, n, x, n, &beta, g, n));
}

void launch_linear_16bit(const void* x_rounded, const void* w, DType dtype, const float* bias, int64_t rows,
                         int64_t n, int64_t m, float* y, DeviceStream stream) {
  if (rows <= 0 || m <= 0) return;
  if (n <= 0) {
    zero_device(y, static_cast<size_t>(rows * m) * sizeof(float), stream);
  } else {
    cublasHandle_t h = handle_16bit();
    SYMPRUNE_CUBLAS_CHECK(cublasSetStream(h, static_cast<cudaStream_t>(stream.handle)));
    const cudaDataType operands = dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
    const float alpha = 1.0f, beta = 0.0f;
    SYMPRUNE_CUBLAS_CHECK(cublasGemmEx_64(h, CUBLAS_OP_T, CUBLAS_OP_N, m, rows, n, &alpha, w, operands, n,
                                          x_rounded, operands, n, &beta, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT));
  }
  if (bias != nullptr) launch_add_position_rows(y, bias, rows, 1, 0, m, stream);
}

void launch_gemm_strided_batched_16bit(int64_t m, int64_t n, int64_t k, float alpha, StridedOperand a,
                                       StridedOperand b, DType dtype, float* c, int64_t ldc, int64_t stride_c,
                                       int64_t batch, DeviceStream stream) {
  if (m <= 0 || n <= 0 || batch <= 0) return;
  cublasHandle_t h = handle_16bit();
  SYMPRUNE_CUBLAS_CHECK(cublasSetStream(h, static_cast<cudaStream_t>(stream.handle)));
  const cudaDataType operands = dtype == DType::kBF16 ? CUDA_R_16BF : CUDA_R_16F;
  const float beta = 0.0f;
  SYMPRUNE_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(
      h, a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N, b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha,
      a.data, operands, a.ld, a.stride, b.data, operands, b.ld, b.stride, &beta, c, CUDA_R_32F, ldc, stride_c,
      batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace symprune::cuda
