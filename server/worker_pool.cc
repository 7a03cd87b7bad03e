#include "server/worker_pool.h"

#include <chrono>
#include <utility>

namespace transpose {
namespace {

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

WorkerPool::WorkerPool(int threads,
                       absl::AnyInvocable<void(int) const> on_thread_start,
                       absl::Duration spin)
    : on_thread_start_(std::move(on_thread_start)), spin_(spin) {
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
    std::unique_lock<std::mutex> lock(mutex_);
    if (run_on_callers_) {
      lock.unlock();
      std::move(task)();
      return;
    }
    tasks_.push_back(std::move(task));
    queued_.fetch_add(1, std::memory_order_release);
  }
  // A spinning thread takes the task, or, if its spin has just ended, finds it
  // under the mutex before it sleeps: no wake-up is lost by skipping this one.
  if (!spinning_.load(std::memory_order_acquire)) ready_.notify_one();
}

void WorkerPool::RunTasksOnCallersFromNowOn() {
  std::deque<absl::AnyInvocable<void() &&>> queued;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    run_on_callers_ = true;
    queued.swap(tasks_);
    queued_.store(0, std::memory_order_release);
  }
  for (absl::AnyInvocable<void() &&>& task : queued) std::move(task)();
}

void WorkerPool::SpinForWork() {
  if (spinning_.exchange(true, std::memory_order_acq_rel)) return;
  const auto deadline =
      std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(spin_);
  while (queued_.load(std::memory_order_acquire) == 0 &&
         std::chrono::steady_clock::now() < deadline) {
    CpuRelax();
  }
  spinning_.store(false, std::memory_order_release);
}

void WorkerPool::Loop(int index) {
  if (on_thread_start_) on_thread_start_(index);
  while (true) {
    if (spin_ > absl::ZeroDuration()) SpinForWork();
    absl::AnyInvocable<void() &&> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // Stopping and drained.
      task = std::move(tasks_.front());
      tasks_.pop_front();
      queued_.fetch_sub(1, std::memory_order_release);
      // Schedule skips the wake-up while a thread spins; pass it on, so that
      // tasks queued behind this one do not wait for it.
      if (!tasks_.empty()) ready_.notify_one();
    }
    std::move(task)();
  }
}

}  // namespace transpose
