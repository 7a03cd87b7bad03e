#include "server/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/cpu_transpose.h"
#include "server/core/process.h"
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
// arrive, workers transpose them into their output columns, so by the time the
// last byte is in, only the last band is left for Run. Bands are disjoint, so
// they run concurrently. Where the shape allows (kernels::
// CanTransposeFromPieces), bands read the input where the transport left it,
// holding its pieces until they are done; otherwise the input is copied into
// one buffer first.
class CpuBackend::Job final : public TransposeJob {
 public:
  // `input` is unused (empty) when the job reads from the pieces.
  Job(CpuBackend& backend, const TransposeSpec& spec, uint64_t bytes,
      bool from_pieces, BufferPool::Buffer input, BufferPool::Buffer output)
      : backend_(backend),
        load_(backend.load_),
        bytes_(bytes),
        from_pieces_(from_pieces),
        input_(std::move(input)),
        output_(std::move(output)),
        created_(absl::Now()),
        bands_(std::make_shared<Bands>()) {
    args_ = ArgsOf(spec);
    args_.input = input_.data();
    args_.output = output_.data();
    stats_.backend = backend_.info_.name;
    stats_.algorithm = kKernelName;
  }

  // Bands running use the buffers: wait for them (a cancelled upload can
  // leave some running). Those still queued, maybe behind other jobs' bands,
  // find the job abandoned when their turn comes and end without touching it:
  // nobody reads their rows, and this runs on a transport thread that must
  // not wait out the queue.
  ~Job() override {
    // The queued bands' pieces go with the job (after the lock): once it is
    // gone, nothing of the transport's is held.
    std::map<uint64_t, std::vector<HeldPiece>> dropped;
    {
      std::unique_lock<std::mutex> lock(bands_->mutex);
      bands_->abandoned = true;
      dropped.swap(bands_->queued_pieces);
      bands_->running_changed.wait(lock,
                                   [this] { return bands_->running == 0; });
    }
    input_.Reset();
    output_.Reset();
  }

  absl::Span<const uint8_t> output() const override { return output_.span(); }
  const TransposeStats& stats() const override { return stats_; }

  void AppendInput(absl::Span<const absl::string_view> pieces,
                   std::shared_ptr<const void> owner) override {
    if (!from_pieces_) {
      received_ = CopyPieces(pieces, input_.span(), received_);
    } else {
      for (absl::string_view piece : pieces) {
        if (piece.empty()) continue;
        pieces_.push_back({{received_, piece.data(), piece.size()}, owner});
        received_ += piece.size();
      }
    }
    ScheduleReadyBands();
  }

  void Run(JobDoneCallback done) override {
    run_at_ = absl::Now();
    done_ = std::move(done);
    const uint64_t total_rows = args_.batch * args_.rows;
    if (scheduled_rows_ == 0 && bytes_ <= backend_.options_.inline_max_bytes) {
      // Small: run here, a hand-off would cost more than the transpose.
      AddBand(/*last=*/true);
      scheduled_rows_ = total_rows;
      StartBand(/*last=*/true);
      RunBand({0, total_rows}, TakePiecesBefore(total_rows));
    } else if (scheduled_rows_ < total_rows) {
      Schedule(total_rows, /*last=*/true);
    } else {
      // Every band went out before Run; the last one to finish completes the
      // job.
      AddBand(/*last=*/true);
      StartBand(/*last=*/false);
      FinishBand(absl::OkStatus());
    }
  }

 private:
  // A received piece and what keeps it alive.
  struct HeldPiece {
    kernels::InputPiece piece;
    std::shared_ptr<const void> owner;
  };

  // What the bands share, outliving the job while a band still holds it.
  struct Bands {
    // Guards the fields below; running_changed signals `running` reaching 0.
    std::mutex mutex;
    std::condition_variable running_changed;
    // Set as the job is destroyed, with no Run to come or after it is done:
    // bands that have not started then never start.
    bool abandoned = false;
    // The pieces each queued band will read, by its first row.
    std::map<uint64_t, std::vector<HeldPiece>> queued_pieces;
    int pending = 0;
    bool last_added = false;
    // When the band with the matrix's last rows started (it may start before
    // Run, when the upload fills it).
    absl::Time last_band_start;
    // Time during which at least one band ran: bands on several workers at
    // once count once.
    double kernel_seconds = 0;
    int running = 0;
    absl::Time running_since;
    absl::Status status;
  };

  // Hands the whole rows received so far to workers, in bands of about
  // incremental_band_bytes, so that two workers can share one upload.
  void ScheduleReadyBands() {
    if (bytes_ < backend_.options_.incremental_min_bytes) return;
    const uint64_t row_bytes = args_.cols * args_.element_size;
    const uint64_t band_bytes = backend_.options_.incremental_band_bytes;
    const uint64_t band_rows = std::max(
        kernels::kCpuRowGranule, (band_bytes + row_bytes - 1) / row_bytes);
    const uint64_t ready = OnGranule(received_ / row_bytes);
    while ((ready - scheduled_rows_) * row_bytes >= band_bytes) {
      const uint64_t end =
          OnGranule(std::min(ready, scheduled_rows_ + band_rows));
      if (end <= scheduled_rows_) break;  // Only with incremental_band_bytes 0.
      Schedule(end, /*last=*/false);
    }
  }

  // The last row boundary at or before `row` that a band may end on.
  uint64_t OnGranule(uint64_t row) const {
    return row - row % args_.rows % kernels::kCpuRowGranule;
  }

  void AddBand(bool last) {
    std::lock_guard<std::mutex> lock(bands_->mutex);
    ++bands_->pending;
    bands_->last_added |= last;
  }

  // The held pieces with bytes before row `end`, for the band that ends there;
  // those wholly before it are no longer needed by later bands.
  std::vector<HeldPiece> TakePiecesBefore(uint64_t end) {
    std::vector<HeldPiece> held;
    const uint64_t end_byte = end * args_.cols * args_.element_size;
    for (const HeldPiece& piece : pieces_) {
      if (piece.piece.offset >= end_byte) break;
      held.push_back(piece);
    }
    while (!pieces_.empty() &&
           pieces_.front().piece.offset + pieces_.front().piece.size <=
               end_byte) {
      pieces_.pop_front();
    }
    return held;
  }

  // Schedules rows [scheduled_rows_, end) on a worker. The task holds the
  // Bands as well as the job, and its pieces are kept there: it reads
  // `abandoned` before it touches the job, which may be gone by then, and the
  // job's destruction lets go of the pieces of bands still queued.
  void Schedule(uint64_t end, bool last) {
    const kernels::RowRange range{scheduled_rows_, end};
    scheduled_rows_ = end;
    AddBand(last);
    const bool last_rows = end == args_.batch * args_.rows;
    std::vector<HeldPiece> held = TakePiecesBefore(end);
    {
      std::lock_guard<std::mutex> lock(bands_->mutex);
      bands_->queued_pieces.emplace(range.first, std::move(held));
    }
    backend_.workers_.Schedule([this, bands = bands_, range, last_rows] {
      std::optional<std::vector<HeldPiece>> pieces =
          StartQueuedBand(*bands, range.first, last_rows);
      if (pieces.has_value()) RunBand(range, *std::move(pieces));
    });
  }

  // Transposes a started band's rows, and finishes it.
  void RunBand(kernels::RowRange range, std::vector<HeldPiece> held) {
    Metrics::BackendSeries& series = *backend_.series_;
    series.busy_streams->Increment();
    const absl::Status status = Transpose(range, std::move(held));
    series.busy_streams->Decrement();
    FinishBand(status);
  }

  // Counts a band as running from now; `last` if it holds the matrix's last
  // rows. Needs bands.mutex.
  static void CountStart(Bands& bands, bool last) {
    const absl::Time start = absl::Now();
    if (bands.running++ == 0) bands.running_since = start;
    if (last) bands.last_band_start = start;
  }

  void StartBand(bool last) {
    std::lock_guard<std::mutex> lock(bands_->mutex);
    CountStart(*bands_, last);
  }

  // Starts the queued band whose rows begin at `first_row`: its pieces, or
  // none if the job is abandoned (the band must then not touch the job).
  static std::optional<std::vector<HeldPiece>> StartQueuedBand(
      Bands& bands, uint64_t first_row, bool last) {
    std::lock_guard<std::mutex> lock(bands.mutex);
    if (bands.abandoned) return std::nullopt;
    auto queued = bands.queued_pieces.find(first_row);
    std::vector<HeldPiece> pieces = std::move(queued->second);
    bands.queued_pieces.erase(queued);
    CountStart(bands, last);
    return pieces;
  }

  // Lets go of the pieces before returning: once the job is done, nothing of
  // the transport's is held.
  absl::Status Transpose(kernels::RowRange range,
                         std::vector<HeldPiece> held) const {
    const bool whole =
        range.first == 0 && range.last == args_.batch * args_.rows;
    const int threads =
        whole ? backend_.options_.threads_per_job : BandThreads(range);
    if (from_pieces_) {
      std::vector<kernels::InputPiece> pieces;
      pieces.reserve(held.size());
      for (const HeldPiece& piece : held) pieces.push_back(piece.piece);
      return kernels::TransposeRowsFromPiecesOnCpu(args_, range, pieces,
                                                   threads);
    }
    if (whole) return kernels::TransposeOnCpu(args_, threads);
    return kernels::TransposeRowsOnCpu(args_, range, threads);
  }

  // The whole matrix at once gets every thread of a job; a band, one worker.
  // The band with the last rows, which runs once the upload has ended, takes
  // one thread per whole incremental_band_bytes it holds, up to the job's:
  // where 64 rows hold many bands' worth, it can be half the matrix (128 rows
  // of 16 MiB: two bands of 1 GiB), and on one thread it outlasted the rest.
  // Bands during the upload keep one thread each, beside the transport's.
  int BandThreads(kernels::RowRange range) const {
    const uint64_t band_bytes = backend_.options_.incremental_band_bytes;
    if (band_bytes == 0 || range.last != args_.batch * args_.rows) return 1;
    const uint64_t bytes =
        (range.last - range.first) * args_.cols * args_.element_size;
    const uint64_t bands = std::max<uint64_t>(1, bytes / band_bytes);
    return static_cast<int>(std::min<uint64_t>(
        bands, kernels::CpuThreads(backend_.options_.threads_per_job)));
  }

  // The band that ends the last job completes it, after releasing the lock:
  // `done` may destroy the job, and this frame touches nothing of it
  // afterwards.
  void FinishBand(const absl::Status& status) {
    std::shared_ptr<Bands> bands = bands_;
    absl::Status result;
    double kernel_seconds;
    absl::Time last_band_start;
    bool complete;
    bool stopped;
    {
      std::lock_guard<std::mutex> lock(bands->mutex);
      if (--bands->running == 0) {
        bands->kernel_seconds +=
            absl::ToDoubleSeconds(absl::Now() - bands->running_since);
      }
      if (!status.ok()) bands->status = status;
      stopped = bands->running == 0;
      complete = --bands->pending == 0 && bands->last_added;
      result = bands->status;
      kernel_seconds = bands->kernel_seconds;
      last_band_start = bands->last_band_start;
    }
    // `bands` outlives a job destroyed the moment this wakes its destructor.
    if (stopped) bands->running_changed.notify_all();
    if (!complete) return;
    // Complete means Run has added its band, so run_at_ is written.
    stats_.queue_seconds =
        std::max(0.0, absl::ToDoubleSeconds(last_band_start - run_at_));
    stats_.total_seconds = absl::ToDoubleSeconds(absl::Now() - created_);
    // With bands spread over the upload, the kernel time is the time any of
    // them ran.
    SetKernelTime(kernel_seconds, bytes_,
                  backend_.info_.copy_bandwidth_bytes_per_second, stats_);
    if (result.ok())
      backend_.metrics_.RecordKernel(*backend_.series_, stats_, bytes_);
    load_.Release();
    // No band reads the input any more: its copy goes back now, not when the
    // job goes (which waits for the reply to be sent).
    input_.Reset();
    // Off the job first: `done` may destroy the job, and with it done_.
    JobDoneCallback done = std::move(done_);
    std::move(done)(std::move(result));
  }

  CpuBackend& backend_;
  JobLoad load_;
  const uint64_t bytes_;
  const bool from_pieces_;
  BufferPool::Buffer input_;
  BufferPool::Buffer output_;
  const absl::Time created_;
  kernels::TransposeArgs args_;
  // Written by the caller's thread (AppendInput, then Run); run_at_ is read
  // only once Run has added its band.
  uint64_t received_ = 0;
  uint64_t scheduled_rows_ = 0;
  // Received pieces not yet handed to a band in full (from_pieces_ only).
  std::deque<HeldPiece> pieces_;
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
  // The host's memory, as a GPU backend reports its device's.
  info_.total_memory_bytes = UsableMemoryBytes();
  info_.copy_bandwidth_bytes_per_second = CalibrateCopyBandwidth(
      options.calibration_bytes, kernels::CpuThreads(options.threads_per_job));
  info_.streams = workers_.threads();
  info_.algorithms = {kernels::Algorithm::kAuto};
  info_.kernel_names = {kKernelName};
  series_ = metrics_.AddBackend(info_.name, info_.kernel_names);
  series_->peak_bandwidth->Set(info_.copy_bandwidth_bytes_per_second);
  // The gauges, not series_: the registry keeps them for the process's life.
  buffers_.ObserveAllocatedBytes(
      [device = series_->device_memory_used_bytes,
       host = series_->host_memory_used_bytes](size_t bytes) {
        device->Set(static_cast<double>(bytes));
        host->Set(static_cast<double>(bytes));
      });
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
  // Large jobs of a shape the transpose can read in pieces need no input
  // buffer: the pieces are held instead, a band's worth at a time.
  const bool from_pieces = bytes >= options_.incremental_min_bytes &&
                           kernels::CanTransposeFromPieces(ArgsOf(spec));
  BufferPool::Buffer input;
  if (!from_pieces) {
    TRANSPOSE_ASSIGN_OR_RETURN(input, buffers_.Acquire(bytes));
  }
  TRANSPOSE_ASSIGN_OR_RETURN(BufferPool::Buffer output,
                             buffers_.Acquire(bytes));
  return std::make_unique<Job>(*this, spec, bytes, from_pieces,
                               std::move(input), std::move(output));
}

}  // namespace transpose
