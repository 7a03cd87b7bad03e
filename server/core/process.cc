#include "server/core/process.h"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <optional>

#include "absl/synchronization/mutex.h"
#include "server/core/cgroup.h"
#include "server/core/heap.h"

namespace transpose {

namespace {

uint64_t PhysicalOrCgroupMemoryBytes() {
  uint64_t bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                   static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (const std::optional<uint64_t> limit = CurrentCgroupLimits().memory_bytes)
    bytes = std::min(bytes, *limit);
  return bytes;
}

std::optional<uint64_t> AddressSpaceLimitBytes() {
  if (rlimit address_space; getrlimit(RLIMIT_AS, &address_space) == 0 &&
                            address_space.rlim_cur != RLIM_INFINITY) {
    return address_space.rlim_cur;
  }
  return std::nullopt;
}

// The fields of /proc/self/statm, in pages, in its order.
enum class Statm { kMapped = 0, kResident = 1 };  // VmSize, VmRSS.

// That field in bytes; 0 where /proc cannot say.
uint64_t StatmBytes(Statm field) {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0;
  for (int i = 0; i <= static_cast<int>(field); ++i) {
    if (!(statm >> pages)) return 0;
  }
  return pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

void SetUpProcess() {
  // Every malloc arena past the first reserves 64 MiB of address space as its
  // thread first allocates. That holds no memory, but under ulimit -v eight
  // of them take 512 MiB of the limit, and what gRPC later needs (a thread's
  // stack, a buffer) then fails: it hangs or crashes rather than reporting
  // it. There the threads share one arena instead.
  RetainFreedHeapMemory(
      /*retain_bytes=*/size_t{64} << 20,
      /*arenas=*/AddressSpaceLimitBytes().has_value() ? 1 : 8);
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

uint64_t UsableMemoryBytes() {
  const uint64_t bytes = PhysicalOrCgroupMemoryBytes();
  const std::optional<uint64_t> limit = AddressSpaceLimitBytes();
  return limit.has_value() ? std::min(bytes, *limit) : bytes;
}

uint64_t MemoryLeftBytes() {
  const uint64_t bytes = PhysicalOrCgroupMemoryBytes();
  const std::optional<uint64_t> limit = AddressSpaceLimitBytes();
  if (!limit.has_value()) return bytes;
  const uint64_t mapped = StatmBytes(Statm::kMapped);
  return std::min(bytes, *limit > mapped ? *limit - mapped : 0);
}

uint64_t ThreadStackBytes() {
  // pthread_attr_getstacksize of an attribute left at its default gives the
  // size glibc gives new threads.
  pthread_attr_t attr;
  size_t bytes = 0;
  if (pthread_attr_init(&attr) == 0) {
    pthread_attr_getstacksize(&attr, &bytes);
    pthread_attr_destroy(&attr);
  }
  return bytes;
}

uint64_t MemoryHeldBytes() {
  // Below the machine's or the cgroup's memory, MemoryLeftBytes is the
  // address-space limit less what is mapped, resident memory included.
  return MemoryLeftBytes() < PhysicalOrCgroupMemoryBytes()
             ? 0
             : StatmBytes(Statm::kResident);
}

uint64_t ThreadsAddressSpaceBytes(int threads) {
  if (!AddressSpaceLimitBytes().has_value() || threads <= 0) return 0;
  return static_cast<uint64_t>(threads) * ThreadStackBytes();
}

bool FitsHostMemory(uint64_t bytes) { return bytes <= UsableMemoryBytes() / 2; }

}  // namespace transpose
