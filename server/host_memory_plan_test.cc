#include "server/host_memory_plan.h"

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/buffer_pool.h"

namespace transpose {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

// The server's defaults.
HostMemoryFlags DefaultFlags() {
  HostMemoryFlags flags;
  flags.max_inflight_bytes = 8 * kGiB;
  flags.buffer_pool_bytes = 4 * kGiB;
  flags.max_message_bytes = 64 * kMiB;
  return flags;
}

HostMemoryUse CpuUse() {
  HostMemoryUse use;
  use.bytes_per_admitted_byte = 2.5;
  use.pools = 1;
  use.reserve_bytes = 100 * kMiB;
  return use;
}

TEST(TransportQuotaTest, DefaultsToTheBudgetAndRoomForFourMessagesOrOneGiB) {
  EXPECT_EQ(TransportQuota(0, 8 * kGiB, 64 * kMiB), 9 * kGiB);
  EXPECT_EQ(TransportQuota(0, 8 * kGiB, 512 * kMiB), 10 * kGiB);
  EXPECT_EQ(TransportQuota(5 * kGiB, 8 * kGiB, 64 * kMiB), 5 * kGiB);
  EXPECT_EQ(TransportQuota(0, 0, 64 * kMiB), 0u);  // No budget, no quota.
  EXPECT_EQ(TransportQuota(0, UINT64_MAX, 64 * kMiB), uint64_t{INT64_MAX});
  EXPECT_EQ(MinTransportQuota(8 * kGiB, 64 * kMiB), 8 * kGiB + 64 * kMiB);
}

TEST(PlanHostMemoryTest, LimitsThatFitAreKeptWithTheirWorstCase) {
  absl::StatusOr<HostMemoryPlan> plan =
      PlanHostMemory(DefaultFlags(), CpuUse(), 64 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->lowered);
  EXPECT_EQ(plan->max_inflight_bytes, 8 * kGiB);
  EXPECT_EQ(plan->buffer_pool_bytes, 4 * kGiB);
  EXPECT_EQ(plan->transport_quota_bytes, 9 * kGiB);
  // Results and input copies in their size classes, the pool, gRPC's quota,
  // the reserve.
  EXPECT_EQ(plan->worst_case_bytes,
            20 * kGiB + 4 * kGiB + 9 * kGiB + 100 * kMiB);
  EXPECT_EQ(plan->flags_worst_case_bytes, plan->worst_case_bytes);
  EXPECT_EQ(plan->memory_left_bytes, 64 * kGiB);
  EXPECT_EQ(plan->reserve_bytes, 100 * kMiB);
}

// deploy/README.md: "about 23 GiB with the defaults on one GPU", under the
// base Deployment's 28 GiB, which therefore keeps its limits.
TEST(PlanHostMemoryTest, OneGpuWithTheDefaultsFitsTheDeploymentsLimit) {
  HostMemoryUse gpu;
  gpu.bytes_per_admitted_byte = 1.25;
  gpu.pools = 1;
  absl::StatusOr<HostMemoryPlan> plan =
      PlanHostMemory(DefaultFlags(), gpu, 28 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->lowered);
  EXPECT_EQ(plan->worst_case_bytes, 10 * kGiB + 4 * kGiB + 9 * kGiB);
}

TEST(PlanHostMemoryTest, EachDeviceHasItsPool) {
  HostMemoryUse gpus;
  gpus.bytes_per_admitted_byte = 1.25;
  gpus.pools = 4;
  absl::StatusOr<HostMemoryPlan> plan =
      PlanHostMemory(DefaultFlags(), gpus, 64 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->worst_case_bytes, 10 * kGiB + 4 * 4 * kGiB + 9 * kGiB);
}

// The worst case of a lowered plan, written out from its parts.
uint64_t LoweredWorstCase(const HostMemoryFlags& flags,
                          const HostMemoryUse& use, uint64_t inflight,
                          uint64_t room) {
  const uint64_t pool = std::min<uint64_t>(flags.buffer_pool_bytes,
                                           BufferPool::SizeClass(inflight));
  return static_cast<uint64_t>(use.bytes_per_admitted_byte * inflight) +
         use.pools * pool + inflight + room + use.reserve_bytes;
}

// This machine: 24 GiB, where the defaults could hold 33 GiB.
TEST(PlanHostMemoryTest, TooLittleMemoryLowersTheBudgetToTheLargestThatFits) {
  const uint64_t left = 24 * kGiB;
  const HostMemoryFlags flags = DefaultFlags();
  absl::StatusOr<HostMemoryPlan> plan = PlanHostMemory(flags, CpuUse(), left);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->lowered);
  EXPECT_GT(plan->flags_worst_case_bytes, left);
  EXPECT_LE(plan->worst_case_bytes, left);
  EXPECT_LT(plan->max_inflight_bytes, flags.max_inflight_bytes);
  EXPECT_EQ(plan->max_inflight_bytes % kMiB, 0u);
  // Here the pool keeps its size and gRPC its 1 GiB of room: the budget alone
  // gives way.
  EXPECT_EQ(plan->buffer_pool_bytes, flags.buffer_pool_bytes);
  EXPECT_EQ(plan->transport_quota_bytes, plan->max_inflight_bytes + kGiB);
  EXPECT_EQ(plan->worst_case_bytes,
            LoweredWorstCase(flags, CpuUse(), plan->max_inflight_bytes, kGiB));
  EXPECT_GT(
      LoweredWorstCase(flags, CpuUse(), plan->max_inflight_bytes + kMiB, kGiB),
      left);
}

// A small container: the pool shrinks to the budget's buffer and gRPC's room
// to a quarter of the memory.
TEST(PlanHostMemoryTest, InASmallContainerThePoolAndGrpcsRoomShrinkToo) {
  const uint64_t left = 2 * kGiB;
  const HostMemoryFlags flags = DefaultFlags();
  absl::StatusOr<HostMemoryPlan> plan = PlanHostMemory(flags, CpuUse(), left);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->lowered);
  const uint64_t room = (left - CpuUse().reserve_bytes) / 4;
  EXPECT_EQ(plan->transport_quota_bytes, plan->max_inflight_bytes + room);
  EXPECT_EQ(plan->buffer_pool_bytes,
            BufferPool::SizeClass(plan->max_inflight_bytes));
  EXPECT_LE(plan->worst_case_bytes, left);
  EXPECT_GT(
      LoweredWorstCase(flags, CpuUse(), plan->max_inflight_bytes + kMiB, room),
      left);
  EXPECT_GT(plan->max_inflight_bytes, 256 * kMiB);
}

// gRPC's room never drops below one message, which an upload needs.
TEST(PlanHostMemoryTest, GrpcKeepsRoomForOneMessage) {
  HostMemoryFlags flags = DefaultFlags();
  flags.max_message_bytes = 256 * kMiB;
  absl::StatusOr<HostMemoryPlan> plan =
      PlanHostMemory(flags, CpuUse(), 600 * kMiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->transport_quota_bytes, plan->max_inflight_bytes + 256 * kMiB);
  EXPECT_LE(plan->worst_case_bytes, 600 * kMiB);
}

// An explicit quota's room beyond the budget, smaller than a quarter of the
// memory here, stays what it was as the budget comes down.
TEST(PlanHostMemoryTest, AnExplicitQuotaKeepsItsRoomBeyondTheBudget) {
  HostMemoryFlags flags = DefaultFlags();
  flags.max_transport_bytes = 8 * kGiB + 128 * kMiB;
  absl::StatusOr<HostMemoryPlan> plan =
      PlanHostMemory(flags, CpuUse(), 2 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->lowered);
  EXPECT_EQ(plan->transport_quota_bytes, plan->max_inflight_bytes + 128 * kMiB);
  EXPECT_LE(plan->worst_case_bytes, 2 * kGiB);
}

TEST(PlanHostMemoryTest, WithoutAnAdmissionLimitNothingIsBounded) {
  HostMemoryFlags flags = DefaultFlags();
  flags.max_inflight_bytes = 0;
  absl::StatusOr<HostMemoryPlan> plan =
      PlanHostMemory(flags, CpuUse(), 1 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->lowered);
  EXPECT_EQ(plan->max_inflight_bytes, 0u);
  EXPECT_EQ(plan->transport_quota_bytes, 0u);
  EXPECT_EQ(plan->buffer_pool_bytes, flags.buffer_pool_bytes);
  EXPECT_EQ(plan->worst_case_bytes, 0u);
}

TEST(PlanHostMemoryTest, MemoryForLessThanOneMiBOfMatricesIsAnError) {
  absl::StatusOr<HostMemoryPlan> plan =
      PlanHostMemory(DefaultFlags(), CpuUse(), 150 * kMiB);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(plan.status().message(),
              testing::AllOf(testing::HasSubstr("157286400 bytes of memory"),
                             testing::HasSubstr("--max_message_bytes")));
  // With smaller messages the same memory serves.
  HostMemoryFlags small = DefaultFlags();
  small.max_message_bytes = 4 * kMiB;
  plan = PlanHostMemory(small, CpuUse(), 150 * kMiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_GE(plan->max_inflight_bytes, kMiB);
  EXPECT_LE(plan->worst_case_bytes, 150 * kMiB);
}

TEST(PlanHostMemoryTest, HugeLimitsDoNotWrap) {
  HostMemoryFlags flags = DefaultFlags();
  flags.max_inflight_bytes = uint64_t{1} << 62;
  flags.buffer_pool_bytes = uint64_t{1} << 62;
  absl::StatusOr<HostMemoryPlan> plan =
      PlanHostMemory(flags, CpuUse(), 24 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->lowered);
  EXPECT_EQ(plan->flags_worst_case_bytes, uint64_t{INT64_MAX});
  EXPECT_LE(plan->worst_case_bytes, 24 * kGiB);
  EXPECT_GT(plan->max_inflight_bytes, 4 * kGiB);
}

// --max_inflight_bytes_per_peer set at a quarter of the budget stays a
// quarter of the lowered one, so one client cannot take all of it.
TEST(PlanHostMemoryTest, EachClientHostsShareComesDownInProportion) {
  HostMemoryFlags flags = DefaultFlags();
  flags.max_inflight_bytes_per_peer = 2 * kGiB;
  absl::StatusOr<HostMemoryPlan> plan =
      PlanHostMemory(flags, CpuUse(), 2 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(plan->lowered);
  EXPECT_EQ(plan->max_inflight_bytes_per_peer, plan->max_inflight_bytes / 4);
  // Unset, it stays unset; where the flags fit, it stays what it was.
  flags.max_inflight_bytes_per_peer = 0;
  plan = PlanHostMemory(flags, CpuUse(), 2 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->max_inflight_bytes_per_peer, 0u);
  flags.max_inflight_bytes_per_peer = 2 * kGiB;
  plan = PlanHostMemory(flags, CpuUse(), 64 * kGiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->max_inflight_bytes_per_peer, 2 * kGiB);
}

// A budget set below 1 MiB is not refused for not fitting 1 MiB.
TEST(PlanHostMemoryTest, ABudgetUnderOneMiBIsKeptWhereItFits) {
  HostMemoryFlags flags = DefaultFlags();
  flags.max_inflight_bytes = 512 << 10;
  flags.max_message_bytes = kMiB;
  flags.max_transport_bytes = 8 * kGiB;  // Too much for the memory.
  absl::StatusOr<HostMemoryPlan> plan =
      PlanHostMemory(flags, CpuUse(), 200 * kMiB);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->lowered);
  EXPECT_EQ(plan->max_inflight_bytes, 512u << 10);
  EXPECT_LE(plan->worst_case_bytes, 200 * kMiB);
}

}  // namespace
}  // namespace transpose
