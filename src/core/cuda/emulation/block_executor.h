#pragma once
// How the CUDA emulation runs the threads of a block (emulated_cuda.cc keeps the CUDA side: launches,
// shared memory, warp operations). Two executors, chosen at compile time:
//  * fibers (the default): every CUDA thread of a block is a user-level context on the launching OS
//    thread, with a stack of its own; a barrier switches to the next thread that can go on. No OS thread
//    sleeps or wakes: on a 2-core machine a 256-thread barrier costs two switches of nanoseconds per
//    thread instead of about 300 µs of futex wake-ups (far more when other processes load the cores).
//    A barrier that can no longer fill (some thread of the block or warp never arrives, a hang on a GPU)
//    aborts the launch as soon as no thread of the block can go on.
//  * OS threads (ThreadSanitizer builds, scripts/racecheck.sh): every CUDA thread of a block is an OS
//    thread between std::barrier's, so two CUDA threads touching the same memory without a barrier between
//    them run concurrently and TSan reports the race. Such a launch aborts after 120 s without finishing.
#include <barrier>
#include <cstdint>
#include <functional>

#include "core/cuda/emulation/emulated_cuda.h"

#if defined(__SANITIZE_THREAD__)
#define SYMPRUNE_EMULATION_OS_THREADS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SYMPRUNE_EMULATION_OS_THREADS 1
#endif
#endif
#ifndef SYMPRUNE_EMULATION_OS_THREADS
#define SYMPRUNE_EMULATION_OS_THREADS 0
#endif

namespace symprune::cuda::emulation {

[[noreturn]] void abort_kernel(const char* what);

// What __syncthreads and the warp operations wait at: `count` threads of the running block arrive,
// then all of them go on (the barrier is reusable, like std::barrier).
class BlockBarrier {
 public:
  explicit BlockBarrier(int count);
  void arrive_and_wait();

 private:
#if SYMPRUNE_EMULATION_OS_THREADS
  std::barrier<> barrier_;
#else
  friend class FiberExecutor;
  int expected_ = 0;
  int arrived_ = 0;
  uint64_t generation_ = 0;
#endif
};

// Runs the blocks of `grid` one after another. Each block: `before_each_block()`, then every thread of
// `block` calls `body()`; a block starts only when every thread has left the one before (`__shared__`
// variables are statics, shared by all blocks).
void run_blocks(dim3 grid, dim3 block, const std::function<void()>& body,
                const std::function<void()>& before_each_block);

// The calling CUDA thread's linear index in its block (its thread and block indices: thread_index() and
// block_index() of emulated_cuda.h, defined with it in block_executor.cc).
int current_thread_linear();

}  // namespace symprune::cuda::emulation
