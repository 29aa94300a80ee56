#pragma once
// Host-only header: the CUDA backend, core::Backend on tensors in device memory (device_resident()).
// Its ops are the kernels of this folder plus launch_linear (cuBLAS; the tiled kernel in the CPU
// emulation, where this backend runs whole models in tests). Outputs are allocated on the device when they
// are not already device tensors of the right shape (a reused workspace allocates once).
#include "core/backend.h"

namespace symprune::cuda {

// The process-wide CUDA backend (device 0, the default stream).
Backend& cuda_backend();

}  // namespace symprune::cuda
