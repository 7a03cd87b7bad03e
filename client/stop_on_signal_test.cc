#include "client/stop_on_signal.h"

#include <signal.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace transpose {
namespace {

// Waits up to 10 s for the canceller to be cancelled.
bool AwaitCancelled(const CallCanceller& canceller) {
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!canceller.cancelled() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  return canceller.cancelled();
}

TEST(StopOnSignalTest, ASignalCancelsInsteadOfEndingTheProcess) {
  for (int signal : {SIGINT, SIGTERM}) {
    CallCanceller canceller;
    StopOnSignal stop(canceller);
    stop.Arm();
    EXPECT_EQ(stop.signal(), 0);
    ASSERT_EQ(kill(getpid(), signal), 0);
    EXPECT_TRUE(AwaitCancelled(canceller));
    EXPECT_EQ(stop.signal(), signal);
  }
}

TEST(StopOnSignalTest, NoSignalNoCancel) {
  CallCanceller canceller;
  {
    StopOnSignal stop(canceller);
    stop.Arm();
    absl::SleepFor(absl::Milliseconds(250));
    EXPECT_EQ(stop.signal(), 0);
  }
  EXPECT_FALSE(canceller.cancelled());
}

TEST(StopOnSignalDeathTest, ASecondSignalEndsTheProcess) {
  EXPECT_EXIT(
      {
        CallCanceller canceller;
        StopOnSignal stop(canceller);
        stop.Arm();
        kill(getpid(), SIGINT);
        if (AwaitCancelled(canceller)) kill(getpid(), SIGINT);
        absl::SleepFor(absl::Seconds(10));
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGINT), "");
}

TEST(StopOnSignalDeathTest, UnarmedASignalEndsTheProcess) {
  EXPECT_EXIT(
      {
        CallCanceller canceller;
        StopOnSignal stop(canceller);
        kill(getpid(), SIGTERM);
        absl::SleepFor(absl::Seconds(10));
        std::exit(canceller.cancelled() ? 3 : 0);
      },
      ::testing::KilledBySignal(SIGTERM), "");
}

TEST(StopOnSignalDeathTest, AnIgnoredSignalStaysIgnored) {
  EXPECT_EXIT(
      {
        std::signal(SIGINT, SIG_IGN);
        CallCanceller canceller;
        StopOnSignal stop(canceller);
        stop.Arm();
        kill(getpid(), SIGINT);
        absl::SleepFor(absl::Milliseconds(500));
        std::exit(canceller.cancelled() ? 3 : 0);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(StopOnSignalDeathTest, AfterItASignalActsAsUsual) {
  EXPECT_EXIT(
      {
        CallCanceller canceller;
        { StopOnSignal stop(canceller); }
        kill(getpid(), SIGTERM);
        absl::SleepFor(absl::Seconds(10));
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGTERM), "");
}

}  // namespace
}  // namespace transpose
