// A fixed set of threads running queued tasks in FIFO order. The CPU backend's
// workers and the CUDA backend's per-stream threads are each one pool.
#ifndef TRANSPOSE_SERVER_WORKER_POOL_H_
#define TRANSPOSE_SERVER_WORKER_POOL_H_

#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

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
  bool HasTaskOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  absl::AnyInvocable<void(int) const> on_thread_start_;
  mutable absl::Mutex mutex_;
  std::deque<absl::AnyInvocable<void() &&>> tasks_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_WORKER_POOL_H_
