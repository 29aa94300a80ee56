// launch_linear in the CPU emulation: the tiled kernel (cuBLAS cannot run there).
#include "core/cuda/kernels/gemm_kernels.h"
#include "core/cuda/kernels/linear.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace symprune::cuda {

void launch_linear(const float* x, const float* w, const float* bias, int64_t rows, int64_t n, int64_t m,
                   float* y, DeviceStream stream) {
  launch_linear_tiled(x, w, bias, rows, n, m, y, stream);
}

// Xᵀ on the host (emulated device memory is host memory), then XᵀX = linear(Xᵀ, Xᵀ) by the tiled kernel.
void launch_gram(const float* x, int64_t rows, int64_t n, float* g, DeviceStream stream) {
  if (n <= 0) return;
  DeviceArray<float> transposed(n * rows);
  transpose_matrix(x, rows, n, transposed.data());
  launch_linear_tiled(transposed.data(), transposed.data(), nullptr, n, rows, n, g, stream);
}

// Products of two 16-bit values are exact in fp32, so the tiled fp32 kernel on the widened operands is
// the 16-bit product with fp32 accumulation. The widening that cuBLAS does inside its kernel is done here
// on the host (emulated device memory is host memory), which keeps the emulated runs short.
void launch_linear_16bit(const void* x_rounded, const void* w, DType dtype, const float* bias, int64_t rows,
                         int64_t n, int64_t m, float* y, DeviceStream stream) {
  DeviceArray<float> x_wide(rows * n), w_wide(m * n);
  convert_to_f32(dtype, x_rounded, x_wide.data(), rows * n);
  convert_to_f32(dtype, w, w_wide.data(), m * n);
  launch_linear_tiled(x_wide.data(), w_wide.data(), bias, rows, n, m, y, stream);
}

void launch_gemm_strided_batched_16bit(int64_t m, int64_t n, int64_t k, float alpha, StridedOperand a,
                                       StridedOperand b, DType dtype, float* c, int64_t ldc, int64_t stride_c,
                                       int64_t batch, DeviceStream) {
  const auto* a16 = static_cast<const uint16_t*>(a.data);
  const auto* b16 = static_cast<const uint16_t*>(b.data);
  const auto widen = [dtype](uint16_t bits) {
    float value = 0.0f;
    convert_to_f32(dtype, &bits, &value, 1);
    return value;
  };
  for (int64_t batch_index = 0; batch_index < batch; ++batch_index) {
    const uint16_t* ab = a16 + batch_index * a.stride;
    const uint16_t* bb = b16 + batch_index * b.stride;
    float* cb = c + batch_index * stride_c;
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = 0; i < m; ++i) {
        float sum = 0.0f;
        for (int64_t l = 0; l < k; ++l) {
          const float x = widen(a.transposed ? ab[i * a.ld + l] : ab[l * a.ld + i]);
          const float y = widen(b.transposed ? bb[l * b.ld + j] : bb[j * b.ld + l]);
          sum += x * y;  // the product of two 16-bit values is exact in fp32
        }
        cb[j * ldc + i] = alpha * sum;
      }
  }
}

}  // namespace symprune::cuda
