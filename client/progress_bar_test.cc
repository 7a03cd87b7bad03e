#include "client/progress_bar.h"

#include <cstdio>
#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace transpose {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;

constexpr uint64_t kTotal = 64 << 20;

// A bar drawing into a temporary file, on a clock that moves only when told.
class ProgressBarTest : public ::testing::Test {
 protected:
  ~ProgressBarTest() override { std::fclose(out_); }

  ProgressBar MakeBar(bool enabled = true) {
    return ProgressBar(enabled, out_, [this] { return now_; });
  }
  // Moves the clock past the quiet start, after which the bar draws.
  void PassTheQuietStart() { now_ += absl::Milliseconds(600); }

  std::string Text() {
    std::fflush(out_);
    std::rewind(out_);
    std::string text;
    char buffer[512];
    size_t n;
    while ((n = std::fread(buffer, 1, sizeof(buffer), out_)) > 0)
      text.append(buffer, n);
    return text;
  }
  // What the bar shows now: the text after the last carriage return.
  std::string LastLine() {
    const std::string text = Text();
    return text.substr(text.rfind('\r'));
  }

  std::FILE* const out_ = std::tmpfile();
  absl::Time now_ = absl::UnixEpoch();
};

// The last update comes within the redraw interval of the one before (the
// final chunks arrive fast); the bar still ends at 100%.
TEST_F(ProgressBarTest, EndsAtOneHundredPercent) {
  {
    ProgressBar bar = MakeBar();
    PassTheQuietStart();
    bar.Update({kTotal, kTotal / 2, kTotal});
    now_ += absl::Milliseconds(10);
    bar.Update({kTotal, kTotal - 1, kTotal});
    now_ += absl::Milliseconds(10);
    bar.Update({kTotal, kTotal, kTotal});
    bar.Done();
  }
  EXPECT_THAT(Text(), HasSubstr("receiving ["));
  EXPECT_THAT(LastLine(), HasSubstr("100%"));
  EXPECT_THAT(Text(), EndsWith("\n"));
}

// A call sent again starts over from zero: the library reports the new
// attempt, with zero bytes, as it begins. The bar draws it at once, says which
// attempt it is, and gives that attempt's rate (16 MiB in the 100 ms since
// it began), not one over the whole call or over the wait before it (here 40 s:
// a stalled connection, then the backoff).
TEST_F(ProgressBarTest, ANewAttemptIsDrawnAtOnceAndNamed) {
  ProgressBar bar = MakeBar();
  PassTheQuietStart();
  bar.Update({kTotal / 2, 0, kTotal});
  now_ += absl::Seconds(40);
  bar.Update({0, 0, kTotal, /*attempt=*/2});
  EXPECT_THAT(LastLine(), HasSubstr("(attempt 2)"));
  now_ += absl::Milliseconds(100);
  bar.Update({kTotal / 4, 0, kTotal, /*attempt=*/2});
  EXPECT_THAT(LastLine(), HasSubstr(" 25% "));
  EXPECT_THAT(LastLine(), HasSubstr(" 167.8 MB/s (attempt 2)"));
  const std::string text = Text();
  EXPECT_THAT(text.substr(0, text.find("(attempt 2)")),
              ::testing::Not(HasSubstr("attempt")));
}

// The rate is in GB/s, as the service's figures are, down to where that
// would read 0.00: a slow link shows MB/s or kB/s.
TEST_F(ProgressBarTest, TheRateReadsOnFastAndSlowLinks) {
  {
    ProgressBar bar = MakeBar();
    now_ += absl::Seconds(10);
    bar.Update({1 << 20, 0, kTotal});  // 1 MiB in 10 s.
    EXPECT_THAT(LastLine(), HasSubstr(" 105 kB/s"));
    now_ += absl::Seconds(10);
    bar.Update({kTotal / 2, 0, kTotal});  // 32 MiB in 20 s.
    EXPECT_THAT(LastLine(), HasSubstr(" 1.7 MB/s"));
  }
  constexpr uint64_t kLarge = uint64_t{4} << 30;
  ProgressBar bar = MakeBar();
  now_ += absl::Milliseconds(600);
  bar.Update({kLarge / 2, 0, kLarge});  // 2 GiB in 0.6 s.
  EXPECT_THAT(LastLine(), HasSubstr(" 3.58 GB/s"));
}

// A throttled update that the transfer then stops at is drawn by Done, so a
// failed transfer shows where it stopped.
TEST_F(ProgressBarTest, DoneDrawsTheLastUpdate) {
  ProgressBar bar = MakeBar();
  PassTheQuietStart();
  bar.Update({kTotal / 4, 0, kTotal});
  now_ += absl::Milliseconds(10);
  bar.Update({kTotal / 2, 0, kTotal});
  bar.Done();
  EXPECT_THAT(LastLine(), HasSubstr(" 50%"));
}

// The upload's last chunk is drawn however soon it follows the one before:
// while the server transposes, the bar shows everything sent, not where the
// redraw interval happened to stop it.
TEST_F(ProgressBarTest, TheFinishedUploadIsDrawnBeforeTheWait) {
  ProgressBar bar = MakeBar();
  PassTheQuietStart();
  bar.Update({kTotal / 2, 0, kTotal});
  now_ += absl::Milliseconds(10);
  bar.Update({kTotal, 0, kTotal});
  EXPECT_THAT(LastLine(), HasSubstr("sending  ["));
  EXPECT_THAT(LastLine(), HasSubstr("100%"));
}

TEST_F(ProgressBarTest, ShortTransfersAndDisabledBarsDrawNothing) {
  {
    ProgressBar quick = MakeBar();
    now_ += absl::Milliseconds(400);
    quick.Update({kTotal, kTotal, kTotal});
    quick.Done();
    ProgressBar off = MakeBar(/*enabled=*/false);
    PassTheQuietStart();
    off.Update({kTotal, kTotal, kTotal});
  }
  EXPECT_EQ(Text(), "");
}

}  // namespace
}  // namespace transpose
