#pragma once
// Shared by the kernel parity tests of tests/kernels: they are built twice, against the CPU emulation
// of CUDA (symprune_kernel_emulated_tests, label unit, every machine) and against the real CUDA build
// (symprune_gpu_tests, label gpu, skipped without a device). The CPU implementation is the spec.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "support/error_text.h"

namespace symprune::kernel_test {

// Skips the test when the kernels need a device and none is visible.
void skip_without_device();
// Whether the kernels run in the CPU emulation (every CUDA thread of a grid in turn on one core: whole-model
// tests there use small sizes).
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

// Random q, k, v of an attention call (q and k in [-2, 2], v in [-1, 1]; seeds seed..seed+2), its scale
// 1/sqrt(head_dim), and the CPU backend's output for them (the specification).
struct AttentionCase {
  SequenceBatch batch;
  int64_t n_heads = 1, n_kv_heads = 1, head_dim = 1;
  Tensor q, k, v, expected;
  float scale = 1.0f;
};
inline AttentionCase attention_case(int64_t n_seqs, int64_t seq_len, int64_t n_heads, int64_t n_kv_heads,
                                    int64_t head_dim, uint32_t seed) {
  AttentionCase c{SequenceBatch{n_seqs, seq_len}, n_heads, n_kv_heads, head_dim};
  const int64_t rows = c.batch.rows(), qw = n_heads * head_dim, kw = n_kv_heads * head_dim;
  c.q = Tensor({rows, qw}, uniform_values(rows * qw, seed, -2.0f, 2.0f));
  c.k = Tensor({rows, kw}, uniform_values(rows * kw, seed + 1, -2.0f, 2.0f));
  c.v = Tensor({rows, kw}, uniform_values(rows * kw, seed + 2));
  c.scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  cpu_backend().attention(c.q, c.k, c.v, c.batch, n_heads, n_kv_heads, c.scale, c.expected);
  return c;
}

using test::error_of;

}  // namespace symprune::kernel_test
