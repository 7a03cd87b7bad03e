#include "server/core/process.h"

#include <unistd.h>

#include "absl/synchronization/mutex.h"
#include "server/core/heap.h"

namespace transpose {

void SetUpProcess() {
  RetainFreedHeapMemory();
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

uint64_t PhysicalMemoryBytes() {
  return static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
         static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

bool FitsHostMemory(uint64_t bytes) {
  return bytes <= PhysicalMemoryBytes() / 2;
}

}  // namespace transpose
