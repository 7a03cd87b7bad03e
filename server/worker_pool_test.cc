#include "server/worker_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace transpose {
namespace {

TEST(WorkerPoolTest, OneThreadRunsTasksInOrder) {
  std::vector<int> order;
  {
    WorkerPool pool(1);
    for (int i = 0; i < 100; ++i)
      pool.Schedule([&order, i] { order.push_back(i); });
  }
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

struct Rendezvous {
  std::mutex mutex;
  std::condition_variable changed;
  int started = 0, met = 0, finished = 0;
};

// Schedules `tasks` tasks that each wait (up to 2 s) for all of them to have
// started; returns how many saw that happen: all, only if the pool ran them at
// once on separate threads.
int TasksThatMet(WorkerPool& pool, int tasks) {
  auto state = std::make_shared<Rendezvous>();
  for (int i = 0; i < tasks; ++i) {
    pool.Schedule([state, tasks] {
      std::unique_lock<std::mutex> lock(state->mutex);
      ++state->started;
      state->changed.notify_all();
      if (state->changed.wait_for(lock, std::chrono::seconds(2),
                                  [&] { return state->started == tasks; })) {
        ++state->met;
      }
      ++state->finished;
      state->changed.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(state->mutex);
  state->changed.wait(lock, [&] { return state->finished == tasks; });
  return state->met;
}

TEST(WorkerPoolTest, TasksRunInParallel) {
  WorkerPool pool(4);
  EXPECT_EQ(TasksThatMet(pool, 4), 4);
}

// While a thread spins, Schedule skips waking the others; tasks queued together
// must still spread over every thread, not wait behind the first.
TEST(WorkerPoolTest, SpinningPoolStillRunsTasksInParallel) {
  WorkerPool pool(4, {}, absl::Milliseconds(50));
  for (int round = 0; round < 5; ++round) {
    EXPECT_EQ(TasksThatMet(pool, 4), 4) << "round " << round;
  }
}

TEST(WorkerPoolTest, SpinningPoolRunsEveryTaskFromManyThreads) {
  std::atomic<int> ran{0};
  {
    WorkerPool pool(3, {}, absl::Microseconds(200));
    std::vector<std::thread> producers;
    for (int p = 0; p < 4; ++p) {
      producers.emplace_back([&] {
        for (int i = 0; i < 2000; ++i) {
          pool.Schedule([&ran] { ran.fetch_add(1); });
          if (i % 100 == 0)
            std::this_thread::sleep_for(std::chrono::microseconds(300));
        }
      });
    }
    for (std::thread& producer : producers) producer.join();
  }  // The destructor runs what is still queued.
  EXPECT_EQ(ran.load(), 8000);
}

// A pool whose only thread is stuck (as a hung GPU's stream thread would be):
// once diverted, the task queued behind the stuck one and every later task run
// on their callers' threads instead of waiting.
TEST(WorkerPoolTest, DivertedPoolRunsTasksOnCallersWhileItsThreadsAreStuck) {
  std::promise<void> unstick;
  std::shared_future<void> stuck = unstick.get_future().share();
  WorkerPool pool(1);
  std::promise<void> stuck_started;
  pool.Schedule([stuck, &stuck_started] {
    stuck_started.set_value();
    stuck.wait();
  });
  stuck_started.get_future().wait();
  std::thread::id queued_ran_on, later_ran_on;
  pool.Schedule(
      [&queued_ran_on] { queued_ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(pool.queued(), 1u);
  pool.RunTasksOnCallersFromNowOn();
  EXPECT_EQ(queued_ran_on, std::this_thread::get_id());
  EXPECT_EQ(pool.queued(), 0u);
  std::thread caller([&pool, &later_ran_on] {
    pool.Schedule(
        [&later_ran_on] { later_ran_on = std::this_thread::get_id(); });
    EXPECT_EQ(later_ran_on, std::this_thread::get_id());
  });
  const std::thread::id caller_id = caller.get_id();
  caller.join();
  EXPECT_EQ(later_ran_on, caller_id);
  unstick.set_value();
}

TEST(WorkerPoolTest, StartHookRunsOnEveryThread) {
  std::atomic<int> started{0};
  {
    WorkerPool pool(3, [&started](int) { started.fetch_add(1); });
  }
  EXPECT_EQ(started.load(), 3);
}

}  // namespace
}  // namespace transpose
