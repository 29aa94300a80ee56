// Accelerator probing with the CUDA runtime. cudart is linked statically and loads the driver
// (libcuda.so.1) at run time, so any failure here (no driver, no device, driver too old) means
// "zero devices" plus the runtime's explanation, never a crash or an exception.
#include "core/accel.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

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

}  // namespace symprune::accel
