// Signal notices (core/interrupt.h) printed while the process is already exiting; the clean-up of a second
// signal against an output being moved into place.
#include "core/interrupt.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

namespace symprune {
namespace {

bool g_signal_while_exiting = false;  // set in the forked child only

// Constructed before the other static objects of the program (init_priority), so destroyed after them: a
// signal raised here reaches the watcher when every other static destructor has run, as mpirun's SIGTERM
// can reach a rank that is leaving main.
struct SignalAfterStaticDestructors {
  ~SignalAfterStaticDestructors() {
    if (!g_signal_while_exiting) return;
    ::raise(SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the watcher prints its notice
  }
};
__attribute__((init_priority(101))) SignalAfterStaticDestructors g_signal_after_static_destructors;

TEST(Interrupt, TheNoticeOfASignalDuringExitNamesTheProgram) {
  const std::filesystem::path log =
      std::filesystem::temp_directory_path() / ("interrupt_test_" + std::to_string(::getpid()) + ".log");
  // Longer than a short-string buffer: a destroyed prefix would be freed heap memory.
  const std::string prefix = "symprune_dist [rank 2/3] with a prefix longer than any short-string buffer";
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (!std::freopen(log.c_str(), "w", stderr)) ::_exit(90);
    interrupt::install();
    interrupt::set_notice_prefix(prefix);
    g_signal_while_exiting = true;
    std::exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  std::stringstream text;
  text << std::ifstream(log).rdbuf();
  std::filesystem::remove(log);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(text.str(),
            prefix +
                ": SIGTERM received: stopping at the next safe point and cleaning up (send it again "
                "to stop at once)\n");
}

// Runs `body` in a forked child with the handlers installed (stderr to /dev/null); the body sends the
// signals that should end the child before its 10 s wait is over. Returns the child's exit status.
int status_of_child(const std::function<void()>& body) {
  const pid_t child = ::fork();
  if (child < 0) return -1;
  if (child == 0) {
    if (!std::freopen("/dev/null", "w", stderr)) ::_exit(90);
    interrupt::install();
    body();
    std::this_thread::sleep_for(std::chrono::seconds(10));  // the watcher ends the process before this
    ::_exit(91);
  }
  int status = 0;
  if (::waitpid(child, &status, 0) != child) return -1;
  return status;
}

// Registers `root`/staging for clean-up and runs release_after with a move that sends two SIGTERMs (the
// second stops at once, removing what is registered), waits for the watcher to reach the clean-up list,
// then renames staging to `root`/out and returns `moved`. Returns the child's exit status.
int second_signal_during_move(const std::filesystem::path& root, bool moved) {
  return status_of_child([&] {
    interrupt::CleanupOnStop cleanup(root / "staging");
    cleanup.release_after([&] {
      ::raise(SIGTERM);
      ::raise(SIGTERM);
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      if (moved) std::filesystem::rename(root / "staging", root / "out");
      return moved;
    });
    // Registered until the watcher has ended the process: it takes the clean-up list after the move.
    std::this_thread::sleep_for(std::chrono::seconds(10));
  });
}

// On a file system without renameat2 an output replaces an earlier one by two renames (the old one aside,
// then the new one in): a second signal between them used to remove the complete new output (or checkpoint)
// still registered for clean-up. Now it waits for the move, and finds nothing left to remove.
TEST(Interrupt, ASecondSignalDuringAMoveIntoPlaceKeepsTheMovedOutput) {
  namespace fs = std::filesystem;
  for (const bool moved : {true, false}) {
    const fs::path root =
        fs::temp_directory_path() / ("interrupt_move_" + std::to_string(::getpid()) + (moved ? "_a" : "_b"));
    fs::remove_all(root);
    fs::create_directories(root / "staging");
    std::ofstream(root / "staging" / "model.safetensors") << "weights";
    const int status = second_signal_during_move(root, moved);
    ASSERT_TRUE(WIFEXITED(status)) << status;
    EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM) << moved;
    if (moved) {
      EXPECT_TRUE(fs::exists(root / "out" / "model.safetensors"));
    } else {  // not moved: still registered, so the second signal removes it
      EXPECT_FALSE(fs::exists(root / "staging"));
      EXPECT_FALSE(fs::exists(root / "out"));
    }
    fs::remove_all(root);
  }
}

// Optionally decides a saved stop (an Interrupted with exit code 75, as the pipeline throws once the
// checkpoint holds every finished block), then receives two SIGTERMs. Returns the child's exit status.
int two_signals(bool saved_stop) {
  return status_of_child([&] {
    if (saved_stop) (void)interrupt::Interrupted(SIGUSR1, "saved", 75);
    ::raise(SIGTERM);
    ::raise(SIGTERM);
  });
}

// srun --kill-on-bad-exit ends the ranks still tearing down when the first one has exited 75: that second
// signal used to turn a saved stop into 143, which a job script reads as a failure.
TEST(Interrupt, ASecondSignalAfterASavedStopEndsWithItsExitCode) {
  int status = two_signals(/*saved_stop=*/true);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 75);
  status = two_signals(/*saved_stop=*/false);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGTERM);
}

}  // namespace
}  // namespace symprune
