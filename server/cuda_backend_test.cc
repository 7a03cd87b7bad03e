// The CUDA backend in process, on the GPU machine: concurrent jobs over its
// streams, out of device memory, and a sticky fault. Skips (and says so) where
// no GPU is visible.
#include "server/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "server/core/notification.h"
#include "server/core/retry.h"

namespace transpose {
namespace {

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0)
      GTEST_SKIP() << "no CUDA device visible: GPU test skipped";
  }

  std::unique_ptr<Backend> MakeBackend(CudaBackendOptions options = {}) {
    options.calibration_bytes = 64 << 20;
    absl::StatusOr<CudaBackends> backends =
        CreateCudaBackends(options, metrics_);
    EXPECT_TRUE(backends.ok()) << backends.status();
    if (!backends.ok()) return nullptr;
    EXPECT_TRUE(backends->failed.empty()) << backends->failed.front();
    return backends->usable.empty() ? nullptr
                                    : std::move(backends->usable.front());
  }

  // Runs a uint32 job of `shape` with random data; "" when its result is right,
  // else why not.
  static std::string RunJob(Backend& backend, const MatrixShape& shape,
                            absl::Status* status_out) {
    const TransposeSpec spec{DataType::kUInt32, shape,
                             kernels::Algorithm::kAuto};
    absl::StatusOr<std::unique_ptr<TransposeJob>> job =
        backend.CreateJob(spec, shape.elements() * 4);
    if (!job.ok()) {
      *status_out = job.status();
      return job.status().ToString();
    }
    std::vector<uint32_t> input(shape.elements());
    std::mt19937 rng(static_cast<uint32_t>(shape.elements()));
    for (uint32_t& v : input) v = rng();
    (*job)->AppendInput(
        {absl::string_view(reinterpret_cast<const char*>(input.data()),
                           input.size() * 4)},
        nullptr);
    Notification done;
    (*job)->Run([&](absl::Status status) {
      *status_out = status;
      done.Notify();
    });
    done.WaitForNotification();
    if (!status_out->ok()) return status_out->ToString();
    const auto* out =
        reinterpret_cast<const uint32_t*>((*job)->output().data());
    for (uint64_t b = 0; b < shape.batch; ++b)
      for (uint64_t r = 0; r < shape.rows; ++r)
        for (uint64_t c = 0; c < shape.cols; ++c)
          if (out[(b * shape.cols + c) * shape.rows + r] !=
              input[(b * shape.rows + r) * shape.cols + c]) {
            return "wrong result";
          }
    return "";
  }

  // transpose_device_memory_used_bytes of cuda:0, or -1 without it.
  double DeviceMemoryUsedBytes() {
    return GaugeOfCuda0("transpose_device_memory_used_bytes");
  }

  // The gauge `name` of cuda:0, or -1 without it.
  double GaugeOfCuda0(absl::string_view name) {
    for (const prometheus::MetricFamily& family : registry_.Collect()) {
      if (family.name != name) continue;
      for (const prometheus::ClientMetric& metric : family.metric) {
        for (const prometheus::ClientMetric::Label& label : metric.label) {
          if (label.name == "backend" && label.value == "cuda:0")
            return metric.gauge.value;
        }
      }
    }
    return -1;
  }

  prometheus::Registry registry_;
  Metrics metrics_{registry_, "test"};
};

TEST_F(CudaBackendTest, ConcurrentJobsOnEveryStreamAreRight) {
  std::unique_ptr<Backend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(16);
  for (int t = 0; t < 16; ++t) {
    threads.emplace_back([&, t] {
      absl::Status status;
      errors[t] =
          RunJob(*backend, {1 + t % 3u, 500 + 37u * t, 700 + 13u * t}, &status);
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (const std::string& error : errors) EXPECT_EQ(error, "");
}

// Jobs up to mapped_max_bytes run their kernel on the pinned host buffers;
// larger ones, or all with the option at 0, copy through device memory. Both
// are right, either side of the threshold.
TEST_F(CudaBackendTest, SmallJobsOnHostMemoryAndCopiedJobsAreRight) {
  for (uint64_t mapped_max_bytes : {uint64_t{64} << 10, uint64_t{0}}) {
    CudaBackendOptions options;
    options.mapped_max_bytes = mapped_max_bytes;
    std::unique_ptr<Backend> backend = MakeBackend(options);
    ASSERT_NE(backend, nullptr);
    for (const MatrixShape& shape :
         {MatrixShape{1, 1, 1}, MatrixShape{1, 64, 64}, MatrixShape{3, 31, 33},
          MatrixShape{1, 128, 128}, MatrixShape{1, 129, 128}}) {
      absl::Status status;
      EXPECT_EQ(RunJob(*backend, shape, &status), "")
          << mapped_max_bytes << " " << ShapeToString(shape);
    }
  }
}

// A job's device buffers go back to the pool; what the pool keeps past
// max_idle_device_bytes goes back to the device, so one large job does not
// hold its memory afterwards, while jobs within the limit reuse it.
TEST_F(CudaBackendTest, DeviceMemoryPastThePoolLimitIsReturned) {
  constexpr double kMiB = 1 << 20;
  const MatrixShape shape{1, 4096, 8192};  // 128 MiB: 256 MiB on the device.
  {
    CudaBackendOptions options;
    options.max_idle_device_bytes = uint64_t{64} << 20;
    std::unique_ptr<Backend> backend = MakeBackend(options);
    ASSERT_NE(backend, nullptr);
    absl::Status status;
    ASSERT_EQ(RunJob(*backend, shape, &status), "");
    EXPECT_GE(DeviceMemoryUsedBytes(), 0);
    EXPECT_LE(DeviceMemoryUsedBytes(), 64 * kMiB);
  }
  CudaBackendOptions options;
  options.max_idle_device_bytes = uint64_t{1} << 30;
  std::unique_ptr<Backend> backend = MakeBackend(options);
  ASSERT_NE(backend, nullptr);
  for (int i = 0; i < 3; ++i) {
    absl::Status status;
    ASSERT_EQ(RunJob(*backend, shape, &status), "");
    EXPECT_GE(DeviceMemoryUsedBytes(), 256 * kMiB) << i;
    EXPECT_LT(DeviceMemoryUsedBytes(), 512 * kMiB) << i;
  }
}

// A job's pinned host buffers show in transpose_host_memory_used_bytes from its
// creation; with no idle pinned memory kept they leave it with the job, and a
// pool that keeps them still shows them.
TEST_F(CudaBackendTest, PinnedHostMemoryIsPublished) {
  constexpr double kMiB = 1 << 20;
  const MatrixShape shape{1, 1024, 2048};  // 8 MiB, past mapped_max_bytes.
  const TransposeSpec spec{DataType::kUInt32, shape, kernels::Algorithm::kAuto};
  const auto pinned = [this] {
    return GaugeOfCuda0("transpose_host_memory_used_bytes");
  };
  for (uint64_t max_idle_pinned_bytes : {uint64_t{0}, uint64_t{1} << 30}) {
    CudaBackendOptions options;
    options.max_idle_pinned_bytes = max_idle_pinned_bytes;
    std::unique_ptr<Backend> backend = MakeBackend(options);
    ASSERT_NE(backend, nullptr);
    EXPECT_EQ(pinned(), 0) << max_idle_pinned_bytes;
    absl::StatusOr<std::unique_ptr<TransposeJob>> job =
        backend->CreateJob(spec, shape.elements() * 4);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_GE(pinned(), 8 * kMiB) << max_idle_pinned_bytes;
    job->reset();
    if (max_idle_pinned_bytes == 0) {
      EXPECT_EQ(pinned(), 0);
    } else {
      EXPECT_GE(pinned(), 8 * kMiB);
    }
    absl::Status status;
    EXPECT_EQ(RunJob(*backend, shape, &status), "") << max_idle_pinned_bytes;
  }
}

// A kernel whose shared memory the GPU lacks is refused from the header,
// before any upload: on a GPU with 64 KiB per block (a T4's), padded_64's
// 64x65 tile of 16-byte elements (66560 bytes). AUTO's picks fit it.
TEST_F(CudaBackendTest, AKernelTooLargeForTheDeviceIsRefusedBeforeTheUpload) {
  const MatrixShape shape = MatrixShape::Matrix(4096, 4096);
  const auto spec = [&](DataType dtype, kernels::Algorithm algorithm) {
    return TransposeSpec{dtype, shape, algorithm};
  };
  std::unique_ptr<Backend> own = MakeBackend();
  ASSERT_NE(own, nullptr);
  EXPECT_TRUE(
      own->CanRun(spec(DataType::kComplex128, kernels::Algorithm::kPadded64))
          .ok());

  CudaBackendOptions options;
  options.testing_max_shared_bytes_per_block = 64 << 10;
  std::unique_ptr<Backend> small = MakeBackend(options);
  ASSERT_NE(small, nullptr);
  const absl::Status refused =
      small->CanRun(spec(DataType::kComplex128, kernels::Algorithm::kPadded64));
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented) << refused;
  EXPECT_THAT(std::string(refused.message()),
              ::testing::HasSubstr("cuda:0: kernel padded_64 needs 66560 "
                                   "bytes of shared memory per block"));
  for (const DataType dtype : {DataType::kUInt8, DataType::kFloat32,
                               DataType::kFloat64, DataType::kComplex128}) {
    EXPECT_TRUE(small->CanRun(spec(dtype, kernels::Algorithm::kAuto)).ok())
        << DataTypeName(dtype);
    EXPECT_TRUE(small->CanRun(spec(dtype, kernels::Algorithm::kPadded32)).ok())
        << DataTypeName(dtype);
  }
  EXPECT_TRUE(
      small->CanRun(spec(DataType::kFloat64, kernels::Algorithm::kPadded64))
          .ok());
}

// With several GPUs, making the backends (one per GPU, each set up on its own
// device) leaves the caller on the device it was on.
TEST_F(CudaBackendTest, MakingBackendsLeavesTheCallersDeviceAsItWas) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  for (int device = 0; device < count; ++device) {
    ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
    {
      std::unique_ptr<Backend> backend = MakeBackend();
      ASSERT_NE(backend, nullptr);
      int current = -1;
      ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
      EXPECT_EQ(current, device) << "after making the backends";
    }
    int current = -1;
    ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
    EXPECT_EQ(current, device) << "after destroying them";
  }
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
}

// The backend is cuda:0, on the device this thread is on.
TEST_F(CudaBackendTest, OutOfDeviceMemoryIsResourceExhaustedAndPasses) {
  std::unique_ptr<Backend> backend = MakeBackend();
  ASSERT_NE(backend, nullptr);
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  // Leave 1 GiB free, then ask for a job that needs 2 x 768 MiB on the device.
  void* hog = nullptr;
  ASSERT_EQ(cudaMalloc(&hog, free - (size_t{1} << 30)), cudaSuccess);
  absl::Status status;
  RunJob(*backend, {1, 8192, 24576}, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  // Worth a retry: memory other jobs hold comes back.
  EXPECT_TRUE(IsRetryLater(status)) << status;
  EXPECT_TRUE(backend->healthy());
  cudaFree(hog);
  EXPECT_EQ(RunJob(*backend, {1, 8192, 24576}, &status), "");
}

// Last in this file: a sticky fault leaves the process's CUDA context unusable.
TEST_F(CudaBackendTest, ZZAStickyFaultMarksTheDeviceUnhealthy) {
  CudaBackendOptions options;
  options.testing_fault_after_jobs = 1;
  std::unique_ptr<Backend> backend = MakeBackend(options);
  ASSERT_NE(backend, nullptr);
  absl::Status status;
  EXPECT_EQ(RunJob(*backend, {1, 64, 64}, &status), "");
  RunJob(*backend, {1, 64, 64}, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_FALSE(backend->healthy());
  RunJob(*backend, {1, 64, 64}, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
}

}  // namespace
}  // namespace transpose
