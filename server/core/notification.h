// A one-shot event between threads, on std::mutex and std::condition_variable.
// The project synchronises only with the standard library's primitives:
// Debian's Abseil is not built for ThreadSanitizer, so absl::Mutex and
// absl::Notification would hide every happens-before edge from the TSan build
// and flood it with false reports.
#ifndef TRANSPOSE_SERVER_CORE_NOTIFICATION_H_
#define TRANSPOSE_SERVER_CORE_NOTIFICATION_H_

#include <condition_variable>
#include <mutex>

#include "absl/time/time.h"

namespace transpose {

class Notification {
 public:
  void Notify() {
    std::lock_guard<std::mutex> lock(mutex_);
    notified_ = true;
    notified_changed_.notify_all();
  }
  void WaitForNotification() {
    std::unique_lock<std::mutex> lock(mutex_);
    notified_changed_.wait(lock, [this] { return notified_; });
  }
  // True if notified within `timeout`.
  bool WaitForNotificationWithTimeout(absl::Duration timeout) {
    std::unique_lock<std::mutex> lock(mutex_);
    return notified_changed_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                                      [this] { return notified_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable notified_changed_;
  bool notified_ = false;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_NOTIFICATION_H_
