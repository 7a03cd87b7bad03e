// The engine's own concurrency, with no transport in the way: many threads
// creating, filling, running and abandoning jobs on the real CPU backend at
// once, under admission limits. Run under ThreadSanitizer in CI
// (scripts/test.sh), where every lock involved is the standard library's and so
// visible to it.
#include <atomic>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/core/notification.h"
#include "server/cpu_backend.h"
#include "server/engine.h"
#include "server/worker_pool.h"

namespace transpose {
namespace {

TEST(EngineConcurrencyTest, ManyThreadsCreateRunAndAbandonJobs) {
  prometheus::Registry registry;
  Metrics metrics(registry, "test");
  CpuBackendOptions cpu;
  cpu.calibration_bytes = 1 << 20;
  cpu.incremental_min_bytes = 64 << 10;  // Bands on most jobs.
  cpu.incremental_band_bytes = 16 << 10;
  cpu.max_idle_buffer_bytes = 16 << 20;
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(std::make_unique<CpuBackend>(cpu, metrics));
  EngineOptions options;
  options.max_inflight_bytes = 1 << 20;
  options.max_inflight_requests =
      5;  // Fewer than the threads: some get refused.
  Engine engine(std::move(backends), options);

  // Each thread goes on until it has had kAdmitted jobs admitted, however many
  // attempts the admission limits refuse (that number depends on timing; the
  // counts below do not).
  constexpr int kThreads = 8;
  constexpr int kAdmitted = 40;
  std::atomic<int> verified{0}, abandoned{0}, refused{0}, wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      int admitted = 0;
      while (admitted < kAdmitted) {
        // Half the shapes are whole cache lines of rows and columns, which
        // the CPU backend transposes from the pieces in place.
        const bool lines = rng() % 2 == 0;
        const MatrixShape shape{1 + rng() % 2,
                                lines ? 32 * (1 + rng() % 9) : 1 + rng() % 300,
                                lines ? 32 * (1 + rng() % 9) : 1 + rng() % 300};
        absl::StatusOr<std::unique_ptr<TransposeJob>> job = engine.CreateJob(
            {DataType::kUInt16, shape, kernels::Algorithm::kAuto});
        if (!job.ok()) {
          ++refused;  // Admission limits: expected under this load.
          // A pause, as a client would take, so refused threads do not
          // starve the admitted ones of the CPU.
          absl::SleepFor(absl::Microseconds(50));
          continue;
        }
        // Owned by the job's pieces too: it may outlive this iteration.
        auto owned = std::make_shared<std::vector<uint16_t>>(shape.elements());
        const std::vector<uint16_t>& input = *owned;
        for (uint16_t& v : *owned) v = static_cast<uint16_t>(rng());
        const absl::string_view source(
            reinterpret_cast<const char*>(input.data()), input.size() * 2);
        // Hand it over in pieces; every fifth admitted job, walk away halfway.
        const bool abandon = ++admitted % 5 == 0;
        const size_t stop = abandon ? source.size() / 2 : source.size();
        for (size_t done = 0; done < stop;) {
          const size_t n = std::min<size_t>(stop - done, 1 + rng() % 40000);
          (*job)->AppendInput({source.substr(done, n)}, owned);
          done += n;
        }
        if (abandon) {
          ++abandoned;
          continue;  // Destroyed with bands possibly running.
        }
        Notification finished;
        absl::Status status;
        (*job)->Run([&](absl::Status s) {
          status = s;
          finished.Notify();
        });
        finished.WaitForNotification();
        const auto* out =
            reinterpret_cast<const uint16_t*>((*job)->output().data());
        bool same = status.ok();
        for (uint64_t b = 0; same && b < shape.batch; ++b)
          for (uint64_t r = 0; same && r < shape.rows; ++r)
            for (uint64_t c = 0; same && c < shape.cols; ++c)
              same = out[(b * shape.cols + c) * shape.rows + r] ==
                     input[(b * shape.rows + r) * shape.cols + c];
        same ? ++verified : ++wrong;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(verified, kThreads * kAdmitted * 4 / 5);
  EXPECT_EQ(abandoned, kThreads * kAdmitted / 5);
  // Eight threads on five admission slots: some attempts find them full.
  EXPECT_GT(refused, 0);
  EXPECT_EQ(engine.inflight_bytes(), 0u);
  EXPECT_EQ(engine.inflight_requests(), 0);
  std::printf(
      "engine concurrency: %d verified, %d abandoned mid-upload, %d refused by "
      "admission\n",
      verified.load(), abandoned.load(), refused.load());
}

TEST(WorkerPoolTest, RunsEveryTaskScheduledFromManyThreadsBeforeItGoes) {
  std::atomic<int> ran{0};
  {
    WorkerPool pool(3);
    std::vector<std::thread> producers;
    for (int t = 0; t < 4; ++t) {
      producers.emplace_back([&] {
        for (int i = 0; i < 500; ++i) pool.Schedule([&] { ++ran; });
      });
    }
    for (std::thread& producer : producers) producer.join();
  }  // The destructor runs what is still queued.
  EXPECT_EQ(ran, 2000);
}

}  // namespace
}  // namespace transpose
