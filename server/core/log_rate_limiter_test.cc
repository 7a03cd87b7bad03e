#include "server/core/log_rate_limiter.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace transpose {
namespace {

TEST(LogRateLimiterTest, LetsLinesThroughUpToTheLimitAndCountsTheRest) {
  LogRateLimiter limiter(3, absl::Seconds(1));
  const absl::Time start = absl::FromUnixSeconds(1000);
  uint64_t held_back = 99;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(limiter.Allow(start + absl::Milliseconds(i), &held_back));
    EXPECT_EQ(held_back, 0u);
  }
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(limiter.Allow(start + absl::Milliseconds(500), &held_back));
  }
  // The next window: the first line out says how many were held back.
  ASSERT_TRUE(limiter.Allow(start + absl::Milliseconds(1000), &held_back));
  EXPECT_EQ(held_back, 5u);
  ASSERT_TRUE(limiter.Allow(start + absl::Milliseconds(1001), &held_back));
  EXPECT_EQ(held_back, 0u);
}

TEST(LogRateLimiterTest, EveryLineIsCountedOnceAcrossManyWindows) {
  LogRateLimiter limiter(2, absl::Milliseconds(100));
  const absl::Time start = absl::FromUnixSeconds(1000);
  uint64_t out = 0, counted = 0;
  for (int i = 0; i < 1000; ++i) {
    uint64_t held_back = 0;
    if (limiter.Allow(start + absl::Milliseconds(i), &held_back)) {
      ++out;
      counted += held_back;
    }
  }
  EXPECT_EQ(out, 20u);  // 2 in each of 10 windows.
  uint64_t held_back = 0;
  ASSERT_TRUE(limiter.Allow(start + absl::Seconds(5), &held_back));
  EXPECT_EQ(out + counted + held_back, 1000u);
}

TEST(LogRateLimiterTest, TakingTheHeldBackCountReportsItOnce) {
  LogRateLimiter limiter(1, absl::Seconds(1));
  const absl::Time start = absl::FromUnixSeconds(1000);
  uint64_t held_back = 0;
  ASSERT_TRUE(limiter.Allow(start, &held_back));
  EXPECT_FALSE(limiter.Allow(start, &held_back));
  EXPECT_FALSE(limiter.Allow(start, &held_back));
  EXPECT_EQ(limiter.TakeHeldBack(), 2u);
  EXPECT_EQ(limiter.TakeHeldBack(), 0u);
  ASSERT_TRUE(limiter.Allow(start + absl::Seconds(1), &held_back));
  EXPECT_EQ(held_back, 0u);  // Already reported.
}

}  // namespace
}  // namespace transpose
