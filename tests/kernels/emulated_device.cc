// The emulated kernels run on the CPU: there is always a "device".
#include "kernel_test_support.h"

namespace symprune::kernel_test {

void skip_without_device() {}
bool emulated_device() {
  return true;
}

}  // namespace symprune::kernel_test
