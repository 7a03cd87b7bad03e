#include "server/core/process.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "server/core/cgroup.h"
#include "server/core/heap.h"

namespace transpose {

void SetUpProcess() {
  RetainFreedHeapMemory();
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

uint64_t UsableMemoryBytes() {
  uint64_t bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                   static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (const std::optional<uint64_t> limit = CurrentCgroupLimits().memory_bytes)
    bytes = std::min(bytes, *limit);
  if (rlimit address_space; getrlimit(RLIMIT_AS, &address_space) == 0 &&
                            address_space.rlim_cur != RLIM_INFINITY) {
    bytes = std::min<uint64_t>(bytes, address_space.rlim_cur);
  }
  return bytes;
}

bool FitsHostMemory(uint64_t bytes) { return bytes <= UsableMemoryBytes() / 2; }

}  // namespace transpose
