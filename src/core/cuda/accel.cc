// Accelerator probing with the CUDA runtime. cudart is linked statically and loads the driver
// (libcuda.so.1) at run time, so any failure here (no driver, no device, driver too old) means
// "zero devices" plus the runtime's explanation, never a crash or an exception.
#include "core/accel.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "core/backend.h"
#include "core/cuda/cuda_check.h"
#include "core/cuda/kernels/cuda_backend.h"
#include "core/error.h"

namespace symprune::accel {
namespace {

struct Probe {
  std::vector<DeviceInfo> devices;
  std::string reason;
};

Probe run_probe() {
  Probe probe;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();  // do not leave the failure for the next CUDA call to report
    probe.reason = fmt::format("CUDA runtime: {} ({})", cudaGetErrorString(status), cudaGetErrorName(status));
    return probe;
  }
  if (count <= 0) {
    probe.reason = "CUDA runtime: no CUDA-capable device is visible (check CUDA_VISIBLE_DEVICES)";
    return probe;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    const cudaError_t prop_status = cudaGetDeviceProperties(&prop, i);
    if (prop_status != cudaSuccess) {
      (void)cudaGetLastError();
      // A device the runtime counts but cannot describe is not usable; say which one and why.
      probe.reason = fmt::format("CUDA runtime: cannot query device {}: {} ({})", i,
                                 cudaGetErrorString(prop_status), cudaGetErrorName(prop_status));
      continue;
    }
    DeviceInfo info;
    info.index = i;
    info.name = prop.name;
    info.total_memory_bytes = prop.totalGlobalMem;
    info.compute_capability_major = prop.major;
    info.compute_capability_minor = prop.minor;
    info.memory_pools = prop.memoryPoolsSupported != 0;
    probe.devices.push_back(std::move(info));
  }
  return probe;
}

// Devices do not come and go during a run; probing once also keeps `info` and tests consistent.
const Probe& probe() {
  static const Probe result = run_probe();
  return result;
}

}  // namespace

bool compiled_with_cuda() {
  return true;
}
int device_count() {
  return static_cast<int>(probe().devices.size());
}
std::vector<DeviceInfo> devices() {
  return probe().devices;
}
std::string unavailable_reason() {
  return probe().devices.empty() ? probe().reason : std::string();
}

Backend& backend_for_device(std::string_view device, int local_rank) {
  SYMPRUNE_CHECK(device == "auto" || device == "cpu" || device == "cuda",
                 "--device must be auto, cpu or cuda, got '{}'", device);
  if (device == "cpu") return cpu_backend();
  if (device_count() == 0) {
    SYMPRUNE_CHECK(device == "auto", "--device cuda: no usable CUDA device: {}", unavailable_reason());
    return cpu_backend();
  }
  // One device per node-local rank (several ranks share a device when there are fewer devices).
  const int selected = device_for_local_rank(local_rank);
  SYMPRUNE_CUDA_CHECK(cudaSetDevice(selected));
  cuda::set_cuda_backend_device(selected);
  return cuda::cuda_backend();
}

}  // namespace symprune::accel
