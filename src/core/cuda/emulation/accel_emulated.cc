// Accelerator probing for binaries linked with the CPU emulation of CUDA (tests only, never the
// product): one emulated device, so `--device cuda` runs the CUDA backend's host code and its kernels
// on the CPU. Multi-process tests use it to run the device pipeline over several ranks on machines
// without a GPU.
#include "core/accel.h"
#include "core/backend.h"
#include "core/cuda/device_memory.h"
#include "core/cuda/kernels/cuda_backend.h"
#include "core/error.h"

namespace symprune::accel {

bool compiled_with_cuda() {
  return true;
}
int device_count() {
  return 1;
}
std::vector<DeviceInfo> devices() {
  int64_t free_bytes = 0, total_bytes = 0;
  cuda::device_memory_info(&free_bytes, &total_bytes);
  return {DeviceInfo{0, "CPU emulation of CUDA", static_cast<size_t>(total_bytes), 0, 0}};
}
std::string unavailable_reason() {
  return {};
}

Backend& backend_for_device(std::string_view device, int local_rank) {
  SYMPRUNE_CHECK(device == "auto" || device == "cpu" || device == "cuda",
                 "--device must be auto, cpu or cuda, got '{}'", device);
  if (device == "cpu") return cpu_backend();
  // Every rank shares the one emulated device, as ranks share a GPU when there are fewer GPUs.
  const int selected = device_for_local_rank(local_rank);
  cuda::set_current_device(selected);
  cuda::set_cuda_backend_device(selected);
  return cuda::cuda_backend();
}

}  // namespace symprune::accel
