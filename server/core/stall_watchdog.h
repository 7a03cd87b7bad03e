// Looks in on long-lived calls from one thread, so that a call whose peer stops
// moving data (a client that sends a header and then nothing, or stops reading
// the response) can be ended while the peer's connection is still alive:
// keepalive only notices connections that go silent, and a call without a
// deadline would otherwise hold its admission for good.
#ifndef TRANSPOSE_SERVER_CORE_STALL_WATCHDOG_H_
#define TRANSPOSE_SERVER_CORE_STALL_WATCHDOG_H_

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"

namespace transpose {

class StallWatchdog {
 public:
  // Monotonic, so that a change of the system's time neither cuts calls short
  // nor hides stalls.
  using Clock = std::chrono::steady_clock;

  class Watched {
   public:
    virtual ~Watched() = default;
    // Called on the watchdog's thread every period while registered, with no
    // lock of the watchdog's held (a slow check holds up no Add or Remove). It
    // may end the call; should that remove and destroy this object inline,
    // it must touch nothing afterwards.
    virtual void CheckForStall(Clock::time_point now) = 0;
  };

  // Checks every `period`, on its own thread.
  explicit StallWatchdog(absl::Duration period);
  // Stops the thread. Everything must have been removed.
  ~StallWatchdog();

  StallWatchdog(const StallWatchdog&) = delete;
  StallWatchdog& operator=(const StallWatchdog&) = delete;

  void Add(Watched* watched);
  // Once Remove returns, no check of `watched` runs or will run, so it can
  // then be destroyed: it waits for a running check, unless it is called from
  // within that check.
  void Remove(Watched* watched);

 private:
  void Run();

  const absl::Duration period_;
  std::mutex mutex_;
  // Signals `stopping_`, and the end of each check.
  std::condition_variable changed_;
  absl::flat_hash_set<Watched*> watched_;
  Watched* checking_ = nullptr;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_STALL_WATCHDOG_H_
