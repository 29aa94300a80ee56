// The real kernels need a CUDA device.
#include "core/accel.h"
#include "kernel_test_support.h"

namespace symprune::kernel_test {

void skip_without_device() {
  if (accel::device_count() == 0) GTEST_SKIP() << "no CUDA device: " << accel::unavailable_reason();
}
bool emulated_device() {
  return false;
}

}  // namespace symprune::kernel_test
