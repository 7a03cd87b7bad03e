// A fixed set of threads running queued tasks in FIFO order. The CPU backend's
// workers and the CUDA backend's per-stream threads are each one pool.
#ifndef TRANSPOSE_SERVER_WORKER_POOL_H_
#define TRANSPOSE_SERVER_WORKER_POOL_H_

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/functional/any_invocable.h"

namespace transpose {

class WorkerPool {
 public:
  // Starts `threads` threads; `on_thread_start` (may be empty) runs first on
  // each, with the thread's index (e.g. to bind it to a CUDA device).
  explicit WorkerPool(int threads,
                      absl::AnyInvocable<void(int) const> on_thread_start = {});
  // Runs every task already queued, then joins the threads.
  ~WorkerPool();

  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void Schedule(absl::AnyInvocable<void() &&> task);

  // Tasks queued and not yet started.
  size_t queued() const;
  int threads() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop(int index);

  absl::AnyInvocable<void(int) const> on_thread_start_;
  // Guards tasks_ and stopping_; ready_ wakes the threads.
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<absl::AnyInvocable<void() &&>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_WORKER_POOL_H_
