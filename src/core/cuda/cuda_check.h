#pragma once
// One checking macro per foreign API (DESIGN.md §7.3), for src/core/cuda only (it includes CUDA
// headers). A failing call throws symprune::Error naming the expression, file:line and the
// runtime's error name and text, so a missing driver or an out-of-memory reads as a clear error.
// The throwing helpers live in cuda_check.cc so that .cu files (compiled by nvcc) need not parse fmt.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

namespace symprune::cuda::detail {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* expression, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* expression, const char* file,
                                     int line);
// Bad arguments to a src/core/cuda entry point: throws symprune::Error(message).
[[noreturn]] void throw_error(const std::string& message);

}  // namespace symprune::cuda::detail

// Also clears the runtime's last-error slot, so a later check does not report this failure again.
#define SYMPRUNE_CUDA_CHECK(expression)                                                                   \
  do {                                                                                                    \
    const cudaError_t symprune_cuda_status_ = (expression);                                               \
    if (symprune_cuda_status_ != cudaSuccess) {                                                           \
      (void)cudaGetLastError();                                                                           \
      ::symprune::cuda::detail::throw_cuda_error(symprune_cuda_status_, #expression, __FILE__, __LINE__); \
    }                                                                                                     \
  } while (0)

#define SYMPRUNE_CUBLAS_CHECK(expression)                                                          \
  do {                                                                                             \
    const cublasStatus_t symprune_cublas_status_ = (expression);                                   \
    if (symprune_cublas_status_ != CUBLAS_STATUS_SUCCESS)                                          \
      ::symprune::cuda::detail::throw_cublas_error(symprune_cublas_status_, #expression, __FILE__, \
                                                   __LINE__);                                      \
  } while (0)
