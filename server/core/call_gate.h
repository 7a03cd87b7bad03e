// Counts the calls running and, once closed, turns new ones away with
// UNAVAILABLE: what a graceful drain needs to wait for the running calls and
// refuse the ones that still reach the service while the transport shuts down.
// It also knows when the drain ends, so that the calls cut off then can say
// so.
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
    if (DrainOverLocked()) ++left_after_drain_;
    if (--running_ == 0) no_calls_.notify_all();
  }
  // From now on TryEnter refuses; running calls go on until `drain_deadline`.
  void Close(absl::Time drain_deadline = absl::InfiniteFuture()) {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
    drain_deadline_ = drain_deadline;
  }
  // Whether the drain's deadline has passed: a call ending now was cut off.
  bool DrainOver() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return DrainOverLocked();
  }
  // The calls the drain cut off, once it is over: those that ran past its
  // deadline, whether they have left since or not. gRPC's shutdown cancels
  // the calls at the same deadline as a wait for them ends, so by the time
  // the wait sees it has ended, they may have left already. A call that
  // finished just before the deadline but left just after counts too.
  int CutOff() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return DrainOverLocked() ? left_after_drain_ + running_ : 0;
  }
  int running() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return running_;
  }
  // Waits until no call runs, or until `deadline`; whether none does.
  bool AwaitNoCalls(absl::Time deadline) {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto none_running = [this] { return running_ == 0; };
    // An infinite wait as a duration would overflow the clock's arithmetic
    // and return at once.
    if (deadline == absl::InfiniteFuture()) {
      no_calls_.wait(lock, none_running);
      return true;
    }
    return no_calls_.wait_for(
        lock, absl::ToChronoNanoseconds(deadline - absl::Now()), none_running);
  }

 private:
  bool DrainOverLocked() const {
    return closed_ && absl::Now() >= drain_deadline_;
  }

  mutable std::mutex mutex_;
  std::condition_variable no_calls_;
  int running_ = 0;
  bool closed_ = false;
  absl::Time drain_deadline_ = absl::InfiniteFuture();
  int left_after_drain_ = 0;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_CALL_GATE_H_
