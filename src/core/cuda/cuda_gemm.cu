// y = x Wᵀ + b with cuBLAS SGEMM and a bias-add kernel (host-pointer API, see cuda_gemm.h).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_gemm.h"
#include "core/cuda/device_buffer.cuh"

namespace symprune::cuda {
namespace {

// y is [tokens, out] row-major; one thread per element, grid-stride so any size fits the grid.
__global__ void add_bias_kernel(float* y, const float* bias, int64_t tokens, int64_t out) {
  const int64_t total = tokens * out;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    y[i] += bias[i % out];
  }
}

class CublasHandle {
 public:
  CublasHandle() { SYMPRUNE_CUBLAS_CHECK(cublasCreate(&handle_)); }
  ~CublasHandle() { (void)cublasDestroy(handle_); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

void check_linear_arguments(const float* x, const float* w, float* y, int64_t tokens, int64_t in,
                            int64_t out) {
  if (tokens < 0 || in < 0 || out < 0) {
    detail::throw_error("cuda_linear: negative shape (tokens " + std::to_string(tokens) + ", in " +
                        std::to_string(in) + ", out " + std::to_string(out) + ")");
  }
  // Pointers are needed only when there is an output to write (and x, w only when in > 0).
  const bool has_output = tokens > 0 && out > 0;
  if (has_output && (y == nullptr || (in > 0 && (x == nullptr || w == nullptr)))) {
    detail::throw_error("cuda_linear: null x, w or y pointer for a non-empty shape (tokens " +
                        std::to_string(tokens) + ", in " + std::to_string(in) + ", out " +
                        std::to_string(out) + ")");
  }
}

}  // namespace

void cuda_linear(const float* x, const float* w, const float* bias, float* y, int64_t tokens, int64_t in,
                 int64_t out) {
  check_linear_arguments(x, w, y, tokens, in, out);
  if (tokens == 0 || out == 0) return;
  if (in == 0) {
    // An empty reduction: y = b. Done on the host: lda/ldb must be ≥ 1 for cuBLAS.
    for (int64_t t = 0; t < tokens; ++t) {
      float* row = y + t * out;
      if (bias != nullptr) {
        std::memcpy(row, bias, static_cast<size_t>(out) * sizeof(float));
      } else {
        std::memset(row, 0, static_cast<size_t>(out) * sizeof(float));
      }
    }
    return;
  }

  detail::DeviceBuffer<float> d_x(tokens * in), d_w(out * in), d_y(tokens * out), d_b(bias ? out : 0);
  d_x.upload(x);
  d_w.upload(w);
  if (bias != nullptr) d_b.upload(bias);

  CublasHandle handle;
  // Plain fp32 arithmetic: the CPU backend is the spec, and TF32 would miss the parity tolerance.
  SYMPRUNE_CUBLAS_CHECK(cublasSetMathMode(handle.get(), CUBLAS_PEDANTIC_MATH));
  // cuBLAS is column-major. Row-major y [tokens, out] is column-major yᵀ [out, tokens] = W xᵀ, with
  // row-major W [out, in] read as column-major Wᵀ [in, out] (so op = T) and x as xᵀ [in, tokens].
  const float alpha = 1.0f, beta = 0.0f;
  SYMPRUNE_CUBLAS_CHECK(cublasSgemm_64(handle.get(), CUBLAS_OP_T, CUBLAS_OP_N, out, tokens, in, &alpha,
                                       d_w.data(), in, d_x.data(), in, &beta, d_y.data(), out));
  if (bias != nullptr) {
    constexpr int kThreads = 256;
    const int64_t blocks_needed = (tokens * out + kThreads - 1) / kThreads;
    const int blocks = static_cast<int>(blocks_needed < 65535 ? blocks_needed : 65535);
    add_bias_kernel<<<blocks, kThreads>>>(d_y.data(), d_b.data(), tokens, out);
    SYMPRUNE_CUDA_CHECK(cudaGetLastError());
  }
  d_y.download(y);  // cudaMemcpy synchronizes with the default stream, so kernel faults surface here
}

}  // namespace symprune::cuda
