#include "core/interrupt.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/log.h"

namespace symprune::interrupt {
namespace fs = std::filesystem;

namespace {

std::atomic<int> g_received{0};
std::atomic<bool> g_local_checks{true};
std::atomic<int> g_saved_exit_code{0};  // set by an Interrupted with its own exit code (a saved stop)

// What the watcher thread reads, never destroyed: the detached watcher may print a notice while the process
// runs its static destructors (mpirun's SIGTERM reaching a rank that is already leaving main), and a
// destroyed string printed garbage there.
struct WatcherState {
  std::mutex prefix_mutex;
  std::string prefix = "symprune";
  std::mutex cleanup_mutex;
  std::vector<fs::path> cleanup_paths;
};
WatcherState& watcher_state() {
  static WatcherState* const state = new WatcherState;  // NOLINT: deliberately outlives every destructor
  return *state;
}

std::string notice_prefix() {
  WatcherState& state = watcher_state();
  const std::lock_guard lock(state.prefix_mutex);
  return state.prefix;
}

// SIGUSR1 is what Slurm sends before a time limit or preemption (--signal=B:USR1@T).
constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
int g_pipe[2] = {-1, -1};

// Async-signal-safe: hands the signal number to the watcher thread (whichever thread it interrupted,
// including threads that libraries started before main()).
void forward_signal(int signal) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal);
  [[maybe_unused]] const ssize_t ignored = ::write(g_pipe[1], &byte, 1);
  errno = saved_errno;
}

[[noreturn]] void stop_at_once(int signal) {
  std::string removed;
  {
    WatcherState& state = watcher_state();
    std::lock_guard<std::mutex> lock(state.cleanup_mutex);
    for (const auto& path : state.cleanup_paths) {
      std::error_code ec;
      // The main thread may still be adding files: retry a few times until the directory is gone.
      for (int attempt = 0; attempt < 5 && fs::exists(fs::symlink_status(path, ec)); ++attempt)
        fs::remove_all(path, ec);
      removed += removed.empty() ? "" : ", ";
      removed += path.string();
    }
  }
  const int saved_exit_code = g_saved_exit_code.load();
  const std::string message =
      notice_prefix() + ": second " + signal_name(signal) + ": stopped at once" +
      (removed.empty() ? std::string(" (nothing to clean up)") : "; removed the unfinished " + removed) +
      (saved_exit_code != 0 ? fmt::format("; the stop was saved before: exit {}\n", saved_exit_code)
                            : std::string("\n"));
  [[maybe_unused]] const ssize_t ignored = ::write(STDERR_FILENO, message.data(), message.size());
  ::_exit(saved_exit_code != 0 ? saved_exit_code : 128 + signal);
}

void watch() {
  while (true) {
    unsigned char byte = 0;
    const ssize_t n = ::read(g_pipe[0], &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n != 1) return;
    const int signal = byte;
    int expected = 0;
    if (g_received.compare_exchange_strong(expected, signal)) {
      log::write_to_stderr(notice_prefix() + ": " + signal_name(signal) +
                           " received: stopping at the next safe point and cleaning up (send it again to "
                           "stop at once)\n");
      continue;
    }
    stop_at_once(signal);
  }
}

}  // namespace

Interrupted::Interrupted(int signal, const std::string& detail, int exit_code)
    : Error("interrupted by " + signal_name(signal) + ": " +
            (detail.empty() ? std::string("stopped before finishing; unfinished outputs were removed")
                            : detail)),
      signal_(signal),
      exit_code_(exit_code) {
  if (exit_code != 0) g_saved_exit_code.store(exit_code);
}

void install() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (::pipe2(g_pipe, O_CLOEXEC) != 0) return;  // no pipe: signals keep their default action
    std::thread(watch).detach();
    struct sigaction action {};
    action.sa_handler = forward_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // interrupted system calls resume: the work stops at a safe point
    // SIGHUP ignored at start stays ignored: the run was started under nohup to outlive its terminal.
    // A closed pipe on the log or the printed output (`2>&1 | head`, a tee that died) would kill the run
    // with SIGPIPE, unfinished, leaving its lock and staging files: ignored, the writes fail (EPIPE) and the
    // run goes on to write its outputs, which are never pipes.
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, nullptr);
    for (int signal : kHandledSignals) {
      struct sigaction previous {};
      if (signal == SIGHUP && ::sigaction(signal, nullptr, &previous) == 0 && previous.sa_handler == SIG_IGN)
        continue;
      ::sigaction(signal, &action, nullptr);
    }
  });
}

void set_notice_prefix(std::string prefix) {
  WatcherState& state = watcher_state();
  const std::lock_guard lock(state.prefix_mutex);
  state.prefix = std::move(prefix);
}

int received() {
  return g_received.load(std::memory_order_relaxed);
}

void set_local_checks(bool enabled) {
  g_local_checks.store(enabled);
}

void check() {
  if (!g_local_checks.load(std::memory_order_relaxed)) return;
  const int signal = received();
  if (signal != 0) throw Interrupted(signal);
}

void simulate(int signal) {
  g_received.store(signal);
}

std::string signal_name(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    case SIGUSR1:
      return "SIGUSR1";
    default:
      return "signal " + std::to_string(signal);
  }
}

CleanupOnStop::CleanupOnStop(fs::path path) : path_(std::move(path)) {
  WatcherState& state = watcher_state();
  std::lock_guard<std::mutex> lock(state.cleanup_mutex);
  state.cleanup_paths.push_back(path_);
  registered_ = true;
}

CleanupOnStop::~CleanupOnStop() {
  release();
}

void CleanupOnStop::release() {
  if (registered_) release_after([] { return true; });
}

void CleanupOnStop::release_after(const std::function<bool()>& move_into_place) {
  WatcherState& state = watcher_state();
  std::lock_guard<std::mutex> lock(state.cleanup_mutex);
  if (!move_into_place() || !registered_) return;
  auto& paths = state.cleanup_paths;
  auto it = std::find(paths.begin(), paths.end(), path_);
  if (it != paths.end()) paths.erase(it);
  registered_ = false;
}

}  // namespace symprune::interrupt
