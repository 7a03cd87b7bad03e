#include "server/core/call_gate.h"

#include <atomic>
#include <thread>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace transpose {
namespace {

TEST(CallGateTest, ClosingRefusesNewCallsAndLetsRunningOnesFinish) {
  CallGate gate;
  ASSERT_TRUE(gate.TryEnter());
  ASSERT_TRUE(gate.TryEnter());
  gate.Close();
  EXPECT_FALSE(gate.TryEnter());
  EXPECT_FALSE(gate.AwaitNoCalls(absl::Now() + absl::Milliseconds(20)));

  std::thread finisher([&] {
    absl::SleepFor(absl::Milliseconds(50));
    gate.Leave();
    gate.Leave();
  });
  EXPECT_TRUE(gate.AwaitNoCalls(absl::Now() + absl::Seconds(30)));
  finisher.join();
  EXPECT_FALSE(gate.TryEnter());
}

// No deadline (Close's default) waits as long as calls run.
TEST(CallGateTest, AnInfiniteDeadlineWaitsForTheCalls) {
  CallGate gate;
  ASSERT_TRUE(gate.TryEnter());
  std::atomic<bool> left{false};
  std::thread finisher([&] {
    absl::SleepFor(absl::Milliseconds(100));
    left = true;
    gate.Leave();
  });
  EXPECT_TRUE(gate.AwaitNoCalls(absl::InfiniteFuture()));
  EXPECT_TRUE(left.load());
  finisher.join();
}

TEST(CallGateTest, TheDrainIsOverAtItsDeadline) {
  CallGate gate;
  ASSERT_TRUE(gate.TryEnter());
  EXPECT_EQ(gate.running(), 1);
  EXPECT_FALSE(gate.DrainOver());  // Open: no drain.
  gate.Close(absl::Now() + absl::Hours(1));
  EXPECT_FALSE(gate.DrainOver());
  EXPECT_EQ(gate.running(), 1);
  gate.Leave();
  EXPECT_EQ(gate.running(), 0);

  CallGate ended;
  ended.Close(absl::Now() - absl::Milliseconds(1));
  EXPECT_TRUE(ended.DrainOver());
}

// What the drain's log line counts: calls still running at its deadline, and
// those that left after it (cut off by gRPC's shutdown before the wait for
// them noticed), but not those that finished in time.
TEST(CallGateTest, CountsTheCallsTheDrainCutOff) {
  CallGate gate;
  EXPECT_EQ(gate.CutOff(), 0);  // Open: no drain.
  ASSERT_TRUE(gate.TryEnter());
  ASSERT_TRUE(gate.TryEnter());
  ASSERT_TRUE(gate.TryEnter());
  gate.Leave();  // Before the drain: not cut off.
  gate.Close(absl::Now() + absl::Hours(1));
  EXPECT_EQ(gate.CutOff(), 0);  // The drain is not over yet.
  gate.Close(absl::Now() - absl::Milliseconds(1));
  EXPECT_EQ(gate.CutOff(), 2);
  gate.Leave();  // After the deadline: cut off, gone.
  EXPECT_EQ(gate.CutOff(), 2);
  gate.Leave();
  EXPECT_TRUE(gate.AwaitNoCalls(absl::Now()));
  EXPECT_EQ(gate.CutOff(), 2);

  CallGate in_time;
  ASSERT_TRUE(in_time.TryEnter());
  in_time.Close(absl::Now() + absl::Hours(1));
  in_time.Leave();
  in_time.Close(absl::Now() - absl::Milliseconds(1));  // Now over.
  EXPECT_EQ(in_time.CutOff(), 0);

  CallGate endless;  // Closed without a deadline: never over.
  ASSERT_TRUE(endless.TryEnter());
  endless.Close();
  EXPECT_EQ(endless.CutOff(), 0);
  endless.Leave();
}

TEST(CallGateTest, AnIdleGateIsAtOnceEmptyEvenPastTheDeadline) {
  CallGate gate;
  EXPECT_TRUE(gate.AwaitNoCalls(absl::Now() - absl::Seconds(1)));
  ASSERT_TRUE(gate.TryEnter());
  gate.Leave();
  EXPECT_TRUE(gate.AwaitNoCalls(absl::Now()));
}

}  // namespace
}  // namespace transpose
