// Signal notices (core/interrupt.h) printed while the process is already exiting.
#include "core/interrupt.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

}  // namespace
}  // namespace symprune
