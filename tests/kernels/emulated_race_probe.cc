// Shows that ThreadSanitizer sees races between the CUDA threads of an emulated block (scripts/racecheck.sh
// runs it first, in the SYMPRUNE_TSAN build): each thread of a 64-thread block writes its slot of shared
// memory and then reads its neighbour's, the way a kernel missing a __syncthreads (or, within a warp, a
// __syncwarp) would. With the barrier the same kernel is race-free, and TSan must stay silent.
//
//   emulated_race_probe block|warp|barrier|warp-barrier
// prints the neighbour sum and exits 0; under TSan the racy modes end with its report (exit 66).
#include <cstdio>
#include <cstring>

#include "core/cuda/kernel_platform.cuh"

namespace {

constexpr int kThreads = 64;

enum class Sync { kNone, kBlock, kWarp };

__global__ void neighbour_sum_kernel(Sync sync, int stride, int* out) {
  __shared__ int slots[kThreads];
  const int t = static_cast<int>(threadIdx.x);
  slots[t] = t + 1;
  if (sync == Sync::kBlock) __syncthreads();
  if (sync == Sync::kWarp) __syncwarp();
  // stride 32 reads another warp's slot, stride 1 one of the same warp (lane 31 wraps within its warp).
  const int neighbour = stride == 32 ? (t + 32) % kThreads : (t / 32) * 32 + (t % 32 + 1) % 32;
  atomicAdd(out, slots[neighbour]);
}

}  // namespace

int main(int argc, char** argv) {
  const char* mode = argc == 2 ? argv[1] : "";
  Sync sync = Sync::kNone;
  int stride = 32;
  if (std::strcmp(mode, "block") == 0) {
  } else if (std::strcmp(mode, "warp") == 0) {
    stride = 1;
  } else if (std::strcmp(mode, "barrier") == 0) {
    sync = Sync::kBlock;
  } else if (std::strcmp(mode, "warp-barrier") == 0) {
    sync = Sync::kWarp;
    stride = 1;
  } else {
    std::fprintf(stderr, "usage: emulated_race_probe block|warp|barrier|warp-barrier\n");
    return 2;
  }
  int sum = 0;
  SYMPRUNE_LAUNCH(neighbour_sum_kernel, dim3(1), dim3(kThreads), 0, nullptr, sync, stride, &sum);
  const int expected = kThreads * (kThreads + 1) / 2;
  std::printf("emulated_race_probe %s: neighbour sum %d (expected %d)\n", mode, sum, expected);
  return sum == expected ? 0 : 1;
}
