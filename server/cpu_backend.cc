#include "server/cpu_backend.h"

#include <algorithm>
#include <condition_variable>
#include <fstream>
#include <mutex>
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

// A job that may start before its input is complete: as whole bands of rows
// arrive (InputAdvanced), workers transpose them into their output columns, so
// by the time the last byte is in, only the last band is left for Run. Bands
// are disjoint, so they run concurrently.
class CpuBackend::Job final : public TransposeJob {
 public:
  Job(CpuBackend& backend, const TransposeSpec& spec, uint64_t bytes,
      BufferPool::Buffer input, BufferPool::Buffer output)
      : backend_(backend),
        bytes_(bytes),
        input_(std::move(input)),
        output_(std::move(output)),
        created_(absl::Now()),
        bands_(std::make_shared<Bands>()) {
    args_.element_size = ElementSize(spec.dtype);
    args_.batch = spec.shape.batch;
    args_.rows = spec.shape.rows;
    args_.cols = spec.shape.cols;
    args_.input = input_.data();
    args_.output = output_.data();
    stats_.backend = backend_.info_.name;
    stats_.algorithm = kKernelName;
  }

  // Bands in flight use the buffers: wait for them (a cancelled upload can
  // leave some running).
  ~Job() override {
    std::unique_lock<std::mutex> lock(bands_->mutex);
    bands_->idle_changed.wait(lock, [this] { return bands_->idle; });
  }

  absl::Span<uint8_t> input() override { return input_.span(); }
  absl::Span<const uint8_t> output() const override { return output_.span(); }
  const TransposeStats& stats() const override { return stats_; }

  void InputAdvanced(uint64_t bytes_ready) override {
    if (bytes_ < backend_.options_.incremental_min_bytes) return;
    // Whole rows ready, rounded down to the granule within their matrix.
    const uint64_t row_bytes = args_.cols * args_.element_size;
    const uint64_t rows_ready = bytes_ready / row_bytes;
    const uint64_t ready =
        rows_ready - rows_ready % args_.rows % kernels::kCpuRowGranule;
    if ((ready - scheduled_rows_) * row_bytes <
        backend_.options_.incremental_band_bytes)
      return;
    Schedule({scheduled_rows_, ready}, /*last=*/false);
    scheduled_rows_ = ready;
  }

  void Run(JobDoneCallback done) override {
    backend_.load_.fetch_add(1, std::memory_order_relaxed);
    run_at_ = absl::Now();
    done_ = std::move(done);
    const uint64_t total_rows = args_.batch * args_.rows;
    if (scheduled_rows_ == 0 && bytes_ <= backend_.options_.inline_max_bytes) {
      // Small: run here, a hand-off would cost more than the transpose.
      AddBand(/*last=*/true);
      RunBand({0, total_rows});
    } else if (scheduled_rows_ < total_rows) {
      Schedule({scheduled_rows_, total_rows}, /*last=*/true);
    } else {
      // Every band went out before Run; the last one to finish completes the
      // job.
      AddBand(/*last=*/true);
      FinishBand(absl::OkStatus(), 0);
    }
  }

 private:
  // What the bands share, outliving the job while a band still holds it.
  struct Bands {
    // Guards the fields below; idle_changed signals `idle`.
    std::mutex mutex;
    std::condition_variable idle_changed;
    int pending = 0;
    bool last_added = false;
    double kernel_seconds = 0;
    absl::Status status;
    bool idle = true;
  };

  void AddBand(bool last) {
    std::lock_guard<std::mutex> lock(bands_->mutex);
    ++bands_->pending;
    bands_->idle = false;
    bands_->last_added |= last;
  }

  void Schedule(kernels::RowRange range, bool last) {
    AddBand(last);
    backend_.workers_.Schedule([this, range] { RunBand(range); });
  }

  void RunBand(kernels::RowRange range) {
    Metrics::BackendSeries& series = *backend_.series_;
    series.busy_streams->Increment();
    const absl::Time start = absl::Now();
    const uint64_t total_rows = args_.batch * args_.rows;
    if (range.last == total_rows)
      stats_.queue_seconds = absl::ToDoubleSeconds(start - run_at_);
    // The whole matrix at once gets every thread; a band, one worker.
    const absl::Status status =
        range.first == 0 && range.last == total_rows
            ? kernels::TransposeOnCpu(args_, backend_.options_.threads_per_job)
            : kernels::TransposeRowsOnCpu(args_, range);
    const absl::Time end = absl::Now();
    series.busy_streams->Decrement();
    FinishBand(status, absl::ToDoubleSeconds(end - start));
  }

  // The band that ends the last job completes it, after releasing the lock:
  // `done` may destroy the job, and this frame touches nothing of it
  // afterwards.
  void FinishBand(const absl::Status& status, double seconds) {
    std::shared_ptr<Bands> bands = bands_;
    absl::Status result;
    double kernel_seconds;
    bool complete;
    {
      std::lock_guard<std::mutex> lock(bands->mutex);
      bands->kernel_seconds += seconds;
      if (!status.ok()) bands->status = status;
      bands->idle = --bands->pending == 0;
      complete = bands->idle && bands->last_added;
      result = bands->status;
      kernel_seconds = bands->kernel_seconds;
    }
    // `bands` outlives a job destroyed the moment this wakes its destructor.
    bands->idle_changed.notify_all();
    if (!complete) return;
    stats_.total_seconds = absl::ToDoubleSeconds(absl::Now() - created_);
    // With bands spread over the upload, the kernel time is the sum of their
    // times.
    SetKernelTime(kernel_seconds, bytes_,
                  backend_.info_.copy_bandwidth_bytes_per_second, stats_);
    if (result.ok())
      backend_.metrics_.RecordKernel(*backend_.series_, stats_, bytes_);
    backend_.load_.fetch_sub(1, std::memory_order_relaxed);
    // Off the job first: `done` may destroy the job, and with it done_.
    JobDoneCallback done = std::move(done_);
    std::move(done)(std::move(result));
  }

  CpuBackend& backend_;
  const uint64_t bytes_;
  BufferPool::Buffer input_;
  BufferPool::Buffer output_;
  const absl::Time created_;
  kernels::TransposeArgs args_;
  // Written by the caller's thread (InputAdvanced, then Run) before the bands
  // that read them.
  uint64_t scheduled_rows_ = 0;
  absl::Time run_at_;
  JobDoneCallback done_;
  // Written by the last band only.
  TransposeStats stats_;
  const std::shared_ptr<Bands> bands_;
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
