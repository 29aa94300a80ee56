// The CPU emulation of the CUDA execution model (see emulated_cuda.h).
#include "core/cuda/emulation/emulated_cuda.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/cuda/emulation/block_executor.h"

dim3 blockDim;
dim3 gridDim;

namespace symprune::cuda::emulation {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

struct Launch {
  int threads = 0;
  std::unique_ptr<BlockBarrier> block_barrier;  // __syncthreads
  std::vector<std::unique_ptr<BlockBarrier>> warp_barriers;
  std::vector<uint64_t> warp_slots;   // [warps][32]
  std::vector<std::byte> warp_blobs;  // [warps][32][kMaxGatherBytes]
  std::vector<std::byte> shared_backing;
  std::byte* shared = nullptr;  // 16-byte aligned, like CUDA's dynamic shared memory
};

Launch* current = nullptr;

// The kernels that opted in to more than 48 KiB of dynamic shared memory, and how much.
std::mutex opt_in_mutex;
std::map<const void*, size_t> opted_in;

size_t dynamic_shared_limit(const void* kernel) {
  const std::lock_guard lock(opt_in_mutex);
  const auto it = opted_in.find(kernel);
  return it == opted_in.end() ? size_t{48 * 1024} : it->second;
}

BlockBarrier& warp_barrier() {
  return *current->warp_barriers[static_cast<size_t>(current_thread_linear() / 32)];
}

void check_warp_call(unsigned mask) {
  if (mask != kFullMask) abort_kernel("warp operation with a partial mask (the kernels use full warps only)");
  if ((current_thread_linear() / 32 + 1) * 32 > current->threads)
    abort_kernel("warp operation in a partial warp (block size not a multiple of 32)");
}

}  // namespace

void launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, const void* kernel,
            const std::function<void()>& body) {
  const int64_t threads = int64_t{block.x} * block.y * block.z;
  if (threads <= 0 || threads > 1024) abort_kernel("block size outside 1..1024 threads");
  if (int64_t{grid.x} * grid.y * grid.z <= 0) abort_kernel("empty grid");
  if (grid.y > 65535 || grid.z > 65535) abort_kernel("grid.y or grid.z above 65535");
  if (dynamic_shared_bytes > dynamic_shared_limit(kernel))
    abort_kernel("more dynamic shared memory than the kernel opted in for (48 KiB without opt-in)");

  static std::mutex launch_mutex;  // one launch at a time (__shared__ variables are statics)
  std::lock_guard guard(launch_mutex);
  Launch state;
  state.threads = static_cast<int>(threads);
  state.block_barrier = std::make_unique<BlockBarrier>(state.threads);
  const int warps = (state.threads + 31) / 32;
  for (int w = 0; w < warps; ++w)
    state.warp_barriers.push_back(std::make_unique<BlockBarrier>(std::min(32, state.threads - w * 32)));
  state.warp_slots.assign(static_cast<size_t>(warps) * 32, 0);
  state.warp_blobs.resize(static_cast<size_t>(warps) * 32 * kMaxGatherBytes);
  state.shared_backing.resize(dynamic_shared_bytes + 16);
  state.shared = reinterpret_cast<std::byte*>(
      (reinterpret_cast<uintptr_t>(state.shared_backing.data()) + 15) & ~uintptr_t{15});
  current = &state;
  blockDim = block;
  gridDim = grid;

  // Uninitialized shared memory reads as 0xFF bytes (NaN floats, all-ones integers), at every block.
  run_blocks(grid, block, body, [&] {
    if (dynamic_shared_bytes > 0) std::memset(state.shared, 0xFF, dynamic_shared_bytes);
  });
  current = nullptr;
}

void* dynamic_shared() {
  return current->shared;
}

void sync_block() {
  current->block_barrier->arrive_and_wait();
}

void sync_warp(unsigned mask) {
  check_warp_call(mask);
  warp_barrier().arrive_and_wait();
}

uint64_t warp_exchange(unsigned mask, uint64_t value, int source_lane) {
  check_warp_call(mask);
  const size_t base = static_cast<size_t>(current_thread_linear() / 32) * 32;
  current->warp_slots[base + static_cast<size_t>(current_thread_linear() % 32)] = value;
  warp_barrier().arrive_and_wait();
  const uint64_t result = current->warp_slots[base + static_cast<size_t>(source_lane)];
  // No lane may publish its next value before every lane has read this one.
  warp_barrier().arrive_and_wait();
  return result;
}

void warp_all_gather(unsigned mask, const void* mine, size_t bytes, void* all) {
  check_warp_call(mask);
  if (bytes > kMaxGatherBytes) abort_kernel("warp_all_gather of more than kMaxGatherBytes per lane");
  std::byte* warp_base =
      current->warp_blobs.data() + static_cast<size_t>(current_thread_linear() / 32) * 32 * kMaxGatherBytes;
  std::memcpy(warp_base + static_cast<size_t>(current_thread_linear() % 32) * kMaxGatherBytes, mine, bytes);
  warp_barrier().arrive_and_wait();
  for (size_t lane = 0; lane < 32; ++lane)
    std::memcpy(static_cast<std::byte*>(all) + lane * bytes, warp_base + lane * kMaxGatherBytes, bytes);
  warp_barrier().arrive_and_wait();
}

void opt_in_dynamic_shared(const void* kernel, size_t bytes) {
  if (bytes > 227 * 1024) abort_kernel("more than 227 KiB of dynamic shared memory asked for");
  const std::lock_guard lock(opt_in_mutex);
  opted_in[kernel] = bytes;
}

unsigned warp_ballot(unsigned mask, bool predicate) {
  check_warp_call(mask);
  const size_t base = static_cast<size_t>(current_thread_linear() / 32) * 32;
  current->warp_slots[base + static_cast<size_t>(current_thread_linear() % 32)] = predicate ? 1 : 0;
  warp_barrier().arrive_and_wait();
  unsigned bits = 0;
  for (unsigned lane = 0; lane < 32; ++lane)
    bits |= static_cast<unsigned>(current->warp_slots[base + lane]) << lane;
  warp_barrier().arrive_and_wait();
  return bits;
}

}  // namespace symprune::cuda::emulation
