// The host backend: the blocked, multithreaded CPU transpose from kernels/,
// used when no GPU is present or when asked for (--backend=cpu).
#ifndef TRANSPOSE_SERVER_CPU_BACKEND_H_
#define TRANSPOSE_SERVER_CPU_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "server/backend.h"
#include "server/buffer_pool.h"
#include "server/metrics.h"
#include "server/worker_pool.h"

namespace transpose {

struct CpuBackendOptions {
  // Requests transposed at once (0: one per core).
  int workers = 0;
  // Threads one transpose uses (0: one per core).
  int threads_per_job = 0;
  // Jobs up to this size run on the caller's thread: a thread hand-off would
  // cost more.
  uint64_t inline_max_bytes = 256 << 10;
  // Matrices from this size on are transposed band by band while they arrive...
  uint64_t incremental_min_bytes = uint64_t{4} << 20;
  // ...in bands of at least this many bytes.
  uint64_t incremental_band_bytes = uint64_t{2} << 20;
  // Bytes copied to measure the host's memcpy bandwidth at start-up.
  uint64_t calibration_bytes = 32 << 20;
  // Released buffers kept for reuse.
  size_t max_idle_buffer_bytes = size_t{1} << 30;
};

class CpuBackend final : public Backend {
 public:
  // Calibrates the host copy bandwidth and registers the "cpu" series in
  // `metrics`, which must outlive the backend.
  CpuBackend(const CpuBackendOptions& options, Metrics& metrics);

  const BackendInfo& info() const override { return info_; }
  bool healthy() const override { return true; }
  int load() const override { return load_.load(std::memory_order_relaxed); }
  absl::Status CanRun(const TransposeSpec& spec) const override;
  absl::StatusOr<std::unique_ptr<TransposeJob>> CreateJob(
      const TransposeSpec& spec, uint64_t bytes) override;

 private:
  class Job;

  const CpuBackendOptions options_;
  BackendInfo info_;
  Metrics& metrics_;
  Metrics::BackendSeries* series_;
  // Its allocated bytes (in use and idle) are the memory gauges' figure.
  BufferPool buffers_;
  std::atomic<int> load_{0};
  // Last member: its destructor runs the queued jobs while the rest still
  // exists.
  WorkerPool workers_;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CPU_BACKEND_H_
