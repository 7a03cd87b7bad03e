#include "server/core/stall_watchdog.h"

#include <vector>

namespace transpose {

StallWatchdog::StallWatchdog(absl::Duration period)
    : period_(period), thread_([this] { Run(); }) {}

StallWatchdog::~StallWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void StallWatchdog::Add(Watched* watched) {
  std::lock_guard<std::mutex> lock(mutex_);
  watched_.insert(watched);
}

void StallWatchdog::Remove(Watched* watched) {
  std::unique_lock<std::mutex> lock(mutex_);
  watched_.erase(watched);
  if (std::this_thread::get_id() == thread_.get_id()) return;
  changed_.wait(lock, [&] { return checking_ != watched; });
}

void StallWatchdog::Run() {
  std::unique_lock<std::mutex> lock(mutex_);
  std::vector<Watched*> round;
  while (!changed_.wait_for(lock, absl::ToChronoNanoseconds(period_),
                            [this] { return stopping_; })) {
    const Clock::time_point now = Clock::now();
    round.assign(watched_.begin(), watched_.end());
    for (Watched* watched : round) {
      // Removed (and maybe destroyed) since the round began.
      if (!watched_.contains(watched)) continue;
      checking_ = watched;
      lock.unlock();
      watched->CheckForStall(now);
      lock.lock();
      checking_ = nullptr;
      changed_.notify_all();
    }
  }
}

}  // namespace transpose
