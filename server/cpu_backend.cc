#include "server/cpu_backend.h"

#include <algorithm>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/cpu_transpose.h"
#include "server/core/status_macros.h"

namespace transpose {
namespace {

constexpr char kKernelName[] = "cpu_blocked";

std::string CpuModelName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "model name")) {
      const size_t colon = rest.find(':');
      if (colon != absl::string_view::npos) {
        return std::string(absl::StripAsciiWhitespace(rest.substr(colon + 1)));
      }
    }
  }
  return "host CPU";
}

// Median over a few runs of a parallel memcpy: the host's copy ceiling, in
// (read + written)/s.
double CalibrateCopyBandwidth(uint64_t bytes, int threads) {
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 0);
  kernels::ParallelMemcpy(dst.data(), src.data(), bytes, threads);  // Warm-up.
  std::vector<double> seconds;
  for (int i = 0; i < 5; ++i) {
    const absl::Time start = absl::Now();
    kernels::ParallelMemcpy(dst.data(), src.data(), bytes, threads);
    seconds.push_back(absl::ToDoubleSeconds(absl::Now() - start));
  }
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * static_cast<double>(bytes) / seconds[seconds.size() / 2];
}

}  // namespace

class CpuBackend::Job final : public TransposeJob {
 public:
  Job(CpuBackend& backend, const TransposeSpec& spec, uint64_t bytes,
      BufferPool::Buffer input, BufferPool::Buffer output)
      : backend_(backend),
        spec_(spec),
        bytes_(bytes),
        input_(std::move(input)),
        output_(std::move(output)),
        created_(absl::Now()) {}

  absl::Span<uint8_t> input() override { return input_.span(); }
  absl::Span<const uint8_t> output() const override { return output_.span(); }
  const TransposeStats& stats() const override { return stats_; }

  void Run(JobDoneCallback done) override {
    backend_.load_.fetch_add(1, std::memory_order_relaxed);
    if (bytes_ <= backend_.options_.inline_max_bytes) {
      Transpose(absl::Now(), std::move(done));
      return;
    }
    backend_.workers_.Schedule(
        [this, queued = absl::Now(), done = std::move(done)]() mutable {
          Transpose(queued, std::move(done));
        });
  }

 private:
  void Transpose(absl::Time queued, JobDoneCallback done) {
    Metrics::BackendSeries& series = *backend_.series_;
    series.busy_streams->Increment();
    const absl::Time start = absl::Now();
    kernels::TransposeArgs args;
    args.element_size = ElementSize(spec_.dtype);
    args.batch = spec_.shape.batch;
    args.rows = spec_.shape.rows;
    args.cols = spec_.shape.cols;
    args.input = input_.data();
    args.output = output_.data();
    absl::Status status =
        kernels::TransposeOnCpu(args, backend_.options_.threads_per_job);
    const absl::Time end = absl::Now();
    series.busy_streams->Decrement();

    stats_.backend = backend_.info_.name;
    stats_.algorithm = kKernelName;
    stats_.queue_seconds = absl::ToDoubleSeconds(start - queued);
    stats_.total_seconds = absl::ToDoubleSeconds(end - created_);
    SetKernelTime(absl::ToDoubleSeconds(end - start), bytes_,
                  backend_.info_.copy_bandwidth_bytes_per_second, stats_);
    if (status.ok()) backend_.metrics_.RecordKernel(series, stats_, bytes_);
    backend_.load_.fetch_sub(1, std::memory_order_relaxed);
    std::move(done)(std::move(status));
  }

  CpuBackend& backend_;
  const TransposeSpec spec_;
  const uint64_t bytes_;
  BufferPool::Buffer input_;
  BufferPool::Buffer output_;
  const absl::Time created_;
  TransposeStats stats_;
};

CpuBackend::CpuBackend(const CpuBackendOptions& options, Metrics& metrics)
    : options_(options),
      metrics_(metrics),
      buffers_(NewHostAllocator(), options.max_idle_buffer_bytes),
      workers_(kernels::CpuThreads(options.workers)) {
  info_.name = "cpu";
  info_.device_name = CpuModelName();
  info_.copy_bandwidth_bytes_per_second = CalibrateCopyBandwidth(
      options.calibration_bytes, kernels::CpuThreads(options.threads_per_job));
  info_.streams = workers_.threads();
  info_.algorithms = {kernels::Algorithm::kAuto};
  info_.kernel_names = {kKernelName};
  series_ = metrics_.AddBackend(info_.name, info_.kernel_names);
  series_->peak_bandwidth->Set(info_.copy_bandwidth_bytes_per_second);
}

absl::Status CpuBackend::CanRun(const TransposeSpec& spec) const {
  if (spec.algorithm != kernels::Algorithm::kAuto) {
    return absl::UnimplementedError(absl::StrFormat(
        "algorithm %s runs on the cuda backend only; this server's cpu backend "
        "has auto",
        kernels::AlgorithmName(spec.algorithm)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TransposeJob>> CpuBackend::CreateJob(
    const TransposeSpec& spec, uint64_t bytes) {
  TRANSPOSE_ASSIGN_OR_RETURN(BufferPool::Buffer input, buffers_.Acquire(bytes));
  TRANSPOSE_ASSIGN_OR_RETURN(BufferPool::Buffer output,
                             buffers_.Acquire(bytes));
  series_->device_memory_used_bytes->Set(
      static_cast<double>(buffers_.allocated_bytes()));
  return std::make_unique<Job>(*this, spec, bytes, std::move(input),
                               std::move(output));
}

}  // namespace transpose
