#include "server/core/stall_watchdog.h"

#include <atomic>
#include <chrono>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace transpose {
namespace {

class CountingWatched : public StallWatchdog::Watched {
 public:
  void CheckForStall(StallWatchdog::Clock::time_point now) override {
    EXPECT_GE(now, StallWatchdog::Clock::now() - std::chrono::seconds(1));
    checks_.fetch_add(1);
    // Slow checks widen the window in which Remove has to wait for one.
    absl::SleepFor(absl::Milliseconds(1));
  }
  int checks() const { return checks_.load(); }

 private:
  std::atomic<int> checks_{0};
};

// Waits up to 5 s for `watched` to have been checked at least `n` times.
bool AwaitChecks(const CountingWatched& watched, int n) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (watched.checks() < n && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  return watched.checks() >= n;
}

TEST(StallWatchdogTest, ChecksEachRegisteredCallEveryPeriodUntilRemoved) {
  StallWatchdog watchdog(absl::Milliseconds(5));
  CountingWatched a, b;
  watchdog.Add(&a);
  watchdog.Add(&b);
  EXPECT_TRUE(AwaitChecks(a, 3));
  EXPECT_TRUE(AwaitChecks(b, 3));

  watchdog.Remove(&a);
  const int after_remove = a.checks();
  const int b_before = b.checks();
  EXPECT_TRUE(AwaitChecks(b, b_before + 3));
  EXPECT_EQ(a.checks(), after_remove);
  watchdog.Remove(&b);
}

// What the service relies on to delete a call: once Remove returns, no check
// of it is running.
TEST(StallWatchdogTest, RemoveWaitsForARunningCheck) {
  class Flagging : public StallWatchdog::Watched {
   public:
    void CheckForStall(StallWatchdog::Clock::time_point) override {
      inside_.store(true);
      absl::SleepFor(absl::Milliseconds(20));
      inside_.store(false);
      ++checks_;
    }
    std::atomic<bool> inside_{false};
    std::atomic<int> checks_{0};
  };
  StallWatchdog watchdog(absl::Milliseconds(1));
  for (int i = 0; i < 20; ++i) {
    Flagging watched;
    watchdog.Add(&watched);
    while (!watched.inside_.load()) absl::SleepFor(absl::Microseconds(100));
    watchdog.Remove(&watched);
    EXPECT_FALSE(watched.inside_.load());
    const int checks = watched.checks_.load();
    absl::SleepFor(absl::Milliseconds(5));
    EXPECT_EQ(watched.checks_.load(), checks);
  }
}

// A check that ends a call can run its clean-up inline, down to the call
// removing and destroying itself.
TEST(StallWatchdogTest, ACheckMayRemoveItsOwnObject) {
  class SelfRemoving : public StallWatchdog::Watched {
   public:
    explicit SelfRemoving(StallWatchdog& watchdog) : watchdog_(watchdog) {}
    void CheckForStall(StallWatchdog::Clock::time_point) override {
      watchdog_.Remove(this);
      removed_.store(true);
    }
    StallWatchdog& watchdog_;
    std::atomic<bool> removed_{false};
  };
  StallWatchdog watchdog(absl::Milliseconds(1));
  SelfRemoving watched(watchdog);
  watchdog.Add(&watched);
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!watched.removed_.load() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_TRUE(watched.removed_.load());
  watchdog.Remove(&watched);  // Already gone: returns at once.
}

TEST(StallWatchdogTest, StopsWithNothingRegistered) {
  const absl::Time start = absl::Now();
  { StallWatchdog watchdog(absl::Hours(1)); }
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

}  // namespace
}  // namespace transpose
