// The executors of the CUDA emulation's blocks (see block_executor.h).
#include "core/cuda/emulation/block_executor.h"

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#if !SYMPRUNE_EMULATION_OS_THREADS
#include <sys/mman.h>
#include <unistd.h>
// The assembly switch does not keep a shadow stack: where the compiler was told of one (CET), swapcontext.
#if !defined(__x86_64__) || defined(SYMPRUNE_EMULATION_UCONTEXT) || (defined(__CET__) && (__CET__ & 2))
#define SYMPRUNE_EMULATION_USE_UCONTEXT 1
#include <ucontext.h>
#else
#define SYMPRUNE_EMULATION_USE_UCONTEXT 0
#endif
#if defined(__SANITIZE_ADDRESS__)
#define SYMPRUNE_EMULATION_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SYMPRUNE_EMULATION_ASAN 1
#endif
#endif
#ifdef SYMPRUNE_EMULATION_ASAN
#include <sanitizer/common_interface_defs.h>
#endif
#endif

namespace symprune::cuda::emulation {

void abort_kernel(const char* what) {
  std::fprintf(stderr, "emulated CUDA kernel error: %s\n", what);
  std::fflush(stderr);
  std::abort();
}

namespace {

thread_local int thread_linear = 0;
thread_local uint3 thread_index_of_this_thread{0, 0, 0};
thread_local uint3 block_index_of_this_thread{0, 0, 0};

uint3 thread_index_of(int linear, dim3 block) {
  const auto index = static_cast<unsigned>(linear);
  return uint3{index % block.x, index / block.x % block.y, index / (block.x * block.y)};
}

}  // namespace

int current_thread_linear() {
  return thread_linear;
}
uint3 thread_index() {
  return thread_index_of_this_thread;
}
uint3 block_index() {
  return block_index_of_this_thread;
}

#if SYMPRUNE_EMULATION_OS_THREADS

namespace {

// A launch that takes this long has a barrier that not every thread reaches (a hang on a GPU).
constexpr auto kLaunchTimeout = std::chrono::seconds(120);

// Threads are kept between launches (creating 256 per launch dominated the tests' time).
class WorkerPool {
 public:
  ~WorkerPool() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    start_.notify_all();
    for (auto& thread : threads_) thread.join();
  }

  // Runs job(i) for i in [0, count) on `count` threads and waits for all of them.
  void run(int count, std::function<void(int)> job) {
    std::unique_lock lock(mutex_);
    while (static_cast<int>(threads_.size()) < count) {
      const int index = static_cast<int>(threads_.size());
      threads_.emplace_back([this, index] { work(index); });
    }
    job_ = std::move(job);
    active_ = count;
    finished_ = 0;
    ++generation_;
    start_.notify_all();
    if (!done_.wait_for(lock, kLaunchTimeout, [&] { return finished_ == active_; }))
      abort_kernel("a launch did not finish in 120 s: a barrier that not every thread of a block reaches?");
  }

 private:
  void work(int index) {
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock lock(mutex_);
      start_.wait(lock, [&] { return stopping_ || (generation_ != seen && index < active_); });
      if (stopping_) return;
      seen = generation_;
      lock.unlock();
      job_(index);
      lock.lock();
      if (++finished_ == active_) done_.notify_one();
    }
  }

  std::mutex mutex_;
  std::condition_variable start_, done_;
  std::vector<std::thread> threads_;
  std::function<void(int)> job_;
  uint64_t generation_ = 0;
  int active_ = 0, finished_ = 0;
  bool stopping_ = false;
};

}  // namespace

BlockBarrier::BlockBarrier(int count) : barrier_(count) {}

void BlockBarrier::arrive_and_wait() {
  barrier_.arrive_and_wait();
}

void run_blocks(dim3 grid, dim3 block, const std::function<void()>& body,
                const std::function<void()>& before_each_block) {
  static WorkerPool pool;
  const int threads = static_cast<int>(block.x * block.y * block.z);
  std::barrier block_edge(threads);
  pool.run(threads, [&](int linear) {
    thread_linear = linear;
    thread_index_of_this_thread = thread_index_of(linear, block);
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) {
          // Every thread leaves the block before the next one is prepared and started.
          if (linear == 0) before_each_block();
          block_edge.arrive_and_wait();
          block_index_of_this_thread = uint3{x, y, z};
          body();
          block_edge.arrive_and_wait();
        }
  });
}

#else  // fibers

namespace {

// Room for the deepest kernel frame under ASan (mma fragments, warp gathers); pages are committed only
// when touched, so unused depth costs address space, not memory.
constexpr size_t kFiberStackBytes = size_t{1} << 20;

// A saved execution context: where a fiber (or the launching thread) stopped and goes on.
#if SYMPRUNE_EMULATION_USE_UCONTEXT
struct Context {
  ucontext_t state;
};
#else
struct Context {
  void* stack_pointer = nullptr;
};
#endif

}  // namespace
}  // namespace symprune::cuda::emulation

#if !SYMPRUNE_EMULATION_USE_UCONTEXT
// x86-64 System V: the callee-saved registers, MXCSR and the x87 control word go on the stack being left,
// its stack pointer into *save; the other stack's are restored and `ret` goes on where it stopped. A new
// context's first `ret` lands in fiber_entry, which calls r13(r12) (set up by start_context).
extern "C" void symprune_emulation_switch(void** save, void* load);
extern "C" void symprune_emulation_fiber_entry();
asm(R"(
  .pushsection .text
  .p2align 4
  .globl symprune_emulation_switch
  .hidden symprune_emulation_switch
  .type symprune_emulation_switch, @function
symprune_emulation_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size symprune_emulation_switch, .-symprune_emulation_switch

  .p2align 4
  .globl symprune_emulation_fiber_entry
  .hidden symprune_emulation_fiber_entry
  .type symprune_emulation_fiber_entry, @function
symprune_emulation_fiber_entry:
  .cfi_startproc
  .cfi_undefined rip
  movq %r12, %rdi
  callq *%r13
  ud2
  .cfi_endproc
  .size symprune_emulation_fiber_entry, .-symprune_emulation_fiber_entry
  .popsection
)");
#endif

namespace symprune::cuda::emulation {
namespace {

#if SYMPRUNE_EMULATION_USE_UCONTEXT
// makecontext passes int arguments only: the pointer goes in two halves.
void ucontext_entry(unsigned entry_high, unsigned entry_low, unsigned arg_high, unsigned arg_low) {
  const auto join = [](unsigned high, unsigned low) {
    return static_cast<uintptr_t>((uint64_t{high} << 32) | uint64_t{low});
  };
  reinterpret_cast<void (*)(void*)>(join(entry_high, entry_low))(
      reinterpret_cast<void*>(join(arg_high, arg_low)));
  abort_kernel("a fiber's entry returned");
}

void start_context(Context& context, std::byte* stack, size_t bytes, void (*entry)(void*), void* arg) {
  if (getcontext(&context.state) != 0) abort_kernel("getcontext failed");
  context.state.uc_stack.ss_sp = stack;
  context.state.uc_stack.ss_size = bytes;
  context.state.uc_link = nullptr;
  const uint64_t entry_bits = reinterpret_cast<uintptr_t>(entry), arg_bits = reinterpret_cast<uintptr_t>(arg);
  makecontext(&context.state, reinterpret_cast<void (*)()>(ucontext_entry), 4,
              static_cast<unsigned>(entry_bits >> 32), static_cast<unsigned>(entry_bits),
              static_cast<unsigned>(arg_bits >> 32), static_cast<unsigned>(arg_bits));
}

void switch_context(Context& from, Context& to) {
  if (swapcontext(&from.state, &to.state) != 0) abort_kernel("swapcontext failed");
}
#else
void start_context(Context& context, std::byte* stack, size_t bytes, void (*entry)(void*), void* arg) {
  const uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + bytes) & ~uintptr_t{15};
  // symprune_emulation_switch's frame, as it pops it: control words, r15, r14, r13, r12, rbx, rbp, the
  // return address; then two zero words (fiber_entry's stack, 16-byte aligned at its call).
  auto* frame = reinterpret_cast<uint64_t*>(top) - 10;
  uint32_t mxcsr = 0;
  uint16_t x87_control = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(x87_control));
  frame[0] = uint64_t{mxcsr} | (uint64_t{x87_control} << 32);
  frame[1] = frame[2] = 0;
  frame[3] = reinterpret_cast<uint64_t>(entry);
  frame[4] = reinterpret_cast<uint64_t>(arg);
  frame[5] = frame[6] = 0;
  frame[7] = reinterpret_cast<uint64_t>(&symprune_emulation_fiber_entry);
  frame[8] = frame[9] = 0;
  context.stack_pointer = frame;
}

void switch_context(Context& from, Context& to) {
  symprune_emulation_switch(&from.stack_pointer, to.stack_pointer);
}
#endif

// AddressSanitizer must know which stack runs (it keeps a fake stack per context for
// detect_stack_use_after_return); without ASan these do nothing.
void start_switch(void** fake_stack_save, const void* bottom, size_t size) {
#ifdef SYMPRUNE_EMULATION_ASAN
  __sanitizer_start_switch_fiber(fake_stack_save, bottom, size);
#else
  (void)fake_stack_save, (void)bottom, (void)size;
#endif
}
void finish_switch(void* fake_stack, const void** bottom_old, size_t* size_old) {
#ifdef SYMPRUNE_EMULATION_ASAN
  __sanitizer_finish_switch_fiber(fake_stack, bottom_old, size_old);
#else
  (void)fake_stack, (void)bottom_old, (void)size_old;
#endif
}

// One CUDA thread: its stack (a guard page below it turns an overflow into a fault) and where it stopped.
struct Fiber {
  Fiber() {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    mapping_bytes = kFiberStackBytes + page;
    void* memory = mmap(nullptr, mapping_bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (memory == MAP_FAILED) abort_kernel("no memory for an emulated thread's stack");
    if (mprotect(memory, page, PROT_NONE) != 0)
      abort_kernel("mprotect of an emulated stack's guard page failed");
    mapping = static_cast<std::byte*>(memory);
    stack = mapping + page;
  }
  ~Fiber() { munmap(mapping, mapping_bytes); }
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  std::byte* mapping = nullptr;
  size_t mapping_bytes = 0;
  std::byte* stack = nullptr;
  Context context;
  void* fake_stack = nullptr;  // ASan's, while the fiber is switched out
  bool started = false;
  bool finished = false;  // left the block's body
  const BlockBarrier* waiting_at = nullptr;
  uint64_t waiting_generation = 0;  // waits until waiting_at's generation moves past this
};

}  // namespace

// The fibers of one OS thread (the launching one): kept between launches and reused block after block.
// A fiber runs the body, marks itself finished and switches back; the next block resumes it from there.
class FiberExecutor {
 public:
  static FiberExecutor& of_this_thread() {
    static thread_local FiberExecutor executor;
    return executor;
  }

  FiberExecutor() = default;
  FiberExecutor(const FiberExecutor&) = delete;
  FiberExecutor& operator=(const FiberExecutor&) = delete;
  // Every started fiber waits in yield(): each leaves its stack for good, so that ASan frees its fake
  // stack (threads that launch and exit, like a prefetch thread, would otherwise leave theirs behind).
  ~FiberExecutor() {
    retiring_ = true;
    for (Fiber& fiber : fibers_)
      if (fiber.started) resume(fiber);
  }

  void run_blocks(dim3 grid, dim3 block, const std::function<void()>& body,
                  const std::function<void()>& before_each_block) {
    const int threads = static_cast<int>(block.x * block.y * block.z);
    while (static_cast<int>(fibers_.size()) < threads) fibers_.emplace_back();
    body_ = &body;
    for (unsigned z = 0; z < grid.z; ++z)
      for (unsigned y = 0; y < grid.y; ++y)
        for (unsigned x = 0; x < grid.x; ++x) {
          before_each_block();
          block_index_of_this_thread = uint3{x, y, z};
          run_block(threads, block, ++blocks_run_ % 2 == 0);
        }
    body_ = nullptr;
  }

  void wait_at(BlockBarrier& barrier) {
    if (++barrier.arrived_ == barrier.expected_) {
      barrier.arrived_ = 0;
      ++barrier.generation_;
      return;
    }
    if (running_ == nullptr) abort_kernel("__syncthreads or a warp operation outside a kernel");
    Fiber& self = *running_;
    self.waiting_at = &barrier;
    self.waiting_generation = barrier.generation_;
    yield();
  }

 private:
  // Round robin over the block's threads, skipping those whose barrier has not filled; a full round in
  // which none can go on while some have not finished is a barrier that can never fill. Every other block
  // (counted over launches, so a one-block kernel alternates too) goes round from the last thread down: a
  // thread that reads another's write with no barrier between them then reads it stale in one of the two
  // orders, so a missing barrier fails the parity tests instead of passing because lower threads ran first.
  void run_block(int threads, dim3 block, bool descending) {
    for (int i = 0; i < threads; ++i) {
      fibers_[static_cast<size_t>(i)].finished = false;
      fibers_[static_cast<size_t>(i)].waiting_at = nullptr;
    }
    int unfinished = threads;
    while (unfinished > 0) {
      bool progressed = false;
      for (int k = 0; k < threads; ++k) {
        const int i = descending ? threads - 1 - k : k;
        Fiber& fiber = fibers_[static_cast<size_t>(i)];
        if (fiber.finished) continue;
        if (fiber.waiting_at != nullptr) {
          if (fiber.waiting_at->generation_ == fiber.waiting_generation) continue;
          fiber.waiting_at = nullptr;
        }
        thread_linear = i;
        thread_index_of_this_thread = thread_index_of(i, block);
        resume(fiber);
        progressed = true;
        if (fiber.finished) --unfinished;
      }
      if (!progressed)
        abort_kernel(
            "a barrier that not every thread of a block reaches: each unfinished thread waits at one "
            "(a __syncthreads, __syncwarp or warp shuffle/vote that some threads skip; a hang on a GPU)");
    }
  }

  void resume(Fiber& fiber) {
    if (!fiber.started) {
      start_context(fiber.context, fiber.stack, kFiberStackBytes, &FiberExecutor::fiber_main, this);
      fiber.started = true;
    }
    running_ = &fiber;
    void* fake_stack = nullptr;
    start_switch(&fake_stack, fiber.stack, kFiberStackBytes);
    switch_context(launcher_, fiber.context);
    finish_switch(fake_stack, nullptr, nullptr);
    running_ = nullptr;
  }

  void yield() {
    Fiber& self = *running_;
    start_switch(&self.fake_stack, launcher_stack_bottom_, launcher_stack_size_);
    switch_context(self.context, launcher_);
    finish_switch(self.fake_stack, &launcher_stack_bottom_, &launcher_stack_size_);
  }

  [[noreturn]] static void fiber_main(void* executor_address) {
    auto& executor = *static_cast<FiberExecutor*>(executor_address);
    finish_switch(nullptr, &executor.launcher_stack_bottom_, &executor.launcher_stack_size_);
    for (;;) {
      (*executor.body_)();
      executor.running_->finished = true;
      executor.yield();
      if (executor.retiring_) break;
    }
    // No fake stack saved: ASan frees this fiber's.
    start_switch(nullptr, executor.launcher_stack_bottom_, executor.launcher_stack_size_);
    switch_context(executor.running_->context, executor.launcher_);
    abort_kernel("a retired emulated thread was resumed");
  }

  std::deque<Fiber> fibers_;  // a deque: growing it leaves the fibers where they are
  const std::function<void()>* body_ = nullptr;
  Fiber* running_ = nullptr;
  bool retiring_ = false;
  uint64_t blocks_run_ = 0;  // by this thread, over all launches: which way run_block goes round
  Context launcher_;
  const void* launcher_stack_bottom_ = nullptr;
  size_t launcher_stack_size_ = 0;
};

BlockBarrier::BlockBarrier(int count) : expected_(count) {}

void BlockBarrier::arrive_and_wait() {
  FiberExecutor::of_this_thread().wait_at(*this);
}

void run_blocks(dim3 grid, dim3 block, const std::function<void()>& body,
                const std::function<void()>& before_each_block) {
  FiberExecutor::of_this_thread().run_blocks(grid, block, body, before_each_block);
}

#endif

}  // namespace symprune::cuda::emulation
