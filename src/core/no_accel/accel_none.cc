#include "core/accel.h"

namespace symprune::accel {

bool compiled_with_cuda() { return false; }
int device_count() { return 0; }
std::vector<DeviceInfo> devices() { return {}; }
std::string unavailable_reason() { return "built without CUDA (configure with -DSYMPRUNE_WITH_CUDA=ON)"; }

}  // namespace symprune::accel
