// Turns SIGINT and SIGTERM into a CallCanceller's Cancel, so that a long run
// (transpose bench) can end early and still report what it did.
#ifndef TRANSPOSE_CLIENT_STOP_ON_SIGNAL_H_
#define TRANSPOSE_CLIENT_STOP_ON_SIGNAL_H_

#include <signal.h>

#include <atomic>
#include <thread>

#include "client/client.h"

namespace transpose {

// While it lives, SIGINT and SIGTERM wait in a thread of their own. While it
// is armed, the first cancels `canceller` instead of ending the process;
// otherwise, and for a second one, the process ends by the signal's default
// action. A signal the process ignores (a background job's SIGINT) stays
// ignored. Construct it before any other thread starts (gRPC's included):
// threads inherit the blocked signals, and a thread that did not would take
// the signal with the process's own disposition. On destruction, a signal that
// arrives afterwards acts as usual.
class StopOnSignal {
 public:
  explicit StopOnSignal(CallCanceller& canceller);
  ~StopOnSignal();
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

  void Arm() { armed_ = true; }
  void Disarm() { armed_ = false; }

  // The signal that cancelled, 0 for none.
  int signal() const { return signal_.load(); }

 private:
  void Watch();

  CallCanceller& canceller_;
  sigset_t signals_;
  sigset_t previous_mask_;
  std::atomic<bool> armed_{false};
  std::atomic<int> signal_{0};
  std::atomic<bool> done_{false};
  std::thread watcher_;
};

}  // namespace transpose

#endif  // TRANSPOSE_CLIENT_STOP_ON_SIGNAL_H_
