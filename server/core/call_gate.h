// Counts the calls running and, once closed, turns new ones away: what a
// graceful drain needs, so that calls arriving during it are refused by the
// service (UNAVAILABLE) rather than caught in the transport's own shutdown,
// where a call racing it can end CANCELLED.
#ifndef TRANSPOSE_SERVER_CORE_CALL_GATE_H_
#define TRANSPOSE_SERVER_CORE_CALL_GATE_H_

#include <condition_variable>
#include <mutex>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace transpose {

class CallGate {
 public:
  // Whether a call may start; if it may, it counts as running until Leave.
  bool TryEnter() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return false;
    ++running_;
    return true;
  }
  void Leave() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--running_ == 0) no_calls_.notify_all();
  }
  // From now on TryEnter refuses; running calls go on.
  void Close() {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  // Waits until no call runs, or until `deadline`; whether none does.
  bool AwaitNoCalls(absl::Time deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    return no_calls_.wait_for(lock,
                              absl::ToChronoNanoseconds(deadline - absl::Now()),
                              [this] { return running_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable no_calls_;
  int running_ = 0;
  bool closed_ = false;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_CALL_GATE_H_
