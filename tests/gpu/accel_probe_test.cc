// Accelerator probing must never throw and must explain an empty device list; compiled in every
// configuration (CUDA or not). Device-property checks skip when no device is visible.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/accel.h"

namespace symprune::accel {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(AccelProbe, CountIsConsistentAndNeverThrows) {
  int count = -1;
  ASSERT_NO_THROW(count = device_count());
  EXPECT_GE(count, 0);
  std::vector<DeviceInfo> list;
  ASSERT_NO_THROW(list = devices());
  EXPECT_EQ(static_cast<int>(list.size()), count);
  EXPECT_EQ(device_count(), count) << "the probe must be stable across calls";
}

TEST(AccelProbe, EmptyDeviceListComesWithAReason) {
  const std::string reason = unavailable_reason();
  if (device_count() > 0) {
    EXPECT_EQ(reason, "");
    return;
  }
  if (!compiled_with_cuda()) {
    EXPECT_THAT(reason, HasSubstr("built without CUDA"));
  } else {
    // e.g. "CUDA runtime: CUDA driver version is insufficient for CUDA runtime version
    // (cudaErrorInsufficientDriver)" on a machine without a driver.
    EXPECT_THAT(reason, StartsWith("CUDA runtime: "));
    EXPECT_GT(reason.size(), std::string("CUDA runtime: ").size());
  }
}

TEST(AccelProbe, DevicesHaveNamesMemoryAndComputeCapability) {
  if (device_count() == 0) GTEST_SKIP() << "no CUDA device: " << unavailable_reason();
  const auto list = devices();
  for (size_t i = 0; i < list.size(); ++i) {
    EXPECT_EQ(list[i].index, static_cast<int>(i));
    EXPECT_FALSE(list[i].name.empty());
    EXPECT_GT(list[i].total_memory_bytes, size_t{0});
    EXPECT_GE(list[i].compute_capability_major, 1);
    EXPECT_GE(list[i].compute_capability_minor, 0);
  }
}

}  // namespace
}  // namespace symprune::accel
