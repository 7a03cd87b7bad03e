#include "client/progress_bar.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace transpose {

ProgressBar::ProgressBar(bool enabled, std::FILE* out)
    : enabled_(enabled), out_(out), start_(absl::Now()) {}

bool ProgressBar::StderrIsTerminal() { return isatty(STDERR_FILENO) == 1; }

void ProgressBar::Update(const TransferProgress& progress) {
  if (!enabled_ || progress.total_bytes == 0) return;
  const absl::Time now = absl::Now();
  if (now - start_ < absl::Milliseconds(500) ||
      now - last_draw_ < absl::Milliseconds(100))
    return;
  last_draw_ = now;
  const bool uploading = progress.received_bytes == 0;
  const uint64_t done =
      uploading ? progress.sent_bytes : progress.received_bytes;
  const double fraction =
      static_cast<double>(done) / static_cast<double>(progress.total_bytes);
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(fraction * kWidth);
  const double seconds = absl::ToDoubleSeconds(now - start_);
  const double moved =
      static_cast<double>(progress.sent_bytes + progress.received_bytes);
  absl::FPrintF(out_, "\r%-8s [%s%s] %3.0f%% %.1f/%.1f MiB %.2f GB/s ",
                uploading ? "sending" : "receiving", std::string(filled, '#'),
                std::string(kWidth - filled, '.'), 100 * fraction,
                done / 1048576.0, progress.total_bytes / 1048576.0,
                moved / seconds / 1e9);
  std::fflush(out_);
  drawn_ = true;
}

void ProgressBar::Done() {
  if (drawn_) std::fputc('\n', out_);
  drawn_ = false;
}

}  // namespace transpose
