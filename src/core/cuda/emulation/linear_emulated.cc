// launch_linear in the CPU emulation: the tiled kernel (cuBLAS cannot run there).
#include "core/cuda/kernels/convert_kernels.h"
#include "core/cuda/kernels/gemm_kernels.h"
#include "core/cuda/kernels/linear.h"
#include "core/dtype.h"

namespace symprune::cuda {

void launch_linear(const float* x, const float* w, const float* bias, int64_t rows, int64_t n, int64_t m,
                   float* y, DeviceStream stream) {
  launch_linear_tiled(x, w, bias, rows, n, m, y, stream);
}

// Products of two 16-bit values are exact in fp32, so the tiled fp32 kernel on the rounded operands is
// the 16-bit product with fp32 accumulation. x is rounded by the conversion kernel, as under CUDA; the
// widening that cuBLAS does inside its kernel is done here on the host (emulated device memory is host
// memory), which keeps the emulated runs short.
void launch_linear_16bit(const float* x, const void* w, DType w_dtype, const float* bias, int64_t rows,
                         int64_t n, int64_t m, void* x_scratch, float* y, DeviceStream stream) {
  launch_convert(x, DType::kF32, x_scratch, w_dtype, rows * n, stream);
  DeviceArray<float> x_rounded(rows * n), w_wide(m * n);
  convert_to_f32(w_dtype, x_scratch, x_rounded.data(), rows * n);
  convert_to_f32(w_dtype, w, w_wide.data(), m * n);
  launch_linear_tiled(x_rounded.data(), w_wide.data(), bias, rows, n, m, y, stream);
}

}  // namespace symprune::cuda
