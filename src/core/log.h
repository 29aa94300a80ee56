#pragma once
// One logging entry point (DESIGN.md §7.4): rank 0 talks at info, other ranks only warn and above.
// Calling init again (the rank becomes known after MPI starts) replaces the settings.
// Level from --log-level or SYMPRUNE_LOG_LEVEL (trace, debug, info, warn, error, off).
#include <spdlog/spdlog.h>

#include <chrono>
#include <string_view>

namespace symprune::log {

// With size > 1 every line carries "[rank r/R]".
void init(int rank = 0, std::string_view level = {}, int size = 1);
bool is_root();

template <typename... Args>
void info(spdlog::format_string_t<Args...> format, Args&&... args) {
  if (is_root()) spdlog::info(format, std::forward<Args>(args)...);
}
template <typename... Args>
void debug(spdlog::format_string_t<Args...> format, Args&&... args) {
  if (is_root()) spdlog::debug(format, std::forward<Args>(args)...);
}
// Whether debug() lines are written (rank 0 at debug level or lower): for work a line needs first.
inline bool debug_enabled() {
  return is_root() && spdlog::should_log(spdlog::level::debug);
}
template <typename... Args>
void warn(spdlog::format_string_t<Args...> format, Args&&... args) {
  spdlog::warn(format, std::forward<Args>(args)...);
}
// A warning that every rank would give alike (the same file read, an error all ranks agreed on): said once,
// by rank 0.
template <typename... Args>
void warn_on_root(spdlog::format_string_t<Args...> format, Args&&... args) {
  if (is_root()) spdlog::warn(format, std::forward<Args>(args)...);
}
template <typename... Args>
void error(spdlog::format_string_t<Args...> format, Args&&... args) {
  spdlog::error(format, std::forward<Args>(args)...);
}

// Writes `text` to stderr whole, between log lines: a line of the logger reaches a colour terminal in several
// writes (text, colour, level, reset, text) under spdlog's console lock, which this takes too. For notices
// printed outside the logger (a signal's, from the watcher thread).
void write_to_stderr(std::string_view text);

// How often long work (a pass through a block, writing a model) says how far it is, at info level.
inline constexpr double kProgressLineSeconds = 30.0;

// Paces the progress lines of long work: due(now) is true at most once per period, the first time one
// period after `start`.
class ProgressPacer {
 public:
  using Clock = std::chrono::steady_clock;
  ProgressPacer(double period_seconds, Clock::time_point start)
      : period_(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(period_seconds))),
        last_(start) {}
  bool due(Clock::time_point now) {
    if (now - last_ < period_) return false;
    last_ = now;
    return true;
  }

 private:
  Clock::duration period_;
  Clock::time_point last_;
};

}  // namespace symprune::log
