// Keeps a flood of one kind of log line (a client failing call after call, an
// overloaded server refusing thousands a second) from flooding the log, while
// the log still says how many there were.
#ifndef TRANSPOSE_SERVER_CORE_LOG_RATE_LIMITER_H_
#define TRANSPOSE_SERVER_CORE_LOG_RATE_LIMITER_H_

#include <cstdint>
#include <mutex>
#include <utility>

#include "absl/time/time.h"

namespace transpose {

class LogRateLimiter {
 public:
  // At most `lines` lines go out in each `window`.
  LogRateLimiter(int lines, absl::Duration window)
      : lines_(lines), window_(window) {}

  // Whether a line may go out at `now`. When it may, *held_back is how many
  // lines were held back since the last one that went out (for it to say), so
  // the lines that went out plus their counts are all there were.
  bool Allow(absl::Time now, uint64_t* held_back) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (now - window_start_ >= window_) {
      window_start_ = now;
      in_window_ = 0;
    }
    if (in_window_ >= lines_) {
      ++held_back_;
      return false;
    }
    ++in_window_;
    *held_back = held_back_;
    held_back_ = 0;
    return true;
  }

  // The lines held back since the last one that went out, now counted as
  // reported: for a summary once the flood has stopped, which no next line
  // would otherwise report.
  uint64_t TakeHeldBack() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(held_back_, 0);
  }

 private:
  const int lines_;
  const absl::Duration window_;
  std::mutex mutex_;
  absl::Time window_start_ = absl::InfinitePast();
  int in_window_ = 0;
  uint64_t held_back_ = 0;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_LOG_RATE_LIMITER_H_
