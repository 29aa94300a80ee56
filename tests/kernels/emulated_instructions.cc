// The CPU emulation's own checks (built with SYMPRUNE_CUDA_EMULATION only; the kernels' parity tests are
// the *_test.cc beside it):
//  * mma.sync m16n8k16 computes D = A·B + C exactly (small integers) when every lane holds its fragments
//    at the places the PTX ISA's tables give, for bf16 and fp16 operands;
//  * ldmatrix .x4, plain and transposed, gives each lane the elements the ISA's table gives, from rows at
//    any shared-memory addresses the lanes pass;
//  * a launch with more than 48 KiB of dynamic shared memory aborts unless that kernel opted in, as
//    cudaFuncSetAttribute works per kernel on a GPU;
//  * the block executor: every thread of every block runs with its own indices and locals, __syncthreads
//    and the warp operations exchange what each thread wrote before them, dynamic shared memory reads 0xFF
//    bytes at the start of every block; a barrier that some threads of the block skip aborts the launch.
// The places are written out here again from the ISA's tables, independently of emulated_mma.h's code.
#include <gtest/gtest.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "core/cuda/emulation/block_executor.h"
#include "core/cuda/kernel_platform.cuh"

namespace symprune::cuda {
namespace {

struct Place {
  int row, col;
};
// mma.m16n8k16, 16-bit A (16 × 16): elements a0..a7 of a lane, two per 32-bit register (the first low).
Place a_place(int lane, int i) {
  const int group = lane >> 2, in_group = lane % 4;
  const bool lower_half = i == 2 || i == 3 || i == 6 || i == 7;
  return {group + (lower_half ? 8 : 0), in_group * 2 + (i & 1) + (i >= 4 ? 8 : 0)};
}
// B (16 × 8, k × n): b0..b3.
Place b_place(int lane, int i) {
  return {(lane % 4) * 2 + (i & 1) + (i >= 2 ? 8 : 0), lane >> 2};
}
// C and D (16 × 8): c0..c3.
Place c_place(int lane, int i) {
  return {(lane >> 2) + (i >= 2 ? 8 : 0), (lane % 4) * 2 + (i & 1)};
}

template <bool kBf16>
__global__ void mma_kernel(const float* a, const float* b, const float* c, float* d) {
  const int lane = static_cast<int>(threadIdx.x);
  uint32_t ra[4], rb[2];
  float rd[4];
  for (int r = 0; r < 4; ++r) {
    const Place low = a_place(lane, 2 * r), high = a_place(lane, 2 * r + 1);
    ra[r] = pack_pair<kBf16>(a[low.row * 16 + low.col], a[high.row * 16 + high.col]);
  }
  for (int r = 0; r < 2; ++r) {
    const Place low = b_place(lane, 2 * r), high = b_place(lane, 2 * r + 1);
    rb[r] = pack_pair<kBf16>(b[low.row * 8 + low.col], b[high.row * 8 + high.col]);
  }
  for (int i = 0; i < 4; ++i) rd[i] = c[c_place(lane, i).row * 8 + c_place(lane, i).col];
  mma_m16n8k16<kBf16>(rd, ra, rb);
  for (int i = 0; i < 4; ++i) d[c_place(lane, i).row * 8 + c_place(lane, i).col] = rd[i];
}

TEST(EmulatedInstructions, MmaComputesTheProductOfThePtxFragments) {
  std::vector<float> a(16 * 16), b(16 * 8), c(16 * 8);
  for (int i = 0; i < 256; ++i) a[static_cast<size_t>(i)] = static_cast<float>((i * 7) % 9 - 4);
  for (int i = 0; i < 128; ++i) b[static_cast<size_t>(i)] = static_cast<float>((i * 5) % 7 - 3);
  for (int i = 0; i < 128; ++i) c[static_cast<size_t>(i)] = static_cast<float>(i % 11);
  for (const bool bf16 : {true, false}) {
    std::vector<float> d(16 * 8, -1.0f);
    auto* kernel = bf16 ? mma_kernel<true> : mma_kernel<false>;
    SYMPRUNE_LAUNCH(kernel, 1, 32, 0, nullptr, a.data(), b.data(), c.data(), d.data());
    for (int row = 0; row < 16; ++row)
      for (int col = 0; col < 8; ++col) {
        float expected = c[static_cast<size_t>(row * 8 + col)];
        for (int k = 0; k < 16; ++k)
          expected += a[static_cast<size_t>(row * 16 + k)] * b[static_cast<size_t>(k * 8 + col)];
        EXPECT_EQ(d[static_cast<size_t>(row * 8 + col)], expected)
            << (bf16 ? "bf16" : "fp16") << " at " << row << ", " << col;
      }
  }
}

// Lane L passes the address of shared row (5·L) % 32 of a 32 × 8 matrix of distinct values.
constexpr int kRowOf(int lane) {
  return (5 * lane) % 32;
}

__global__ void load_matrix_kernel(uint32_t* plain, uint32_t* transposed) {
  __shared__ uint16_t rows[32][8];
  const int lane = static_cast<int>(threadIdx.x);
  for (int c = 0; c < 8; ++c) rows[lane][c] = static_cast<uint16_t>(lane * 8 + c + 1);
  __syncwarp();
  uint32_t r[4];
  load_matrix_x4(r, &rows[kRowOf(lane)][0]);
  for (int i = 0; i < 4; ++i) plain[lane * 4 + i] = r[i];
  load_matrix_x4_trans(r, &rows[kRowOf(lane)][0]);
  for (int i = 0; i < 4; ++i) transposed[lane * 4 + i] = r[i];
}

TEST(EmulatedInstructions, LoadMatrixGivesEachLaneThePtxElements) {
  std::vector<uint32_t> plain(32 * 4), transposed(32 * 4);
  SYMPRUNE_LAUNCH(load_matrix_kernel, 1, 32, 0, nullptr, plain.data(), transposed.data());
  // Matrix i is rows 8i..8i+7 of the addresses passed; M_i[j][k] = the value at row kRowOf(8i + j), column k.
  const auto element = [](int matrix, int row, int col) {
    return static_cast<uint32_t>(kRowOf(8 * matrix + row) * 8 + col + 1);
  };
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      const int row = lane / 4, col = 2 * (lane % 4);
      EXPECT_EQ(plain[static_cast<size_t>(lane * 4 + i)], element(i, row, col) | element(i, row, col + 1)
                                                                                     << 16)
          << "lane " << lane << " register " << i;
      EXPECT_EQ(transposed[static_cast<size_t>(lane * 4 + i)], element(i, col, row) | element(i, col + 1, row)
                                                                                          << 16)
          << "transposed, lane " << lane << " register " << i;
    }
}

__global__ void shared_kernel_a(int* out) {
  SYMPRUNE_DYNAMIC_SHARED(int, scratch);
  scratch[threadIdx.x] = 1;
  __syncthreads();
  if (threadIdx.x == 0) *out = scratch[31];
}
__global__ void shared_kernel_b(int* out) {
  SYMPRUNE_DYNAMIC_SHARED(int, scratch);
  scratch[threadIdx.x] = 2;
  __syncthreads();
  if (threadIdx.x == 0) *out = scratch[31];
}

TEST(EmulatedInstructionsDeathTest, DynamicSharedMemoryAbove48KiBNeedsTheKernelsOptIn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  constexpr size_t kBytes = 64 * 1024;
  int out = 0;
  EXPECT_DEATH(SYMPRUNE_LAUNCH(shared_kernel_a, 1, 32, kBytes, nullptr, &out),
               "more dynamic shared memory than the kernel opted in for");
  SYMPRUNE_ALLOW_DYNAMIC_SHARED(shared_kernel_a, kBytes);
  SYMPRUNE_LAUNCH(shared_kernel_a, 1, 32, kBytes, nullptr, &out);
  EXPECT_EQ(out, 1);
  // Another kernel's opt-in is not this one's.
  EXPECT_DEATH(SYMPRUNE_LAUNCH(shared_kernel_b, 1, 32, kBytes, nullptr, &out),
               "more dynamic shared memory than the kernel opted in for");
  SYMPRUNE_LAUNCH(shared_kernel_b, 1, 32, 48 * 1024, nullptr, &out);
  EXPECT_EQ(out, 2);
}

// Block (32, 2, 2): 128 threads, four warps. Each thread: reads its dynamic shared slot (0xFF bytes
// at the block's start), writes its own value, then over `rounds` reads its neighbour's value written before
// the barrier, and sums its warp's values by shuffles; `out` gets one result per thread of the grid.
__global__ void exchange_kernel(int rounds, int* out, unsigned* fresh) {
  SYMPRUNE_DYNAMIC_SHARED(int, slots);
  const int threads = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
  const int linear = static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int block = static_cast<int>(blockIdx.x + gridDim.x * blockIdx.y);
  fresh[block * threads + linear] = static_cast<unsigned>(slots[linear]);
  int value = block * 1000 + linear;
  for (int round = 0; round < rounds; ++round) {
    slots[linear] = value;
    __syncthreads();
    const int neighbour = slots[(linear + 1) % threads];
    __syncthreads();
    int warp_sum = value;
    for (int offset = 16; offset > 0; offset /= 2) warp_sum += __shfl_xor_sync(0xffffffffu, warp_sum, offset);
    value = (neighbour + warp_sum) % 100003;
  }
  out[block * threads + linear] = value;
}

TEST(EmulatedExecution, BarriersAndShufflesExchangeWhatEveryThreadWroteBeforeThem) {
  const dim3 grid(3, 2), block(32, 2, 2);
  constexpr int kThreads = 128, kBlocks = 6, kRounds = 5;
  std::vector<int> out(kBlocks * kThreads, -1);
  std::vector<unsigned> fresh(kBlocks * kThreads, 0);
  SYMPRUNE_LAUNCH(exchange_kernel, grid, block, kThreads * sizeof(int), nullptr, kRounds, out.data(),
                  fresh.data());
  for (int b = 0; b < kBlocks; ++b) {
    std::vector<int> values(kThreads);
    for (int t = 0; t < kThreads; ++t) values[static_cast<size_t>(t)] = b * 1000 + t;
    for (int round = 0; round < kRounds; ++round) {
      std::vector<int> next(kThreads);
      for (int t = 0; t < kThreads; ++t) {
        int warp_sum = 0;
        for (int lane = 0; lane < 32; ++lane) warp_sum += values[static_cast<size_t>(t / 32 * 32 + lane)];
        next[static_cast<size_t>(t)] = (values[static_cast<size_t>((t + 1) % kThreads)] + warp_sum) % 100003;
      }
      values = next;
    }
    for (int t = 0; t < kThreads; ++t) {
      EXPECT_EQ(out[static_cast<size_t>(b * kThreads + t)], values[static_cast<size_t>(t)])
          << "block " << b << " thread " << t;
      EXPECT_EQ(fresh[static_cast<size_t>(b * kThreads + t)], 0xFFFFFFFFu)
          << "block " << b << " thread " << t;
    }
  }
}

// Each thread that launches has fibers of its own; a thread that exits retires them (their stacks, and
// under ASan their fake stacks, go with it). Launches before, from and after such threads agree.
TEST(EmulatedExecution, ThreadsThatLaunchAndExitAgreeWithTheLaunchingThread) {
  constexpr int kThreads = 128, kBlocks = 6;
  const auto run = [] {
    std::vector<int> out(kBlocks * kThreads, -1);
    std::vector<unsigned> fresh(kBlocks * kThreads, 0);
    SYMPRUNE_LAUNCH(exchange_kernel, dim3(3, 2), dim3(32, 2, 2), kThreads * sizeof(int), nullptr, 3,
                    out.data(), fresh.data());
    return out;
  };
  const std::vector<int> here = run();
  for (int round = 0; round < 3; ++round) {
    std::vector<int> there;
    std::thread thread([&] { there = run(); });
    thread.join();
    EXPECT_EQ(there, here) << "round " << round;
  }
  EXPECT_EQ(run(), here);
}

// Each thread writes its slot and then, with no barrier (the bug under test), reads both neighbours' slots.
__global__ void unsynchronized_neighbours_kernel(int* below, int* above) {
  SYMPRUNE_DYNAMIC_SHARED(int, slots);
  const int t = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
  slots[t] = t + 1;
  const int at = static_cast<int>(blockIdx.x) * n + t;
  below[at] = t > 0 ? slots[t - 1] : t;
  above[at] = t + 1 < n ? slots[t + 1] : t + 2;
}

// The fiber executor runs a block's threads between barriers one after the other, every other block from
// the last thread down: a read of another thread's write that no barrier orders reads a stale value in one
// of two consecutive blocks, whichever of the two threads comes first, so the parity tests see the race.
TEST(EmulatedExecution, AReadThatNoBarrierOrdersAfterTheWriteIsStaleInOneOfTwoBlocks) {
  if (SYMPRUNE_EMULATION_OS_THREADS)
    GTEST_SKIP() << "a real race under the OS-thread executor (TSan's to find)";
  constexpr int kThreads = 64;
  std::vector<int> below(2 * kThreads), above(2 * kThreads);
  SYMPRUNE_LAUNCH(unsynchronized_neighbours_kernel, 2, kThreads, kThreads * sizeof(int), nullptr,
                  below.data(), above.data());
  const auto stale_in = [&](const std::vector<int>& read, int block, int offset) {
    int stale = 0;
    for (int t = 0; t < kThreads; ++t)
      stale += read[static_cast<size_t>(block * kThreads + t)] != t + 1 + offset ? 1 : 0;
    return stale;
  };
  // One block read every lower neighbour's write and no higher one's; the other block the reverse.
  for (const int first : {0, 1}) {
    const int second = 1 - first;
    if (stale_in(below, first, -1) == 0) {
      EXPECT_EQ(stale_in(above, first, 1), kThreads - 1);
      EXPECT_EQ(stale_in(below, second, -1), kThreads - 1);
      EXPECT_EQ(stale_in(above, second, 1), 0);
      return;
    }
  }
  ADD_FAILURE() << "neither block read all its lower neighbours' writes";
}

__global__ void skipped_block_barrier_kernel(int* out) {
  if (threadIdx.x == 5) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}
__global__ void skipped_shuffle_kernel(int* out) {
  int value = static_cast<int>(threadIdx.x);
  if (threadIdx.x != 40) value += __shfl_down_sync(0xffffffffu, value, 1);
  out[threadIdx.x] = value;
}

TEST(EmulatedExecutionDeathTest, ABarrierThatSomeThreadsSkipAbortsTheLaunch) {
  if (SYMPRUNE_EMULATION_OS_THREADS)
    GTEST_SKIP() << "OS-thread executor: such a launch aborts only after 120 s";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<int> out(64, 0);
  EXPECT_DEATH(SYMPRUNE_LAUNCH(skipped_block_barrier_kernel, 2, 64, 0, nullptr, out.data()),
               "a barrier that not every thread of a block reaches");
  // Lane 8 of the second warp skips the shuffle: its warp waits, the first warp finishes.
  EXPECT_DEATH(SYMPRUNE_LAUNCH(skipped_shuffle_kernel, 1, 64, 0, nullptr, out.data()),
               "a barrier that not every thread of a block reaches");
}

}  // namespace
}  // namespace symprune::cuda
