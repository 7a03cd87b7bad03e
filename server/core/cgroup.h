// The CPU and memory limits that Linux control groups put on this process (a
// container's, a systemd unit's), under cgroup v2 or v1's cpu and memory
// controllers. Each limit is the tightest of the process's own cgroup's and
// its ancestors', since a parent's limit binds its children.
#ifndef TRANSPOSE_SERVER_CORE_CGROUP_H_
#define TRANSPOSE_SERVER_CORE_CGROUP_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace transpose {

struct CgroupLimits {
  // A CPU quota, in cores rounded up: 1.5 cores' quota is 2.
  std::optional<int> cpu_cores;
  std::optional<uint64_t> memory_bytes;
};

// This process's limits, read from /proc/self/cgroup and /sys/fs/cgroup now
// (a few small files: callers that ask often keep the answer). Unset where
// no limit is set or the files cannot be read.
CgroupLimits CurrentCgroupLimits();

namespace internal {

// The limits of a process whose /proc/self/cgroup reads `proc_self_cgroup`,
// with the cgroup file systems mounted under `root`: v2 at `root`, v1's
// controllers at root/cpu (or root/cpu,cpuacct) and root/memory. Inside a
// container the paths in /proc/self/cgroup may be the host's while `root`
// shows only the container's cgroup: the paths that do not exist there are
// skipped, and `root` itself, the last ancestor, is the container's.
CgroupLimits ReadCgroupLimits(absl::string_view proc_self_cgroup,
                              const std::string& root);

// v2's cpu.max ("QUOTA PERIOD", or "max PERIOD" for none), or v1's
// cpu.cfs_quota_us and cpu.cfs_period_us joined the same way (-1: none).
std::optional<int> CoresFromCpuMax(absl::string_view cpu_max);
// v2's memory.max ("max" for none), or v1's memory.limit_in_bytes.
std::optional<uint64_t> BytesFromMemoryMax(absl::string_view memory_max);

}  // namespace internal
}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_CGROUP_H_
