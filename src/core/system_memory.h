#pragma once
// How much memory this process can still use, for up-front checks ("this run needs X GiB, Y are
// available") that replace a std::bad_alloc hours into a run.
#include <cstdint>
#include <optional>
#include <string>

namespace symprune {

// The smaller of MemAvailable (/proc/meminfo) and the cgroup's remaining allowance (cgroup v2
// memory.max − memory.current, or v1 memory.limit_in_bytes − memory.usage_in_bytes); nullopt when
// neither can be read. SYMPRUNE_MEMORY_AVAILABLE (bytes) overrides it, for tests.
std::optional<uint64_t> available_memory_bytes();

// Under an address-space limit (RLIMIT_AS, `ulimit -v`): the limit minus this process's mapped size
// (VmSize), else nullopt. Mappings count against it, not memory in use. SYMPRUNE_ADDRESS_SPACE_LEFT (bytes)
// overrides it, for tests.
std::optional<uint64_t> address_space_left_bytes();

// This process's resident size (VmRSS) and its high-water mark (VmHWM) from /proc/self/status; nullopt
// where it cannot be read.
std::optional<uint64_t> resident_bytes();
std::optional<uint64_t> peak_resident_bytes();

// "12.3 GiB"
std::string format_bytes(double bytes);

}  // namespace symprune
