#include "core/cuda/cuda_check.h"

#include "core/error.h"

namespace symprune::cuda::detail {

void throw_cuda_error(cudaError_t status, const char* expression, const char* file, int line) {
  fail("CUDA error at {}:{}: `{}` failed: {} ({})", file, line, expression, cudaGetErrorString(status),
       cudaGetErrorName(status));
}

void throw_cublas_error(cublasStatus_t status, const char* expression, const char* file, int line) {
  fail("cuBLAS error at {}:{}: `{}` failed: {} ({})", file, line, expression, cublasGetStatusString(status),
       cublasGetStatusName(status));
}

void throw_error(const std::string& message) {
  throw Error(message);
}

}  // namespace symprune::cuda::detail
