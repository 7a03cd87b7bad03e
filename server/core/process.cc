#include "server/core/process.h"

#include "absl/synchronization/mutex.h"
#include "server/core/heap.h"

namespace transpose {

void SetUpProcess() {
  RetainFreedHeapMemory();
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace transpose
