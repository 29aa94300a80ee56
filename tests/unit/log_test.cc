// The pacing of progress lines: at most one per period, the first one period after the start.
#include "core/log.h"

#include <gtest/gtest.h>

#include <chrono>

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

}  // namespace
}  // namespace symprune::log
