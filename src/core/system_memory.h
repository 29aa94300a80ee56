#pragma once
// How much memory this process can still use, for up-front checks ("this run needs X GiB, Y are
// available") that replace a std::bad_alloc hours into a run.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace symprune {

// The smaller of MemAvailable (/proc/meminfo) and the remaining allowance of this process's cgroup and
// its ancestors (cgroup v2 memory.max − memory.current, or v1 memory.limit_in_bytes −
// memory.usage_in_bytes; the cgroup read from /proc/self/cgroup, as a Slurm job's step is); nullopt when
// neither can be read. SYMPRUNE_MEMORY_AVAILABLE (bytes) overrides it, for tests.
std::optional<uint64_t> available_memory_bytes();

namespace detail {
// The smallest remaining allowance of the cgroups in `proc_self_cgroup` (the text of /proc/self/cgroup)
// and their ancestors, under the cgroup file systems mounted at `mount` (/sys/fs/cgroup); nullopt when
// none has a limit. For tests.
std::optional<uint64_t> cgroup_remaining_bytes(const std::string& proc_self_cgroup,
                                               const std::filesystem::path& mount);
}  // namespace detail

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
