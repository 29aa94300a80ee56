// The pacing of progress lines: at most one per period, the first one period after the start. Notices written
// outside the logger wait for a log line in progress.
#include "core/log.h"

#include <gtest/gtest.h>
#include <spdlog/details/console_globals.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

namespace symprune::log {
namespace {

using std::chrono::milliseconds;

TEST(ProgressPacer, AllowsOneLinePerPeriodCountedFromTheLastLine) {
  const ProgressPacer::Clock::time_point start{};
  ProgressPacer pacer(2.0, start);
  EXPECT_FALSE(pacer.due(start));
  EXPECT_FALSE(pacer.due(start + milliseconds(1999)));
  EXPECT_TRUE(pacer.due(start + milliseconds(2000)));
  EXPECT_FALSE(pacer.due(start + milliseconds(2000)));
  EXPECT_FALSE(pacer.due(start + milliseconds(3999)));  // 1.999 s after the line at 2 s
  EXPECT_TRUE(pacer.due(start + milliseconds(4500)));
  EXPECT_FALSE(pacer.due(start + milliseconds(6000)));  // the period restarts at 4.5 s, not at 4 s
  EXPECT_TRUE(pacer.due(start + milliseconds(6500)));
}

TEST(ProgressPacer, AFractionalPeriodIsKept) {
  const ProgressPacer::Clock::time_point start{};
  ProgressPacer pacer(0.25, start);
  EXPECT_FALSE(pacer.due(start + milliseconds(249)));
  EXPECT_TRUE(pacer.due(start + milliseconds(250)));
}

// A colour terminal gets a log line in several writes under spdlog's console lock: a notice written meanwhile
// (a signal's, from the watcher thread) waits for that lock instead of landing inside the line.
TEST(WriteToStderr, WaitsForALogLineInProgress) {
  std::unique_lock line_in_progress(spdlog::details::console_mutex::mutex());
  std::atomic<bool> written{false};
  std::thread notice([&] {
    write_to_stderr("");
    written = true;
  });
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_FALSE(written);
  line_in_progress.unlock();
  notice.join();
  EXPECT_TRUE(written);
}

}  // namespace
}  // namespace symprune::log
