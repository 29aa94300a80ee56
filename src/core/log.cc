#include "core/log.h"

#include <spdlog/details/console_globals.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <string>

#include "core/error.h"

namespace symprune::log {
namespace {
int g_rank = 0;
}

void init(int rank, std::string_view level, int size) {
  g_rank = rank;
  std::string chosen(level);
  if (chosen.empty()) {  // an empty SYMPRUNE_LOG_LEVEL counts as unset (an empty --log-level is refused)
    const char* env = std::getenv("SYMPRUNE_LOG_LEVEL");
    chosen = env && *env ? env : "info";
  }
  // The six documented names only (spdlog also takes "warning", "err" and "critical").
  constexpr std::string_view kLevels[] = {"trace", "debug", "info", "warn", "error", "off"};
  SYMPRUNE_CHECK(std::find(std::begin(kLevels), std::end(kLevels), chosen) != std::end(kLevels),
                 "unknown log level '{}' (use trace, debug, info, warn, error or off)", chosen);
  const auto parsed = spdlog::level::from_str(chosen);
  // Logs go to stderr so stdout carries only results (tables, JSON).
  auto logger = spdlog::get("symprune");
  if (!logger) logger = spdlog::stderr_color_mt("symprune");
  spdlog::set_default_logger(logger);
  spdlog::set_pattern(size <= 1 ? "[%H:%M:%S] %^%l%$ %v"
                                : fmt::format("[%H:%M:%S] [rank {}/{}] %^%l%$ %v", rank, size));
  spdlog::set_level(parsed);
}

bool is_root() {
  return g_rank == 0;
}

void write_to_stderr(std::string_view text) {
  const std::lock_guard lock(spdlog::details::console_mutex::mutex());
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

}  // namespace symprune::log
