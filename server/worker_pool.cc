#include "server/worker_pool.h"

#include <utility>

namespace transpose {

WorkerPool::WorkerPool(int threads,
                       absl::AnyInvocable<void(int) const> on_thread_start)
    : on_thread_start_(std::move(on_thread_start)) {
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i)
    threads_.emplace_back([this, i] { Loop(i); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_all();
  for (std::thread& thread : threads_) thread.join();
}

void WorkerPool::Schedule(absl::AnyInvocable<void() &&> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  ready_.notify_one();
}

size_t WorkerPool::queued() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tasks_.size();
}

void WorkerPool::Loop(int index) {
  if (on_thread_start_) on_thread_start_(index);
  while (true) {
    absl::AnyInvocable<void() &&> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // Stopping and drained.
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    std::move(task)();
  }
}

}  // namespace transpose
