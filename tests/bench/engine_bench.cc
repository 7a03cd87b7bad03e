// engine_bench (GPU): the in-process engine path, host memory -> GPU -> host
// memory with no gRPC, next to pinned cudaMemcpy host-to-device and
// device-to-host of the same bytes in the same run. One 1 GiB float32 matrix at
// a time, then four 256 MiB ones at once (both PCIe directions busy).
//
//   engine_bench [--reps=5]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "prometheus/registry.h"
#include "server/core/notification.h"
#include "server/cuda_backend.h"

namespace transpose {
namespace {

int reps = 5;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median seconds of one pinned copy of `bytes` in `kind` direction.
double CopySeconds(void* pinned, void* device, size_t bytes,
                   cudaMemcpyKind kind) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> seconds;
  for (int i = 0; i < reps + 1; ++i) {
    cudaEventRecord(start);
    if (kind == cudaMemcpyHostToDevice) {
      cudaMemcpyAsync(device, pinned, bytes, kind);
    } else {
      cudaMemcpyAsync(pinned, device, bytes, kind);
    }
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i > 0) seconds.push_back(ms / 1e3);
  }
  return Median(seconds);
}

// Median wall seconds to run `count` jobs of `shape` at once, inputs already in
// the jobs' memory.
double EngineSeconds(Backend& backend, const MatrixShape& shape, int count,
                     TransposeStats* stats) {
  const TransposeSpec spec{DataType::kFloat32, shape,
                           kernels::Algorithm::kAuto};
  const uint64_t bytes = shape.elements() * 4;
  std::vector<std::unique_ptr<TransposeJob>> jobs;
  const std::string input(bytes, 1);
  for (int i = 0; i < count; ++i) {
    jobs.push_back(*backend.CreateJob(spec, bytes));
    jobs.back()->AppendInput({input}, nullptr);
  }
  std::vector<double> seconds;
  for (int r = 0; r < reps + 1; ++r) {
    std::vector<std::unique_ptr<Notification>> done;
    const absl::Time start = absl::Now();
    for (auto& job : jobs) {
      done.push_back(std::make_unique<Notification>());
      Notification* d = done.back().get();
      job->Run([d](absl::Status status) {
        if (!status.ok()) std::abort();
        d->Notify();
      });
    }
    for (auto& d : done) d->WaitForNotification();
    if (r > 0) seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
    // Run is once per job: make fresh ones, their pooled buffers warm.
    for (auto& job : jobs) {
      *stats = job->stats();
      job = *backend.CreateJob(spec, bytes);
    }
  }
  return Median(seconds);
}

int Run() {
  if (CudaDeviceCount() == 0) {
    std::printf("engine_bench: no CUDA device visible\n");
    return 1;
  }
  prometheus::Registry registry;
  Metrics metrics(registry, "bench");
  CudaBackendOptions options;
  options.streams_per_device = 4;
  absl::StatusOr<CudaBackends> backends = CreateCudaBackends(options, metrics);
  if (!backends.ok()) {
    std::printf("engine_bench: %s\n", backends.status().ToString().c_str());
    return 1;
  }
  if (backends->usable.empty()) {  // Then each visible GPU failed.
    std::printf("engine_bench: no GPU came up: %s\n",
                backends->failed.front().ToString().c_str());
    return 1;
  }
  std::unique_ptr<Backend> backend = std::move(backends->usable.front());

  const size_t gib = size_t{1} << 30;
  void* pinned = nullptr;
  void* device = nullptr;
  cudaHostAlloc(&pinned, gib, cudaHostAllocPortable);
  cudaMalloc(&device, gib);
  std::memset(pinned, 3, gib);
  const double h2d = CopySeconds(pinned, device, gib, cudaMemcpyHostToDevice);
  const double d2h = CopySeconds(pinned, device, gib, cudaMemcpyDeviceToHost);
  cudaFree(device);
  cudaFreeHost(pinned);

  TransposeStats stats;
  const double one = EngineSeconds(*backend, {1, 16384, 16384}, 1, &stats);
  TransposeStats four_stats;
  const double four = EngineSeconds(*backend, {1, 8192, 8192}, 4, &four_stats);
  std::printf(
      "engine_bench on %s, median of %d\n\n"
      "| path | GB/s each way | of pinned copy-in + copy-out |\n|---|---|---|\n"
      "| pinned cudaMemcpy, 1 GiB host to device | %.1f | |\n"
      "| pinned cudaMemcpy, 1 GiB device to host | %.1f | |\n"
      "| pinned copy in then copy out, 1 GiB | %.1f | 100%% |\n"
      "| engine, one 1 GiB float32 job (copy in %.1f ms, kernel %.2f ms, copy "
      "out %.1f ms) | "
      "%.1f | %.1f%% |\n"
      "| engine, four 256 MiB jobs at once on 4 streams | %.1f | %.1f%% |\n",
      backend->info().device_name.c_str(), reps, gib / h2d / 1e9,
      gib / d2h / 1e9, gib / (h2d + d2h) / 1e9, stats.copy_in_seconds * 1e3,
      stats.kernel_seconds * 1e3, stats.copy_out_seconds * 1e3, gib / one / 1e9,
      100 * (gib / one) / (gib / (h2d + d2h)), gib / four / 1e9,
      100 * (gib / four) / (gib / (h2d + d2h)));
  return 0;
}

}  // namespace
}  // namespace transpose

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--reps=", 7) == 0)
      transpose::reps = std::atoi(argv[i] + 7);
  }
  return transpose::Run();
}
