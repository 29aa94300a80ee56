#pragma once
// Interrupts (SIGINT, SIGTERM, SIGHUP, SIGUSR1) end a run cleanly instead of leaving half-written outputs.
//
// install() runs first in main(): it installs a handler (SA_RESTART, so no system call of the work fails
// with EINTR) that only writes the signal number to a pipe, whatever thread it lands on, and starts one
// watcher thread that reads the pipe. The first signal only sets a flag: the work checks it at safe points
// (between micro-batches, blocks, evaluation batches and output files) through check(), which throws
// Interrupted; the exception unwinds like any other error, so staging directories and temporary files are
// removed by their destructors and the command exits with 128 + signal number. A second signal stops at once:
// the watcher removes every path registered with CleanupOnStop (staging directories, temporary files) and
// ends the process with _exit(128 + signal), or with the exit code of a saved stop already decided (below).
//
// Without install() (unit tests, library use) check() never throws and CleanupOnStop is a no-op list.
#include <filesystem>
#include <functional>
#include <string>

#include "core/error.h"

namespace symprune::interrupt {

class Interrupted : public Error {
 public:
  // what(): "interrupted by SIGINT: <detail>"; the default detail says nothing unfinished was kept.
  // exit_code 0 means 128 + signal; a run that saved a checkpoint before stopping gives its own code. Such
  // a stop is saved once it is decided: from then on a second signal (a launcher ending the ranks that are
  // still tearing down, e.g. srun --kill-on-bad-exit when the first rank has exited) ends the process with
  // that code too, not 128 + signal.
  explicit Interrupted(int signal, const std::string& detail = "", int exit_code = 0);
  int signal() const { return signal_; }
  // 128 + signal, the shell's convention for a process ended by a signal, unless set.
  int exit_code() const { return exit_code_ != 0 ? exit_code_ : 128 + signal_; }

 private:
  int signal_;
  int exit_code_;
};

void install();

// The first signal received (SIGINT, SIGTERM, SIGHUP or SIGUSR1), or 0.
int received();

// Throws Interrupted when a signal has been received, unless local checks are off (below).
void check();

// In a run of several ranks one rank must not stop alone while the others wait for it in a collective:
// the pipeline then turns local checks off and stops at points where all ranks agree (a collective over
// received()). On by default.
void set_local_checks(bool enabled);

// What the notices printed when a signal arrives start with: "symprune" unless set (symprune_dist names
// itself and the rank, as its log lines do). Set it before signals may arrive (the watcher reads it).
void set_notice_prefix(std::string prefix);

// "SIGINT", "SIGTERM", ...
std::string signal_name(int signal);

// For tests: behave as if `signal` had been received (0 clears).
void simulate(int signal);

// Registers a path (file or directory) to remove if the process is stopped at once by a second signal;
// unregistered on destruction. Paths that are installed as final outputs must be released() first.
class CleanupOnStop {
 public:
  explicit CleanupOnStop(std::filesystem::path path);
  ~CleanupOnStop();
  CleanupOnStop(const CleanupOnStop&) = delete;
  CleanupOnStop& operator=(const CleanupOnStop&) = delete;
  void release();
  // Runs `move_into_place` (the renames that install the path as a final output) with the clean-up list
  // locked, and releases the path if it returns true: a second signal during the renames waits for them,
  // instead of removing a complete output whose old version was already moved aside. If it returns false or
  // throws, the path stays registered. `move_into_place` must not construct or release a CleanupOnStop (the
  // list's lock is held).
  void release_after(const std::function<bool()>& move_into_place);

 private:
  std::filesystem::path path_;
  bool registered_ = false;
};

}  // namespace symprune::interrupt
