#include "client/stop_on_signal.h"

#include <pthread.h>

#include <csignal>
#include <ctime>

namespace transpose {

StopOnSignal::StopOnSignal(CallCanceller& canceller) : canceller_(canceller) {
  sigemptyset(&signals_);
  for (int signal : {SIGINT, SIGTERM}) {
    // A blocked signal is queued even when ignored, and sigtimedwait would
    // take it.
    struct sigaction current {};
    sigaction(signal, nullptr, &current);
    if (current.sa_handler != SIG_IGN) sigaddset(&signals_, signal);
  }
  pthread_sigmask(SIG_BLOCK, &signals_, &previous_mask_);
  watcher_ = std::thread([this] { Watch(); });
}

StopOnSignal::~StopOnSignal() {
  done_ = true;
  watcher_.join();
  pthread_sigmask(SIG_SETMASK, &previous_mask_, nullptr);
}

void StopOnSignal::Watch() {
  // Polls `done_` between waits: a wait cannot be interrupted portably
  // without sending the process a signal of its own.
  const timespec poll_interval{0, 100 * 1000 * 1000};
  while (!done_) {
    const int received = sigtimedwait(&signals_, nullptr, &poll_interval);
    if (received <= 0) continue;  // Timed out, or interrupted.
    int none = 0;
    if (armed_ && signal_.compare_exchange_strong(none, received)) {
      canceller_.Cancel();
      continue;
    }
    // Unarmed, or the second: end the process as the signal does by default,
    // here, where it is unblocked for this thread alone.
    std::signal(received, SIG_DFL);
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, received);
    pthread_sigmask(SIG_UNBLOCK, &only, nullptr);
    raise(received);
  }
}

}  // namespace transpose
