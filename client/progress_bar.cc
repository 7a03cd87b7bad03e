#include "client/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace transpose {

namespace {

// GB/s as the service's figures are, in smaller units on slow links, which
// would otherwise read 0.00 GB/s.
std::string RateText(double bytes_per_second) {
  if (bytes_per_second >= 1e9) {
    return absl::StrFormat("%.2f GB/s", bytes_per_second / 1e9);
  }
  if (bytes_per_second >= 1e6) {
    return absl::StrFormat("%.1f MB/s", bytes_per_second / 1e6);
  }
  return absl::StrFormat("%.0f kB/s", bytes_per_second / 1e3);
}

}  // namespace

ProgressBar::ProgressBar(bool enabled, std::FILE* out,
                         std::function<absl::Time()> clock)
    : enabled_(enabled),
      out_(out),
      clock_(std::move(clock)),
      start_(clock_()),
      attempt_start_(start_),
      last_update_(start_) {}

bool ProgressBar::StderrIsTerminal() { return isatty(STDERR_FILENO) == 1; }

void ProgressBar::Update(const TransferProgress& progress) {
  if (!enabled_ || progress.total_bytes == 0) return;
  const bool new_attempt = progress.attempt != last_.attempt;
  last_ = progress;
  undrawn_ = true;
  const absl::Time now = clock_();
  // The library reports a new attempt, with zero bytes, as it begins.
  if (new_attempt) attempt_start_ = now;
  last_update_ = now;
  // Short transfers draw nothing; the rest redraw at most every 100 ms, except
  // for the last update of each direction: the bar shows the whole upload
  // while the server works, and ends at 100%. A call sent again shows its
  // new attempt at once, so the bar going back is explained.
  const bool finished = progress.received_bytes == progress.total_bytes ||
                        (progress.received_bytes == 0 &&
                         progress.sent_bytes == progress.total_bytes);
  if (now - start_ < absl::Milliseconds(500) ||
      (!finished && !new_attempt && now - last_draw_ < absl::Milliseconds(100)))
    return;
  Draw(now);
}

void ProgressBar::Draw(absl::Time now) {
  last_draw_ = now;
  undrawn_ = false;
  const bool uploading = last_.received_bytes == 0;
  const uint64_t done = uploading ? last_.sent_bytes : last_.received_bytes;
  const double fraction =
      static_cast<double>(done) / static_cast<double>(last_.total_bytes);
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(fraction * kWidth);
  const double seconds =
      std::max(absl::ToDoubleSeconds(now - attempt_start_), 1e-3);
  const double moved =
      static_cast<double>(last_.sent_bytes + last_.received_bytes);
  absl::FPrintF(
      out_, "\r%-8s [%s%s] %3.0f%% %.1f/%.1f MiB %s %s",
      uploading ? "sending" : "receiving", std::string(filled, '#'),
      std::string(kWidth - filled, '.'), 100 * fraction, done / 1048576.0,
      last_.total_bytes / 1048576.0, RateText(moved / seconds),
      last_.attempt > 1 ? absl::StrFormat("(attempt %d) ", last_.attempt) : "");
  std::fflush(out_);
  drawn_ = true;
}

void ProgressBar::Done() {
  // Once a bar is up, it shows where the transfer ended.
  if (drawn_ && undrawn_) Draw(clock_());
  if (drawn_) std::fputc('\n', out_);
  drawn_ = false;
}

}  // namespace transpose
