// A fixed set of threads running queued tasks in FIFO order (or, once
// diverted, tasks run on their callers' threads). The CPU backend's workers and
// the CUDA backend's per-stream threads are each one pool.
#ifndef TRANSPOSE_SERVER_WORKER_POOL_H_
#define TRANSPOSE_SERVER_WORKER_POOL_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/time/time.h"

namespace transpose {

class WorkerPool {
 public:
  // Starts `threads` threads; `on_thread_start` (may be empty) runs first on
  // each, with the thread's index (e.g. to bind it to a CUDA device). With a
  // positive `spin`, one idle thread at a time polls the queue for that long
  // before it sleeps, so a task scheduled soon after the last one starts
  // without waiting for a thread to wake (15-25 us on the H200's host, as long
  // as a small job); it costs up to one core while the pool is busy.
  explicit WorkerPool(int threads,
                      absl::AnyInvocable<void(int) const> on_thread_start = {},
                      absl::Duration spin = absl::ZeroDuration());
  // Runs every task already queued, then joins the threads.
  ~WorkerPool();

  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `task`; once the pool is diverted, runs it here before returning,
  // so callers must not hold a lock the task takes.
  void Schedule(absl::AnyInvocable<void() &&> task);

  // From now on Schedule runs each task on its caller's thread, and the tasks
  // already queued run now on this one. For a pool whose threads may never
  // come back (a hung GPU's stream threads) once its tasks only fail fast:
  // without it they would wait behind the hung ones for good.
  void RunTasksOnCallersFromNowOn();

  // Tasks queued and not yet started.
  size_t queued() const { return queued_.load(std::memory_order_acquire); }
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop(int index);
  // Polls for a queued task for up to spin_, unless another thread already
  // does.
  void SpinForWork();

  absl::AnyInvocable<void(int) const> on_thread_start_;
  const absl::Duration spin_;
  // Guards tasks_, stopping_ and run_on_callers_; ready_ wakes the threads.
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<absl::AnyInvocable<void() &&>> tasks_;
  bool stopping_ = false;
  bool run_on_callers_ = false;
  // tasks_.size(), readable without the mutex.
  std::atomic<size_t> queued_{0};
  // Whether a thread is in SpinForWork.
  std::atomic<bool> spinning_{false};
  std::vector<std::thread> threads_;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_WORKER_POOL_H_
