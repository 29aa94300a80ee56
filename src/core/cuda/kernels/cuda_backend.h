#pragma once
// Host-only header: the CUDA backend, core::Backend on tensors in device memory (device_resident()).
// Its ops are the kernels of this folder plus launch_linear (cuBLAS; the tiled kernel in the CPU
// emulation, where this backend runs whole models in tests). Outputs are allocated on the device when they
// are not already device tensors of the right shape (a reused workspace allocates once).
#include "core/backend.h"

namespace symprune::cuda {

// The process-wide CUDA backend (the calling thread's device, the default stream; stored weights are
// uploaded on a stream of their own, Backend::from_stored).
Backend& cuda_backend();
// The device the backend's uploads use when called from another thread (a new host thread starts on
// device 0): accel::backend_for_device sets the one it selects.
void set_cuda_backend_device(int device);

}  // namespace symprune::cuda
