#include "core/system_memory.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string_view>

namespace symprune {
namespace {

std::optional<uint64_t> read_number(const char* path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str()) return std::nullopt;
  return static_cast<uint64_t>(v);
}

std::optional<uint64_t> mem_available() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with("MemAvailable:")) continue;
    std::istringstream fields(line.substr(13));
    uint64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return std::nullopt;
}

std::optional<uint64_t> cgroup_remaining() {
  auto remaining = [](std::optional<uint64_t> limit,
                      std::optional<uint64_t> used) -> std::optional<uint64_t> {
    // cgroup v1 reports "no limit" as a huge number near 2^63.
    if (!limit || *limit >= (uint64_t{1} << 60)) return std::nullopt;
    const uint64_t u = used.value_or(0);
    return *limit > u ? *limit - u : 0;
  };
  if (auto v2 =
          remaining(read_number("/sys/fs/cgroup/memory.max"), read_number("/sys/fs/cgroup/memory.current")))
    return v2;
  return remaining(read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
                   read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes"));
}

// A "Key:   N kB" line of /proc/self/status, in bytes.
std::optional<uint64_t> own_status_bytes(std::string_view key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (!line.starts_with(key) || line.size() <= key.size() || line[key.size()] != ':') continue;
    std::istringstream fields(line.substr(key.size() + 1));
    uint64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return std::nullopt;
}

}  // namespace

std::optional<uint64_t> available_memory_bytes() {
  if (const char* forced = std::getenv("SYMPRUNE_MEMORY_AVAILABLE"))
    return static_cast<uint64_t>(std::strtoull(forced, nullptr, 10));
  const auto a = mem_available(), b = cgroup_remaining();
  if (a && b) return std::min(*a, *b);
  return a ? a : b;
}

std::optional<uint64_t> address_space_left_bytes() {
  if (const char* forced = std::getenv("SYMPRUNE_ADDRESS_SPACE_LEFT"))
    return static_cast<uint64_t>(std::strtoull(forced, nullptr, 10));
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_AS, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return std::nullopt;
  const uint64_t mapped = own_status_bytes("VmSize").value_or(0);
  const uint64_t cap = static_cast<uint64_t>(limit.rlim_cur);
  return cap > mapped ? cap - mapped : 0;
}

std::optional<uint64_t> resident_bytes() {
  return own_status_bytes("VmRSS");
}

std::optional<uint64_t> peak_resident_bytes() {
  return own_status_bytes("VmHWM");
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 5) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, units[u]);
}

}  // namespace symprune
