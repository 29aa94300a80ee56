// launch_linear in the CPU emulation: the tiled kernel (cuBLAS cannot run there).
#include "core/cuda/kernels/gemm_kernels.h"
#include "core/cuda/kernels/linear.h"

namespace symprune::cuda {

void launch_linear(const float* x, const float* w, const float* bias, int64_t rows, int64_t n, int64_t m,
                   float* y, DeviceStream stream) {
  launch_linear_tiled(x, w, bias, rows, n, m, y, stream);
}

}  // namespace symprune::cuda
