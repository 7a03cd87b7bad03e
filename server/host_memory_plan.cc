#include "server/host_memory_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "server/buffer_pool.h"

namespace transpose {

namespace {

// gRPC's quota arithmetic is signed: sums stop there rather than wrap.
constexpr uint64_t kMaxBytes = INT64_MAX;

// The least budget worth serving with: the smallest --max_message_bytes
// (api::kMinMessageDataBytes, which the transport-free engine does not see).
constexpr uint64_t kMinBudgetBytes = uint64_t{1} << 20;

uint64_t Sum(uint64_t a, uint64_t b) {
  return a >= kMaxBytes || b >= kMaxBytes - a ? kMaxBytes : a + b;
}

uint64_t Times(double factor, uint64_t bytes) {
  const double product = std::ceil(factor * static_cast<double>(bytes));
  return product >= static_cast<double>(kMaxBytes)
             ? kMaxBytes
             : static_cast<uint64_t>(product);
}

uint64_t WorstCase(const HostMemoryUse& use, uint64_t inflight, uint64_t pool,
                   uint64_t transport) {
  uint64_t bytes = Times(use.bytes_per_admitted_byte, inflight);
  for (int i = 0; i < use.pools; ++i) bytes = Sum(bytes, pool);
  return Sum(Sum(bytes, transport), use.reserve_bytes);
}

}  // namespace

uint64_t TransportQuota(uint64_t flag, uint64_t inflight, uint64_t message) {
  constexpr uint64_t kMinRoom = uint64_t{1} << 30;
  if (flag > 0) return flag;
  if (inflight == 0) return 0;
  // `message` is under 2 GiB (the server checks its flag), so four of them
  // cannot wrap.
  return Sum(inflight, std::max(kMinRoom, 4 * message));
}

uint64_t MinTransportQuota(uint64_t inflight, uint64_t message) {
  return Sum(inflight, message);
}

absl::StatusOr<HostMemoryPlan> PlanHostMemory(const HostMemoryFlags& flags,
                                              const HostMemoryUse& use,
                                              uint64_t memory_left) {
  HostMemoryPlan plan;
  plan.max_inflight_bytes = flags.max_inflight_bytes;
  plan.max_inflight_bytes_per_peer = flags.max_inflight_bytes_per_peer;
  plan.buffer_pool_bytes = flags.buffer_pool_bytes;
  plan.transport_quota_bytes =
      TransportQuota(flags.max_transport_bytes, flags.max_inflight_bytes,
                     flags.max_message_bytes);
  if (flags.max_inflight_bytes == 0) return plan;
  plan.worst_case_bytes =
      WorstCase(use, plan.max_inflight_bytes, plan.buffer_pool_bytes,
                plan.transport_quota_bytes);
  plan.flags_worst_case_bytes = plan.worst_case_bytes;
  plan.memory_left_bytes = memory_left;
  plan.reserve_bytes = use.reserve_bytes;
  if (plan.worst_case_bytes <= memory_left) return plan;

  // Room for messages not yet admitted, in proportion to the memory: the
  // default 1 GiB alone would not fit a small container.
  const uint64_t free_of_reserve =
      memory_left > use.reserve_bytes ? memory_left - use.reserve_bytes : 0;
  const uint64_t flags_room =
      plan.transport_quota_bytes > flags.max_inflight_bytes
          ? plan.transport_quota_bytes - flags.max_inflight_bytes
          : 0;
  const uint64_t room = std::max(flags.max_message_bytes,
                                 std::min(flags_room, free_of_reserve / 4));
  const auto lowered = [&](uint64_t inflight) {
    HostMemoryPlan fit = plan;
    fit.max_inflight_bytes = inflight;
    // A share set as a part of the budget stays that part; at least 1 byte.
    if (flags.max_inflight_bytes_per_peer > 0) {
      fit.max_inflight_bytes_per_peer = std::max<uint64_t>(
          1, static_cast<uint64_t>(
                 static_cast<long double>(flags.max_inflight_bytes_per_peer) *
                 inflight / flags.max_inflight_bytes));
    }
    fit.buffer_pool_bytes = std::min<uint64_t>(flags.buffer_pool_bytes,
                                               BufferPool::SizeClass(inflight));
    fit.transport_quota_bytes =
        std::min(plan.transport_quota_bytes, Sum(inflight, room));
    fit.worst_case_bytes = WorstCase(use, inflight, fit.buffer_pool_bytes,
                                     fit.transport_quota_bytes);
    fit.lowered = true;
    return fit;
  };
  // The largest budget that fits, in whole MiB; the worst case grows with it.
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  uint64_t fits = 0;
  uint64_t too_large = plan.max_inflight_bytes / kMiB + 1;
  while (too_large - fits > 1) {
    const uint64_t middle = fits + (too_large - fits) / 2;
    if (lowered(middle * kMiB).worst_case_bytes <= memory_left) {
      fits = middle;
    } else {
      too_large = middle;
    }
  }
  const uint64_t least = std::min(kMinBudgetBytes, flags.max_inflight_bytes);
  if (fits * kMiB < least) {
    const HostMemoryPlan smallest = lowered(least);
    if (smallest.worst_case_bytes <= memory_left) return smallest;
    return absl::FailedPreconditionError(absl::StrFormat(
        "the %d bytes of memory this server may still take cannot hold even "
        "%d bytes of matrices: with gRPC's buffers for them and %d bytes of "
        "room for messages not yet admitted (one of --max_message_bytes at "
        "least) and the %d bytes its threads and gRPC need, that is %d bytes "
        "at worst; give it more memory (its container's limit, its ulimit "
        "-v) or lower --max_message_bytes",
        memory_left, least, room, use.reserve_bytes,
        smallest.worst_case_bytes));
  }
  return lowered(fits * kMiB);
}

}  // namespace transpose
