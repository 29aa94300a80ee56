#include "core/accel.h"
#include "core/backend.h"
#include "core/error.h"

namespace symprune::accel {

bool compiled_with_cuda() {
  return false;
}
int device_count() {
  return 0;
}
std::vector<DeviceInfo> devices() {
  return {};
}
std::string unavailable_reason() {
  return "built without CUDA (configure with -DSYMPRUNE_WITH_CUDA=ON)";
}

Backend& backend_for_device(std::string_view device, int) {
  SYMPRUNE_CHECK(device == "auto" || device == "cpu" || device == "cuda",
                 "--device must be auto, cpu or cuda, got '{}'", device);
  SYMPRUNE_CHECK(device != "cuda", "--device cuda: this symprune was {}", unavailable_reason());
  return cpu_backend();
}

}  // namespace symprune::accel
