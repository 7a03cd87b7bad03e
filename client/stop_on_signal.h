// Turns SIGINT and SIGTERM into a CallCanceller's Cancel, so that a long run
// (transpose bench) can end early and still report what it did.
#ifndef TRANSPOSE_CLIENT_STOP_ON_SIGNAL_H_
#define TRANSPOSE_CLIENT_STOP_ON_SIGNAL_H_

#include <signal.h>

#include <atomic>
#include <thread>

#include "client/client.h"

namespace transpose {

// While it lives, SIGINT and SIGTERM cancel `canceller` instead of ending the
// process; a second one ends the process by the signal's default action.
// Construct it before any other thread starts (gRPC's included): threads
// inherit the blocked signals, and a thread that did not would take the signal
// with the process's own disposition. On destruction, a signal that arrives
// afterwards acts as usual.
class StopOnSignal {
 public:
  explicit StopOnSignal(CallCanceller& canceller);
  ~StopOnSignal();
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

  // The first signal that arrived, 0 for none.
  int signal() const { return signal_.load(); }

 private:
  void Watch();

  CallCanceller& canceller_;
  sigset_t signals_;
  sigset_t previous_mask_;
  std::atomic<int> signal_{0};
  std::atomic<bool> done_{false};
  std::thread watcher_;
};

}  // namespace transpose

#endif  // TRANSPOSE_CLIENT_STOP_ON_SIGNAL_H_
