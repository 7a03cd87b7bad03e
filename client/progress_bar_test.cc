#include "client/progress_bar.h"

#include <cstdio>
#include <functional>
#include <string>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace transpose {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;

std::string Contents(std::FILE* file) {
  std::fflush(file);
  std::rewind(file);
  std::string text;
  char buffer[512];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file)) > 0)
    text.append(buffer, n);
  return text;
}

constexpr uint64_t kTotal = 64 << 20;

// A clock that moves only when told.
struct FakeClock {
  absl::Time now = absl::UnixEpoch();
  std::function<absl::Time()> Function() {
    return [this] { return now; };
  }
};

// The last update comes within the redraw interval of the one before (the
// final chunks arrive fast); the bar still ends at 100%.
TEST(ProgressBarTest, EndsAtOneHundredPercent) {
  std::FILE* out = std::tmpfile();
  FakeClock clock;
  {
    ProgressBar bar(true, out, clock.Function());
    clock.now += absl::Milliseconds(600);  // Past the quiet start.
    bar.Update({kTotal, kTotal / 2, kTotal});
    clock.now += absl::Milliseconds(10);
    bar.Update({kTotal, kTotal - 1, kTotal});
    clock.now += absl::Milliseconds(10);
    bar.Update({kTotal, kTotal, kTotal});
    bar.Done();
  }
  const std::string text = Contents(out);
  EXPECT_THAT(text, HasSubstr("receiving ["));
  const std::string last_line = text.substr(text.rfind('\r'));
  EXPECT_THAT(last_line, HasSubstr("100%"));
  EXPECT_THAT(text, EndsWith("\n"));
  std::fclose(out);
}

// A call sent again starts over from zero: its first update is drawn at once,
// however soon it comes, says which attempt it is, and gives that attempt's
// rate (16 MiB in the 10 ms since the first attempt's last update), not one
// over the whole call.
TEST(ProgressBarTest, ANewAttemptIsDrawnAtOnceAndNamed) {
  std::FILE* out = std::tmpfile();
  FakeClock clock;
  {
    ProgressBar bar(true, out, clock.Function());
    clock.now += absl::Milliseconds(600);
    bar.Update({kTotal / 2, 0, kTotal});
    clock.now += absl::Milliseconds(10);
    bar.Update({kTotal / 4, 0, kTotal, /*attempt=*/2});
    const std::string text = Contents(out);
    const std::string last_line = text.substr(text.rfind('\r'));
    EXPECT_THAT(last_line, HasSubstr(" 25% "));
    EXPECT_THAT(last_line, HasSubstr(" 1.68 GB/s (attempt 2)"));
    EXPECT_THAT(text.substr(0, text.rfind('\r')),
                ::testing::Not(HasSubstr("attempt")));
  }
  std::fclose(out);
}

// A throttled update that the transfer then stops at is drawn by Done, so a
// failed transfer shows where it stopped.
TEST(ProgressBarTest, DoneDrawsTheLastUpdate) {
  std::FILE* out = std::tmpfile();
  FakeClock clock;
  ProgressBar bar(true, out, clock.Function());
  clock.now += absl::Milliseconds(600);
  bar.Update({kTotal / 4, 0, kTotal});
  clock.now += absl::Milliseconds(10);
  bar.Update({kTotal / 2, 0, kTotal});
  bar.Done();
  const std::string text = Contents(out);
  EXPECT_THAT(text.substr(text.rfind('\r')), HasSubstr(" 50%"));
  std::fclose(out);
}

// The upload's last chunk is drawn however soon it follows the one before:
// while the server transposes, the bar shows everything sent, not where the
// redraw interval happened to stop it.
TEST(ProgressBarTest, TheFinishedUploadIsDrawnBeforeTheWait) {
  std::FILE* out = std::tmpfile();
  FakeClock clock;
  ProgressBar bar(true, out, clock.Function());
  clock.now += absl::Milliseconds(600);
  bar.Update({kTotal / 2, 0, kTotal});
  clock.now += absl::Milliseconds(10);
  bar.Update({kTotal, 0, kTotal});
  const std::string text = Contents(out);
  EXPECT_THAT(text.substr(text.rfind('\r')), HasSubstr("sending  ["));
  EXPECT_THAT(text.substr(text.rfind('\r')), HasSubstr("100%"));
  bar.Done();
  std::fclose(out);
}

TEST(ProgressBarTest, ShortTransfersAndDisabledBarsDrawNothing) {
  std::FILE* out = std::tmpfile();
  FakeClock clock;
  {
    ProgressBar quick(true, out, clock.Function());
    clock.now += absl::Milliseconds(400);
    quick.Update({kTotal, kTotal, kTotal});
    quick.Done();
    ProgressBar off(false, out, clock.Function());
    clock.now += absl::Milliseconds(600);
    off.Update({kTotal, kTotal, kTotal});
  }
  EXPECT_EQ(Contents(out), "");
  std::fclose(out);
}

}  // namespace
}  // namespace transpose
