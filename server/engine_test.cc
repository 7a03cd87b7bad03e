#include "server/engine.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "server/core/notification.h"
#include "server/core/retry.h"
#include "server/cpu_backend.h"
#include "server/fake_backend.h"

namespace transpose {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A vector's bytes, as a transport would deliver them.
template <typename T>
absl::string_view AsBytes(const std::vector<T>& v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T)};
}

const TransposeSpec kSpec{
    DataType::kFloat32, {1, 4, 8}, kernels::Algorithm::kAuto};

struct Fakes {
  std::vector<FakeBackend*> backends;
  std::unique_ptr<Engine> engine;
};

Fakes MakeEngine(int n, EngineOptions options = {}) {
  Fakes fakes;
  std::vector<std::unique_ptr<Backend>> backends;
  for (int i = 0; i < n; ++i) {
    auto backend = std::make_unique<FakeBackend>(absl::StrCat("fake:", i));
    fakes.backends.push_back(backend.get());
    backends.push_back(std::move(backend));
  }
  fakes.engine = std::make_unique<Engine>(std::move(backends), options);
  return fakes;
}

// Runs `job` and waits for it; its status.
absl::Status RunAndWait(TransposeJob& job) {
  Notification done;
  absl::Status result;
  job.Run([&](absl::Status status) {
    result = status;
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

std::string BackendOf(Engine& engine, const TransposeSpec& spec = kSpec) {
  absl::StatusOr<std::unique_ptr<TransposeJob>> job = engine.CreateJob(spec);
  if (!job.ok()) return job.status().ToString();
  RunAndWait(**job).IgnoreError();
  return (*job)->stats().backend;
}

TEST(EngineTest, PicksTheLeastLoadedBackend) {
  Fakes fakes = MakeEngine(3);
  fakes.backends[0]->load_value = 5;
  fakes.backends[1]->load_value = 1;
  fakes.backends[2]->load_value = 3;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(BackendOf(*fakes.engine), "fake:1");
}

TEST(EngineTest, SpreadsEquallyLoadedRequestsOverEveryBackend) {
  Fakes fakes = MakeEngine(3);
  for (int i = 0; i < 30; ++i) BackendOf(*fakes.engine);
  for (FakeBackend* backend : fakes.backends)
    EXPECT_EQ(backend->jobs_created, 10);
}

TEST(EngineTest, SkipsUnhealthyBackends) {
  Fakes fakes = MakeEngine(2);
  fakes.backends[0]->is_healthy = false;
  for (int i = 0; i < 4; ++i) EXPECT_EQ(BackendOf(*fakes.engine), "fake:1");
  EXPECT_TRUE(fakes.engine->healthy());
  fakes.backends[1]->is_healthy = false;
  EXPECT_FALSE(fakes.engine->healthy());
  const absl::Status status = fakes.engine->CreateJob(kSpec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  // What the runbook tells operators to look for.
  EXPECT_THAT(status.message(),
              HasSubstr("no backend of this server is in service"));
}

TEST(EngineTest, SaysWhyNoBackendCanRunASpec) {
  Fakes fakes = MakeEngine(1);
  fakes.backends[0]->can_run = absl::UnimplementedError("no naive here");
  absl::Status status = fakes.engine->CreateJob(kSpec).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("no naive here"));
}

TEST(EngineTest, RejectsMalformedSpecsBeforeAnyBackendSeesThem) {
  Fakes fakes = MakeEngine(1);
  TransposeSpec unspecified = kSpec;
  unspecified.dtype = DataType::kUnspecified;
  TransposeSpec zero = kSpec;
  zero.shape.rows = 0;
  TransposeSpec unknown_algorithm = kSpec;
  unknown_algorithm.algorithm = static_cast<kernels::Algorithm>(42);
  for (const TransposeSpec& spec : {unspecified, zero}) {
    EXPECT_EQ(fakes.engine->CreateJob(spec).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  // A kernel newer than this server: not malformed, not here.
  absl::Status status = fakes.engine->CreateJob(unknown_algorithm).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("algorithm 42 is unknown"));
  EXPECT_EQ(fakes.backends[0]->jobs_created, 0);
}

TEST(EngineTest, EnforcesTheMatrixLimit) {
  EngineOptions options;
  options.max_matrix_bytes = 4 * 4 * 8;
  Fakes fakes = MakeEngine(1, options);
  EXPECT_TRUE(fakes.engine->CreateJob(kSpec).ok());
  TransposeSpec bigger = kSpec;
  bigger.shape.rows = 5;
  absl::Status status = fakes.engine->CreateJob(bigger).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("limit"));
}

// A matrix larger than the whole admission budget can never be admitted: it is
// refused as too large, not told to retry, and the limit says so.
TEST(EngineTest, TheMatrixLimitIsAtMostTheAdmissionBudget) {
  EngineOptions options;
  options.max_matrix_bytes = 4 * 5 * 8;
  options.max_inflight_bytes = 4 * 4 * 8;
  Fakes fakes = MakeEngine(1, options);
  EXPECT_EQ(fakes.engine->options().max_matrix_bytes, 4 * 4 * 8);
  TransposeSpec bigger = kSpec;
  bigger.shape.rows = 5;
  absl::Status status = fakes.engine->CreateJob(bigger).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("exceeds the server's limit of 128"));
  EXPECT_THAT(status.message(), Not(HasSubstr("retry")));
}

// One caller at its share is refused while others are still admitted, and gets
// in again once its own jobs are gone; the server-wide limits still hold.
TEST(EngineTest, EnforcesTheLimitsPerCaller) {
  constexpr uint64_t kMatrix = 4 * 8 * 4;  // kSpec's bytes.
  EngineOptions options;
  options.max_inflight_bytes = 5 * kMatrix;
  options.max_inflight_bytes_per_caller = 2 * kMatrix;
  options.max_inflight_requests_per_caller = 3;
  Fakes fakes = MakeEngine(1, options);
  Engine& engine = *fakes.engine;
  std::vector<std::unique_ptr<TransposeJob>> jobs;
  for (int i = 0; i < 2; ++i) jobs.push_back(*engine.CreateJob(kSpec, "a"));
  absl::Status refused = engine.CreateJob(kSpec, "a").status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(),
              HasSubstr("server busy for a: 256 bytes of its matrices in "
                        "flight, and 128 more would pass the limit per caller "
                        "of 256; retry later"));
  EXPECT_TRUE(IsRetryLater(refused));
  // The refusal took nothing.
  EXPECT_EQ(engine.inflight_bytes(), 2 * kMatrix);
  EXPECT_EQ(engine.callers(), 1);
  // Others, and jobs that name no caller, still get in, up to the whole
  // budget.
  jobs.push_back(*engine.CreateJob(kSpec, "b"));
  jobs.push_back(*engine.CreateJob(kSpec, "b"));
  EXPECT_EQ(engine.callers(), 2);
  jobs.push_back(*engine.CreateJob(kSpec));
  EXPECT_THAT(engine.CreateJob(kSpec, "c").status().message(),
              HasSubstr("server busy: 640 bytes of matrices in flight"));
  EXPECT_EQ(engine.callers(), 2);
  // a's first job done: a gets in again.
  jobs.erase(jobs.begin());
  EXPECT_TRUE(engine.CreateJob(kSpec, "a").ok());
  jobs.clear();
  EXPECT_EQ(engine.inflight_bytes(), 0u);
  EXPECT_EQ(engine.callers(), 0);

  // The request limit per caller, with small matrices.
  TransposeSpec tiny = kSpec;
  tiny.shape = {1, 1, 1};
  for (int i = 0; i < 3; ++i) jobs.push_back(*engine.CreateJob(tiny, "a"));
  EXPECT_THAT(engine.CreateJob(tiny, "a").status().message(),
              HasSubstr("3 of its requests in flight, the limit per caller "
                        "is 3"));
  EXPECT_TRUE(engine.CreateJob(tiny, "b").ok());
}

// A request refused for want of room never holds that room, however briefly:
// one that fits is admitted while others that do not fit keep arriving. (The
// counts used to be raised first and checked after, so a refused request
// could crowd out one that fits.)
TEST(EngineTest, RequestsThatDoNotFitNeverCrowdOutOneThatDoes) {
  constexpr uint64_t kMatrix = 4 * 8 * 4;  // kSpec's bytes.
  EngineOptions options;
  options.max_inflight_bytes = 10 * kMatrix;
  Fakes fakes = MakeEngine(1, options);
  Engine& engine = *fakes.engine;
  TransposeSpec six = kSpec, five = kSpec, four = kSpec;
  six.shape.batch = 6;
  five.shape.batch = 5;
  four.shape.batch = 4;
  absl::StatusOr<std::unique_ptr<TransposeJob>> held = engine.CreateJob(six);
  ASSERT_TRUE(held.ok()) << held.status();
  std::atomic<bool> stop{false};
  std::atomic<int> wrongly_admitted{0};
  std::vector<std::thread> crowd;
  for (int t = 0; t < 2; ++t) {
    crowd.emplace_back([&] {
      while (!stop.load()) {
        if (engine.CreateJob(five).ok()) ++wrongly_admitted;
      }
    });
  }
  int refused = 0;
  for (int i = 0; i < 20000; ++i) {
    absl::StatusOr<std::unique_ptr<TransposeJob>> fits = engine.CreateJob(four);
    if (!fits.ok()) ++refused;
  }
  stop = true;
  for (std::thread& thread : crowd) thread.join();
  EXPECT_EQ(refused, 0);
  EXPECT_EQ(wrongly_admitted.load(), 0);
  held->reset();
  EXPECT_EQ(engine.inflight_bytes(), 0u);
  EXPECT_EQ(engine.inflight_requests(), 0);
}

// A backend that fails to make the job gives the admission back: the counts,
// the caller's share included, are as before the request.
TEST(EngineTest, AJobTheBackendCannotMakeGivesItsAdmissionBack) {
  EngineOptions options;
  options.max_inflight_bytes = 1 << 20;
  options.max_inflight_requests_per_caller = 2;
  Fakes fakes = MakeEngine(1, options);
  fakes.backends[0]->create_error =
      absl::ResourceExhaustedError("out of buffers");
  for (int i = 0; i < 3; ++i) {
    const absl::Status status = fakes.engine->CreateJob(kSpec, "a").status();
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(status.message(), HasSubstr("out of buffers"));
  }
  EXPECT_EQ(fakes.engine->inflight_bytes(), 0u);
  EXPECT_EQ(fakes.engine->inflight_requests(), 0);
  EXPECT_EQ(fakes.engine->callers(), 0);
}

// Likewise for a matrix past one caller's share: refused as too large, not
// told to retry for ever.
TEST(EngineTest, TheMatrixLimitIsAtMostACallersShare) {
  EngineOptions options;
  options.max_inflight_bytes_per_caller = 4 * 4 * 8;
  Fakes fakes = MakeEngine(1, options);
  EXPECT_EQ(fakes.engine->options().max_matrix_bytes, 4 * 4 * 8);
  TransposeSpec bigger = kSpec;
  bigger.shape.rows = 5;
  absl::Status status = fakes.engine->CreateJob(bigger, "a").status();
  EXPECT_THAT(status.message(), HasSubstr("exceeds the server's limit of 128"));
  EXPECT_FALSE(IsRetryLater(status));
}

// The real CPU backend behind the engine: results, stats and metrics.
TEST(EngineTest, CpuBackendTransposesAndRecordsMetrics) {
  prometheus::Registry registry;
  Metrics metrics(registry, "test");
  CpuBackendOptions cpu_options;
  cpu_options.calibration_bytes = 1 << 20;
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(std::make_unique<CpuBackend>(cpu_options, metrics));
  Engine engine(std::move(backends), EngineOptions{});
  EXPECT_GT(engine.backends()[0]->info().copy_bandwidth_bytes_per_second, 0);

  // One small job (runs inline) and one large (runs on a worker).
  for (const MatrixShape& shape :
       {MatrixShape{2, 3, 5}, MatrixShape{1, 1000, 700}}) {
    const TransposeSpec spec{DataType::kInt32, shape,
                             kernels::Algorithm::kAuto};
    absl::StatusOr<std::unique_ptr<TransposeJob>> job = engine.CreateJob(spec);
    ASSERT_TRUE(job.ok()) << job.status();
    std::vector<int32_t> input(shape.elements());
    std::mt19937 rng(3);
    for (int32_t& v : input) v = static_cast<int32_t>(rng());
    (*job)->AppendInput({AsBytes(input)}, nullptr);
    absl::Status result = RunAndWait(**job);
    ASSERT_TRUE(result.ok()) << result;
    const auto* output =
        reinterpret_cast<const int32_t*>((*job)->output().data());
    for (uint64_t b = 0; b < shape.batch; ++b) {
      for (uint64_t r = 0; r < shape.rows; ++r) {
        for (uint64_t c = 0; c < shape.cols; ++c) {
          ASSERT_EQ(output[(b * shape.cols + c) * shape.rows + r],
                    input[(b * shape.rows + r) * shape.cols + c]);
        }
      }
    }
    const TransposeStats& stats = (*job)->stats();
    EXPECT_EQ(stats.backend, "cpu");
    EXPECT_EQ(stats.algorithm, "cpu_blocked");
    EXPECT_GT(stats.kernel_seconds, 0);
    EXPECT_GT(stats.bandwidth_bytes_per_second, 0);
    EXPECT_GT(stats.peak_fraction, 0);
    EXPECT_GE(stats.total_seconds, stats.kernel_seconds);
  }

  const std::string text =
      prometheus::TextSerializer().Serialize(registry.Collect());
  const double bytes = 2.0 * 4 * (2 * 3 * 5 + 1000 * 700);
  EXPECT_THAT(text, HasSubstr(absl::StrCat(
                        "transpose_kernel_bytes_total{backend=\"cpu\"} ",
                        static_cast<int64_t>(bytes))));
  EXPECT_THAT(
      text,
      HasSubstr(
          "transpose_kernel_duration_seconds_count{algorithm=\"cpu_blocked\","
          "backend=\"cpu\"} 2"));
}

// A job counts in its backend's load from its creation, not only while it
// runs: headers that arrive while a large upload is still coming go to the
// other backend, rather than to whichever the rotation names.
TEST(EngineTest, AJobStillUploadingCountsInItsBackendsLoad) {
  prometheus::Registry registry_a, registry_b;
  Metrics metrics_a(registry_a, "test"), metrics_b(registry_b, "test");
  CpuBackendOptions cpu_options;
  cpu_options.calibration_bytes = 1 << 20;
  std::vector<std::unique_ptr<Backend>> backends;
  backends.push_back(std::make_unique<CpuBackend>(cpu_options, metrics_a));
  backends.push_back(std::make_unique<CpuBackend>(cpu_options, metrics_b));
  Engine engine(std::move(backends), EngineOptions{});
  const auto loads = [&engine] {
    return std::vector<int>{engine.backends()[0]->load(),
                            engine.backends()[1]->load()};
  };
  const TransposeSpec spec{
      DataType::kInt32, {1, 64, 64}, kernels::Algorithm::kAuto};

  absl::StatusOr<std::unique_ptr<TransposeJob>> uploading =
      engine.CreateJob(spec);
  ASSERT_TRUE(uploading.ok()) << uploading.status();
  const std::vector<int> one = loads();
  ASSERT_EQ(one[0] + one[1], 1);
  const int other = one[0] == 1 ? 1 : 0;
  // Every job created meanwhile goes to the other backend.
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<std::unique_ptr<TransposeJob>> next = engine.CreateJob(spec);
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_EQ(engine.backends()[other]->load(), 1) << i;
    EXPECT_EQ(engine.backends()[1 - other]->load(), 1) << i;
  }
  // A job destroyed without running no longer counts; nor does one that is
  // done, while its result is still being sent.
  EXPECT_EQ(loads(), one);
  const std::vector<int32_t> input(64 * 64, 7);
  (*uploading)->AppendInput({AsBytes(input)}, nullptr);
  ASSERT_TRUE(RunAndWait(**uploading).ok());
  EXPECT_EQ(loads(), std::vector<int>({0, 0}));
}

class CpuBackendTest : public ::testing::Test {
 protected:
  CpuBackendTest()
      : metrics_(registry_, "test"), backend_(Options(), metrics_) {}
  static CpuBackendOptions Options() {
    CpuBackendOptions options;
    options.calibration_bytes = 1 << 20;
    options.incremental_min_bytes = 1 << 20;
    options.incremental_band_bytes = 64 << 10;
    return options;
  }

  prometheus::Registry registry_;
  Metrics metrics_;
  CpuBackend backend_;
};

std::vector<uint16_t> Expected(const std::vector<uint16_t>& in,
                               const MatrixShape& s) {
  std::vector<uint16_t> out(in.size());
  for (uint64_t b = 0; b < s.batch; ++b)
    for (uint64_t r = 0; r < s.rows; ++r)
      for (uint64_t c = 0; c < s.cols; ++c)
        out[(b * s.cols + c) * s.rows + r] = in[(b * s.rows + r) * s.cols + c];
  return out;
}

std::vector<uint16_t> RandomInput(const MatrixShape& shape, uint32_t seed) {
  std::vector<uint16_t> input(shape.elements());
  std::mt19937 rng(seed);
  for (uint16_t& v : input) v = static_cast<uint16_t>(rng());
  return input;
}

// The input in pieces of `piece_bytes` (the last shorter), as a stream's
// messages bring it.
void AppendInPieces(TransposeJob& job, absl::string_view bytes,
                    size_t piece_bytes) {
  for (size_t offset = 0; offset < bytes.size(); offset += piece_bytes) {
    job.AppendInput({bytes.substr(offset, piece_bytes)}, nullptr);
  }
}

std::vector<uint16_t> OutputOf(const TransposeJob& job) {
  std::vector<uint16_t> output(job.output().size() / 2);
  std::memcpy(output.data(), job.output().data(), job.output().size());
  return output;
}

// Bands transposed while the input trickles in, in uneven pieces, add up to the
// transpose.
TEST_F(CpuBackendTest, TransposesBandsAsTheInputArrives) {
  const MatrixShape shape{2, 1000, 700};  // 2.8 MB of uint16.
  const TransposeSpec spec{DataType::kUInt16, shape, kernels::Algorithm::kAuto};
  const std::vector<uint16_t> input = RandomInput(shape, 9);
  absl::StatusOr<std::unique_ptr<TransposeJob>> job =
      backend_.CreateJob(spec, input.size() * 2);
  ASSERT_TRUE(job.ok());
  AppendInPieces(**job, AsBytes(input), 100003);
  absl::Status result = RunAndWait(**job);
  ASSERT_TRUE(result.ok()) << result;
  EXPECT_EQ(OutputOf(**job), Expected(input, shape));
  EXPECT_GT((*job)->stats().kernel_seconds, 0);
  // The last band may start before Run: its wait is then 0, not a time
  // measured from an unset clock.
  EXPECT_GE((*job)->stats().queue_seconds, 0);
  EXPECT_LT((*job)->stats().queue_seconds, 60);
}

// A short, wide matrix: each band's 64 rows hold 16 bands' bytes, and the last
// band goes to the job's threads (several where the host has them); the
// result is the same.
TEST_F(CpuBackendTest, TransposesBandsOfLongRows) {
  const MatrixShape shape{1, 200, 8192};  // 16 KiB rows, 3.2 MB of uint16.
  const TransposeSpec spec{DataType::kUInt16, shape, kernels::Algorithm::kAuto};
  const std::vector<uint16_t> input = RandomInput(shape, 11);
  absl::StatusOr<std::unique_ptr<TransposeJob>> job =
      backend_.CreateJob(spec, input.size() * 2);
  ASSERT_TRUE(job.ok());
  AppendInPieces(**job, AsBytes(input), 300007);
  absl::Status result = RunAndWait(**job);
  ASSERT_TRUE(result.ok()) << result;
  EXPECT_EQ(OutputOf(**job), Expected(input, shape));
}

// Bands running at once on several workers count once in the kernel time,
// which therefore stays within the job's own time (summed, it was several
// times longer).
TEST(CpuBackendKernelTimeTest, OverlappingBandsCountOnce) {
  CpuBackendOptions options;
  options.workers = 4;
  options.calibration_bytes = 1 << 20;
  options.incremental_min_bytes = 1 << 20;
  options.incremental_band_bytes = 64 << 10;
  prometheus::Registry registry;
  Metrics metrics(registry, "test");
  CpuBackend backend(options, metrics);
  const MatrixShape shape{1, 2048, 4096};  // 16 MiB of uint16: 256 bands.
  const TransposeSpec spec{DataType::kUInt16, shape, kernels::Algorithm::kAuto};
  const std::vector<uint16_t> input = RandomInput(shape, 12);
  absl::StatusOr<std::unique_ptr<TransposeJob>> job =
      backend.CreateJob(spec, input.size() * 2);
  ASSERT_TRUE(job.ok());
  // All at once: every band is ready, and the workers take them together.
  (*job)->AppendInput({AsBytes(input)}, nullptr);
  ASSERT_TRUE(RunAndWait(**job).ok());
  EXPECT_EQ(OutputOf(**job), Expected(input, shape));
  const TransposeStats& stats = (*job)->stats();
  EXPECT_GT(stats.kernel_seconds, 0);
  EXPECT_LE(stats.kernel_seconds, stats.total_seconds);
}

// The memory gauges follow the pool down as well as up: with no idle buffers
// kept, a finished job's buffers leave it.
TEST(CpuBackendMemoryTest, TheGaugeFallsWhenAJobsBuffersAreFreed) {
  CpuBackendOptions options;
  options.calibration_bytes = 1 << 20;
  options.max_idle_buffer_bytes = 0;
  prometheus::Registry registry;
  Metrics metrics(registry, "test");
  CpuBackend backend(options, metrics);
  // On the CPU the host and "device" memory are the same buffers.
  auto gauge = [&registry] {
    double device = -1.0, host = -2.0;
    for (const prometheus::MetricFamily& family : registry.Collect()) {
      if (family.name == "transpose_device_memory_used_bytes")
        device = family.metric.at(0).gauge.value;
      if (family.name == "transpose_host_memory_used_bytes")
        host = family.metric.at(0).gauge.value;
    }
    return device == host ? device : -1.0;
  };
  const TransposeSpec spec{
      DataType::kUInt16, {1, 1024, 1024}, kernels::Algorithm::kAuto};
  const std::vector<uint16_t> input = RandomInput(spec.shape, 13);
  absl::StatusOr<std::unique_ptr<TransposeJob>> job =
      backend.CreateJob(spec, input.size() * 2);
  ASSERT_TRUE(job.ok());
  EXPECT_GE(gauge(), 2 << 20);
  (*job)->AppendInput({AsBytes(input)}, nullptr);
  ASSERT_TRUE(RunAndWait(**job).ok());
  job->reset();
  EXPECT_EQ(gauge(), 0);
}

// An upload cut off halfway leaves bands running; destroying the job waits for
// them: once it is gone, no band holds the transport's piece (whose owner
// stands for the transport's buffer) any more.
TEST_F(CpuBackendTest, AJobDroppedMidUploadWaitsForItsBands) {
  const TransposeSpec spec{
      DataType::kFloat32, {1, 2048, 1024}, kernels::Algorithm::kAuto};
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<std::unique_ptr<TransposeJob>> job =
        backend_.CreateJob(spec, 2048 * 1024 * 4);
    ASSERT_TRUE(job.ok());
    auto half = std::make_shared<std::string>(1024 * 1024 * 4, '\1');
    const std::weak_ptr<std::string> held = half;
    (*job)->AppendInput({*half}, half);
    half.reset();
    job->reset();  // With its bands possibly still running.
    EXPECT_TRUE(held.expired()) << i;
  }
}

// One worker, and uploads in 64 KiB bands from 1 MiB: most of a large
// upload's bands wait in the worker's queue.
class CpuBackendAbandonTest : public testing::Test {
 protected:
  static CpuBackendOptions OneWorker() {
    CpuBackendOptions options;
    options.calibration_bytes = 1 << 20;
    options.workers = 1;
    options.threads_per_job = 1;
    options.incremental_min_bytes = 1 << 20;
    options.incremental_band_bytes = 64 << 10;
    return options;
  }

  prometheus::Registry registry_;
  Metrics metrics_{registry_, "test"};
  CpuBackend backend_{OneWorker(), metrics_};
};

// Destroying a job whose upload was cut off waits only for its bands already
// running: those still queued are dropped, not transposed for nobody. With one
// worker and a 128 MiB upload in 64 KiB bands nearly all are queued, and before
// the job's destruction waited for every one (it runs on a transport thread).
TEST_F(CpuBackendAbandonTest, AJobDroppedMidUploadDropsItsQueuedBands) {
  const TransposeSpec spec{
      DataType::kFloat32, {1, 8192, 4096}, kernels::Algorithm::kAuto};
  const uint64_t bytes = 8192 * 4096 * 4;
  const std::vector<char> input(bytes, 1);
  const absl::string_view all_but_a_row(input.data(), bytes - 4096 * 4);
  // The same upload run to the end: the time its bands take.
  absl::Duration whole = absl::InfiniteDuration();
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::unique_ptr<TransposeJob>> job =
        backend_.CreateJob(spec, bytes);
    ASSERT_TRUE(job.ok()) << job.status();
    const absl::Time start = absl::Now();
    (*job)->AppendInput({absl::string_view(input.data(), bytes)}, nullptr);
    ASSERT_TRUE(RunAndWait(**job).ok());
    whole = std::min(whole, absl::Now() - start);
  }
  // The quickest of three drops: one delayed by the machine's other work
  // does not decide it. Waiting for every band would take about `whole` each
  // time; dropping them, one band's time.
  absl::Duration dropped = absl::InfiniteDuration();
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::unique_ptr<TransposeJob>> job =
        backend_.CreateJob(spec, bytes);
    ASSERT_TRUE(job.ok()) << job.status();
    (*job)->AppendInput({all_but_a_row}, nullptr);
    const absl::Time start = absl::Now();
    job->reset();
    dropped = std::min(dropped, absl::Now() - start);
  }
  EXPECT_LT(dropped, whole / 4) << "the whole transpose took " << whole;
}

// Nor does it wait for another job's bands queued ahead of its own: with one
// worker, a 128 MiB upload in 64 KiB bands queued first and a second job's
// bands behind them, dropping the second job took as long as the first job's
// bands before (its destruction waited for its queued bands to come up and
// return).
TEST_F(CpuBackendAbandonTest,
       AJobDroppedBehindAnotherJobsBandsDoesNotWaitForThem) {
  const TransposeSpec big{
      DataType::kFloat32, {1, 8192, 4096}, kernels::Algorithm::kAuto};
  const TransposeSpec small{
      DataType::kFloat32, {1, 1024, 1024}, kernels::Algorithm::kAuto};
  const uint64_t big_bytes = 8192 * 4096 * 4, small_bytes = 1024 * 1024 * 4;
  const std::vector<char> input(big_bytes, 1);
  absl::Duration ahead = absl::InfiniteDuration();
  absl::Duration dropped = absl::InfiniteDuration();
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::unique_ptr<TransposeJob>> first =
        backend_.CreateJob(big, big_bytes);
    ASSERT_TRUE(first.ok()) << first.status();
    const absl::Time start = absl::Now();
    (*first)->AppendInput({absl::string_view(input.data(), big_bytes)},
                          nullptr);
    absl::StatusOr<std::unique_ptr<TransposeJob>> second =
        backend_.CreateJob(small, small_bytes);
    ASSERT_TRUE(second.ok()) << second.status();
    (*second)->AppendInput({absl::string_view(input.data(), small_bytes / 2)},
                           nullptr);
    const absl::Time drop = absl::Now();
    second->reset();
    dropped = std::min(dropped, absl::Now() - drop);
    ASSERT_TRUE(RunAndWait(**first).ok());
    ahead = std::min(ahead, absl::Now() - start);
  }
  EXPECT_LT(dropped, ahead / 4) << "the first job's bands took " << ahead;
}

// A shape whose rows and columns are whole cache lines: the job transposes the
// transport's pieces where they lie, holding each (through its owner) until
// the band that needs it is done, instead of copying it.
TEST_F(CpuBackendTest, TransposesThePiecesInPlaceAndLetsThemGo) {
  const MatrixShape shape{2, 512, 640};  // 1.3 MB of uint16.
  const TransposeSpec spec{DataType::kUInt16, shape, kernels::Algorithm::kAuto};
  const std::vector<uint16_t> input = RandomInput(shape, 10);
  std::mt19937 rng(11);
  absl::StatusOr<std::unique_ptr<TransposeJob>> job =
      backend_.CreateJob(spec, input.size() * 2);
  ASSERT_TRUE(job.ok());
  const absl::string_view bytes = AsBytes(input);
  std::vector<std::weak_ptr<std::string>> pieces;
  for (size_t offset = 0; offset < bytes.size();) {
    const size_t n = std::min<size_t>(1 + rng() % 30000, bytes.size() - offset);
    // Each piece in its own allocation, as the transport's slices are.
    auto piece = std::make_shared<std::string>(bytes.substr(offset, n));
    (*job)->AppendInput({*piece}, piece);
    if (offset == 0) {
      // Less than a band: the job holds on to it.
      EXPECT_GT(piece.use_count(), 1) << "the job copied the piece";
    }
    pieces.push_back(piece);
    offset += n;
  }
  absl::Status result = RunAndWait(**job);
  ASSERT_TRUE(result.ok()) << result;
  EXPECT_EQ(OutputOf(**job), Expected(input, shape));
  job->reset();
  for (const auto& piece : pieces) EXPECT_TRUE(piece.expired());
}

// The caller's callback may drop the last reference to the job, on either path.
TEST_F(CpuBackendTest, DoneMayDestroyTheJob) {
  for (const MatrixShape& shape :
       {MatrixShape{1, 8, 8}, MatrixShape{1, 1024, 1024}}) {
    const TransposeSpec spec{DataType::kFloat32, shape,
                             kernels::Algorithm::kAuto};
    absl::StatusOr<std::unique_ptr<TransposeJob>> created =
        backend_.CreateJob(spec, shape.elements() * 4);
    ASSERT_TRUE(created.ok());
    std::shared_ptr<TransposeJob> job = *std::move(created);
    const std::vector<float> input(shape.elements(), 1.0f);
    job->AppendInput({AsBytes(input)}, nullptr);
    TransposeJob& ref = *job;
    Notification done;
    ref.Run([job = std::move(job), &done](absl::Status status) mutable {
      EXPECT_TRUE(status.ok());
      job.reset();
      done.Notify();
    });
    done.WaitForNotification();
  }
}

TEST(EngineTest, CpuBackendHasOnlyAuto) {
  prometheus::Registry registry;
  Metrics metrics(registry, "test");
  CpuBackendOptions cpu_options;
  cpu_options.calibration_bytes = 1 << 20;
  CpuBackend backend(cpu_options, metrics);
  TransposeSpec naive = kSpec;
  naive.algorithm = kernels::Algorithm::kNaive;
  absl::Status status = backend.CanRun(naive);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(status.message(), HasSubstr("naive"));
  EXPECT_TRUE(backend.CanRun(kSpec).ok());
}

}  // namespace
}  // namespace transpose
