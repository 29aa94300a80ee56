// The memory a run may still use: the cgroup of this process and its ancestors, as /proc/self/cgroup names
// them (a Slurm job step's cgroup sits below the job's, whose --mem limit binds it).
#include "core/system_memory.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "support/test_support.h"

namespace symprune {
namespace {

namespace fs = std::filesystem;

void write(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file) << text << "\n";
}

class CgroupRemaining : public ::testing::Test {
 protected:
  void SetUp() override { mount = symprune::testing::make_temp_dir("cgroup_"); }
  void TearDown() override { fs::remove_all(mount); }
  fs::path mount;  // stands for /sys/fs/cgroup
};

TEST_F(CgroupRemaining, V2TakesTheSmallestAllowanceOfTheCgroupAndItsAncestors) {
  write(mount / "cgroup.controllers", "cpu memory");
  // The job's limit (1 GB, 400 MB used) binds its step, whose own limit is "max".
  write(mount / "slurm/job_7/memory.max", "1000000000");
  write(mount / "slurm/job_7/memory.current", "400000000");
  write(mount / "slurm/job_7/step_0/memory.max", "max");
  write(mount / "slurm/job_7/step_0/memory.current", "100");
  EXPECT_EQ(detail::cgroup_remaining_bytes("0::/slurm/job_7/step_0\n", mount), uint64_t{600000000});
  // A tighter step limit wins.
  write(mount / "slurm/job_7/step_0/memory.max", "300000000");
  EXPECT_EQ(detail::cgroup_remaining_bytes("0::/slurm/job_7/step_0\n", mount), uint64_t{300000000 - 100});
  // Over the limit: nothing left, not a wrapped-around number.
  write(mount / "slurm/job_7/memory.current", "1200000000");
  EXPECT_EQ(detail::cgroup_remaining_bytes("0::/slurm/job_7/step_0\n", mount), uint64_t{0});
  // The root cgroup, or no limit anywhere: none.
  EXPECT_EQ(detail::cgroup_remaining_bytes("0::/\n", mount), std::nullopt);
  EXPECT_EQ(detail::cgroup_remaining_bytes("0::/elsewhere\n", mount), std::nullopt);
}

TEST_F(CgroupRemaining, V1ReadsTheMemoryControllersCgroup) {
  const fs::path memory = mount / "memory";
  // No limit is a number near 2^63 in v1.
  write(memory / "memory.limit_in_bytes", "9223372036854771712");
  write(memory / "memory.usage_in_bytes", "6000000000");
  write(memory / "process_api/job/memory.limit_in_bytes", "8000000000");
  write(memory / "process_api/job/memory.usage_in_bytes", "5000000000");
  const std::string cgroups = "9:name=systemd:/\n4:memory:/process_api/job\n3:cpuset:/\n0::/\n";
  EXPECT_EQ(detail::cgroup_remaining_bytes(cgroups, mount), uint64_t{3000000000});
  // The controller may share its line with others.
  EXPECT_EQ(detail::cgroup_remaining_bytes("4:cpu,memory:/process_api/job\n", mount), uint64_t{3000000000});
  // A cgroup namespace shows its own cgroup as "/", mounted at the top: the top's files are read.
  write(memory / "memory.limit_in_bytes", "7000000000");
  EXPECT_EQ(detail::cgroup_remaining_bytes("4:memory:/\n", mount), uint64_t{1000000000});
  EXPECT_EQ(detail::cgroup_remaining_bytes("", mount), std::nullopt);
}

TEST(AvailableMemory, IsOverriddenForTestsAndTheResidentSizesAreRead) {
  ::setenv("SYMPRUNE_MEMORY_AVAILABLE", "12345", 1);
  EXPECT_EQ(available_memory_bytes(), uint64_t{12345});
  ::unsetenv("SYMPRUNE_MEMORY_AVAILABLE");
  // (Not compared: the kernel's high-water mark may lag a moment behind the resident size.)
  EXPECT_GT(resident_bytes().value_or(0), 0u);
  EXPECT_GT(peak_resident_bytes().value_or(0), 0u);
}

}  // namespace
}  // namespace symprune
