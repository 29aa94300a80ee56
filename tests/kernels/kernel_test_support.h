#pragma once
// Shared by the kernel parity tests of tests/kernels: they are built twice, against the CPU emulation
// of CUDA (symprune_kernel_emulated_tests, label unit, every machine) and against the real CUDA build
// (symprune_gpu_tests, label gpu, skipped without a device). The CPU implementation is the spec.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "support/error_text.h"

namespace symprune::kernel_test {

// Skips the test when the kernels need a device and none is visible.
void skip_without_device();
// Whether the kernels run in the CPU emulation (every CUDA thread an OS thread: whole-model tests there
// use small sizes).
bool emulated_device();

class KernelTest : public ::testing::Test {
 protected:
  void SetUp() override { skip_without_device(); }
};

inline std::vector<float> uniform_values(int64_t count, uint32_t seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(low, high);
  std::vector<float> out(static_cast<size_t>(count));
  for (auto& v : out) v = dist(rng);
  return out;
}

// Values from a few levels only, so that ties are everywhere.
inline std::vector<float> tied_values(int64_t count, uint32_t seed, int levels) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(0, levels - 1);
  std::vector<float> out(static_cast<size_t>(count));
  for (auto& v : out) v = static_cast<float>(dist(rng)) * 0.25f - 1.0f;
  return out;
}

using test::error_of;

}  // namespace symprune::kernel_test
