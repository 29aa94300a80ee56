#include "core/system_memory.h"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>

namespace symprune {
namespace fs = std::filesystem;
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

// limit − used, or nullopt without a limit (v2 "max"; v1 reports none as a huge number near 2^63).
std::optional<uint64_t> remaining(std::optional<uint64_t> limit, std::optional<uint64_t> used) {
  if (!limit || *limit >= (uint64_t{1} << 60)) return std::nullopt;
  const uint64_t u = used.value_or(0);
  return *limit > u ? *limit - u : 0;
}

// `smallest` becomes `value` when that is known and smaller.
void keep_smaller(std::optional<uint64_t>& smallest, std::optional<uint64_t> value) {
  if (value && (!smallest || *value < *smallest)) smallest = value;
}

// The smallest remaining allowance of the cgroup directory `dir` and its ancestors up to `top` (a limit
// set on a parent, such as a Slurm job's above its step, binds too).
std::optional<uint64_t> smallest_remaining(fs::path dir, const fs::path& top, const char* limit_file,
                                           const char* usage_file) {
  std::optional<uint64_t> smallest;
  for (;;) {
    keep_smaller(smallest,
                 remaining(read_number((dir / limit_file).c_str()), read_number((dir / usage_file).c_str())));
    if (dir == top || dir.parent_path() == dir) break;
    dir = dir.parent_path();
  }
  return smallest;
}

}  // namespace

namespace detail {

std::optional<uint64_t> cgroup_remaining_bytes(const std::string& proc_self_cgroup, const fs::path& mount) {
  std::optional<uint64_t> smallest;
  std::istringstream lines(proc_self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    // "ID:CONTROLLERS:PATH"; v2 is "0::PATH", v1's memory controller lists "memory" among its controllers.
    const auto first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const fs::path path = fs::path(line.substr(second + 1)).relative_path();
    const bool v2 = controllers.empty();
    bool memory = false;
    for (size_t at = 0; at <= controllers.size();) {
      const size_t comma = std::min(controllers.find(',', at), controllers.size());
      memory = memory || controllers.substr(at, comma - at) == "memory";
      at = comma + 1;
    }
    if (!v2 && !memory) continue;
    // A v2 hierarchy is mounted at the mount point itself (its cgroup.controllers file says so), or beside
    // v1's at "unified"; v1's memory controller at "memory".
    std::error_code ec;
    const fs::path top =
        v2 ? (fs::exists(mount / "cgroup.controllers", ec) ? mount : mount / "unified") : mount / "memory";
    // In a cgroup namespace the path is relative to what is mounted: the directory may not exist below the
    // mount, whose top is then this process's cgroup.
    const fs::path dir = !path.empty() && fs::is_directory(top / path, ec) ? top / path : top;
    keep_smaller(smallest,
                 v2 ? smallest_remaining(dir, top, "memory.max", "memory.current")
                    : smallest_remaining(dir, top, "memory.limit_in_bytes", "memory.usage_in_bytes"));
  }
  return smallest;
}

}  // namespace detail

namespace {

std::optional<uint64_t> cgroup_remaining() {
  std::ifstream in("/proc/self/cgroup");
  std::stringstream text;
  text << in.rdbuf();
  return detail::cgroup_remaining_bytes(text.str(), "/sys/fs/cgroup");
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
