// What the server's flags let it hold in host memory at worst, and the
// admission budget that keeps that within the memory the process may use: a
// container's memory limit kills a process that passes it, and gRPC crashes
// when an allocation fails under ulimit -v (a 64 MB request under 300 MiB
// did), so a budget its memory cannot hold is lowered at start-up rather than
// found out under load.
#ifndef TRANSPOSE_SERVER_HOST_MEMORY_PLAN_H_
#define TRANSPOSE_SERVER_HOST_MEMORY_PLAN_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace transpose {

// gRPC's memory quota for received messages (--max_transport_bytes): `flag`
// where set; else the admission budget plus the larger of 1 GiB and four
// messages, room for messages not yet admitted (0, no quota, where the budget
// is 0, no limit).
uint64_t TransportQuota(uint64_t flag, uint64_t inflight, uint64_t message);

// The smallest quota that leaves room for every admitted upload plus one more
// message: the CPU backend transposes straight from the received messages, so
// admitted uploads may sit in gRPC's buffers.
uint64_t MinTransportQuota(uint64_t inflight, uint64_t message);

// The flags that bound the host memory the server holds.
struct HostMemoryFlags {
  uint64_t max_inflight_bytes = 0;   // 0: no limit.
  uint64_t buffer_pool_bytes = 0;    // Idle buffers kept, per device.
  uint64_t max_transport_bytes = 0;  // 0: TransportQuota's default.
  uint64_t max_message_bytes = 0;
  uint64_t max_inflight_bytes_per_peer = 0;  // 0: no limit.
};

// How the backend and the process use host memory beside the flags.
struct HostMemoryUse {
  // Host bytes a job holds per byte of its matrix, its buffers rounded up to
  // their size class (up to a quarter more): on the CPU, a result and a copy
  // of an input it cannot read from gRPC's messages (2.5); for a GPU, one
  // pinned buffer (1.25).
  double bytes_per_admitted_byte = 2.5;
  int pools = 1;  // One per device.
  // What the process takes whatever it admits: the memory it already holds,
  // the stacks of threads yet to start (under ulimit -v), gRPC's own working
  // memory.
  uint64_t reserve_bytes = 0;
};

// The limits the server runs with.
struct HostMemoryPlan {
  uint64_t max_inflight_bytes = 0;
  uint64_t max_inflight_bytes_per_peer = 0;
  uint64_t buffer_pool_bytes = 0;
  uint64_t transport_quota_bytes = 0;  // Resolved: TransportQuota's value.
  // The most host memory these limits let the server hold (deploy/README.md
  // has the sum); 0 where nothing bounds it (no admission limit).
  uint64_t worst_case_bytes = 0;
  bool lowered = false;  // Whether the flags' limits did not fit.
  // What they were fitted to: the flags' worst case and the memory left.
  uint64_t flags_worst_case_bytes = 0;
  uint64_t memory_left_bytes = 0;
  uint64_t reserve_bytes = 0;  // HostMemoryUse's, part of each worst case.
};

// The flags' limits where their worst case fits `memory_left`, the memory the
// process may still take; else the largest admission budget under
// --max_inflight_bytes whose worst case does, with the pool lowered to that
// budget's buffer and gRPC's quota to the budget plus at most a quarter of the
// memory left (but one message at least), and each client host's share in
// proportion. FAILED_PRECONDITION when not even a budget of one message's
// minimum (1 MiB, or the flag where less) fits. With no admission limit the
// flags are kept as they are: nothing bounds what the server holds.
absl::StatusOr<HostMemoryPlan> PlanHostMemory(const HostMemoryFlags& flags,
                                              const HostMemoryUse& use,
                                              uint64_t memory_left);

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_HOST_MEMORY_PLAN_H_
