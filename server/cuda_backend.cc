#include "server/cuda_backend.h"

#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/cuda_status.h"
#include "kernels/gpu_launch.h"
#include "kernels/gpu_transpose.h"
#include "server/buffer_pool.h"
#include "server/core/log.h"
#include "server/core/notification.h"
#include "server/core/process.h"
#include "server/core/retry.h"
#include "server/core/status_macros.h"
#include "server/worker_pool.h"

namespace transpose {
namespace {

using kernels::internal::CudaStatus;
using kernels::internal::IsStickyCudaError;

// Makes `device` current on this thread for the scope, then puts back the
// caller's: creating or destroying a backend must not move its caller's later
// CUDA calls (a test's, or another backend's) to another GPU.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ == device) {
      previous_ = -1;  // Nothing to change, nor to put back.
      return;
    }
    status_ = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
  }
  ~ScopedDevice() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;
  const absl::Status& status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

// Asks the driver, through the runtime that loads it, so that the server links
// no libcuda and starts where there is none. CUDA's default since 12.2 is on
// first run, which main() overrides unless the environment sets a value for
// CUDA_MODULE_LOADING.
KernelLoading CurrentKernelLoading() {
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuModuleGetLoadingMode", &entry,
                                       /*cudaVersion=*/11070, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();  // Not sticky: later calls must not see it.
    return KernelLoading::kUnknown;
  }
  CUmoduleLoadingMode mode;
  if (reinterpret_cast<PFN_cuModuleGetLoadingMode_v11070>(entry)(&mode) !=
      CUDA_SUCCESS) {
    return KernelLoading::kUnknown;
  }
  switch (mode) {
    case CU_MODULE_EAGER_LOADING:
      return KernelLoading::kAtStart;
    case CU_MODULE_LAZY_LOADING:
      return KernelLoading::kOnFirstRun;
  }
  return KernelLoading::kUnknown;
}

// Pinned host memory, usable by every GPU, so copies run at full PCIe speed.
// Pinned and unpinned through `device`'s context: the threads that ask (gRPC's)
// have not chosen a device, so CUDA would use GPU 0's, and a fault there would
// then refuse every other GPU's pinned memory too and leak what they give
// back. The caller's device is put back after, as for a backend's creation (a
// thread that never chose one reads as GPU 0's).
class PinnedAllocator final : public MemoryAllocator {
 public:
  // `device_healthy` is the backend's health, which outlives this.
  PinnedAllocator(int device, const std::atomic<bool>& device_healthy)
      : device_(device), device_healthy_(device_healthy) {}

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    const ScopedDevice scoped(device_);
    TRANSPOSE_RETURN_IF_ERROR(scoped.status());
    void* data = nullptr;
    // Mapped, so that small jobs' kernels can read and write it directly.
    const cudaError_t error = cudaHostAlloc(
        &data, bytes, cudaHostAllocPortable | cudaHostAllocMapped);
    if (error != cudaSuccess) cudaGetLastError();  // Clear it if not sticky.
    const absl::Status status = CudaStatus(
        error, absl::StrFormat("pinning %d bytes of host memory", bytes));
    // Out of memory (RESOURCE_EXHAUSTED) is for now, where other jobs hold
    // it, unless this one could never fit.
    if (absl::IsResourceExhausted(status) && FitsHostMemory(bytes)) {
      return RetryLater(status);
    }
    TRANSPOSE_RETURN_IF_ERROR(status);
    return data;
  }
  void Free(void* data, size_t) override {
    // Once the device is out of service its memory stays pinned until the
    // process ends: cudaFreeHost waits for the device, which after a hang
    // never comes back, and it would hold the thread that freed (the hang
    // watch failing queued jobs, or a gRPC thread) with it.
    if (!device_healthy_.load()) return;
    const ScopedDevice scoped(device_);
    cudaFreeHost(data);
  }

 private:
  const int device_;
  const std::atomic<bool>& device_healthy_;
};

// How long the testing-only hang spins: past any --gpu_hang_seconds a test
// sets, and short enough that the device is free again soon after.
constexpr absl::Duration kTestingHang = absl::Seconds(30);

float ElapsedMs(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  cudaEventElapsedTime(&ms, from, to);
  return ms;
}

// One stream with the events that time its stages.
struct Slot {
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr;
  cudaEvent_t copied_in = nullptr;
  cudaEvent_t transposed = nullptr;
  cudaEvent_t copied_out = nullptr;
  // The same, for jobs long enough that the stream thread should sleep on it.
  cudaEvent_t copied_out_sleeping = nullptr;
  // When its job took it; InfiniteFuture while free. Guarded by the backend's
  // mutex_.
  absl::Time busy_since = absl::InfiniteFuture();
};

class CudaBackend final : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      int device, const CudaBackendOptions& options, Metrics& metrics);
  ~CudaBackend() override;

  const BackendInfo& info() const override { return info_; }
  bool healthy() const override { return healthy_.load(); }
  int load() const override { return load_.load(std::memory_order_relaxed); }
  absl::Status CanRun(const TransposeSpec& spec) const override;
  absl::StatusOr<std::unique_ptr<TransposeJob>> CreateJob(
      const TransposeSpec& spec, uint64_t bytes) override;

 private:
  class Job;

  CudaBackend(int device, const CudaBackendOptions& options, Metrics& metrics);
  absl::Status Init();
  absl::StatusOr<double> CalibrateCopyBandwidth();
  Slot& AcquireSlot();
  void ReleaseSlot(Slot& slot);
  // Device memory for one buffer of a job, in stream order from device_pool_.
  absl::StatusOr<void*> AllocateOnDevice(uint64_t bytes, cudaStream_t stream);
  // Publishes what device_pool_ holds from the device.
  void UpdateDeviceMemoryGauge();
  // Runs one job on a stream thread (or fails it at once, on any thread, once
  // the device is out of service): copy in, transpose, copy out, wait. With
  // `output` apart from `input` (both pinned), the kernel reads and writes the
  // host memory directly instead; otherwise the result comes back into
  // `input`.
  absl::Status Execute(const TransposeSpec& spec, uint64_t bytes,
                       uint8_t* input, uint8_t* output, TransposeStats& stats);
  // Marks the device unhealthy after a sticky error.
  absl::Status Check(cudaError_t error, absl::string_view what);
  // Marks the device unhealthy, once, saying why.
  void TakeOutOfService(absl::string_view why);
  // Until the backend goes: takes the device out of service once a job has
  // held its stream longer than options_.hang_limit.
  void WatchForHangs();
  // What calls get once the device is unhealthy.
  absl::Status OutOfServiceError() const;

  const int device_;
  const CudaBackendOptions options_;
  // options_.mapped_max_bytes, or 0 where the device cannot map host memory.
  uint64_t mapped_max_bytes_ = 0;
  // CUDA's opt-in maximum (or the testing option's).
  size_t max_shared_bytes_per_block_ = 0;
  Metrics& metrics_;
  Metrics::BackendSeries* series_ = nullptr;
  BackendInfo info_;
  // Before pinned_, whose allocator reads it until the pool is gone.
  std::atomic<bool> healthy_{true};
  std::atomic<int> load_{0};
  // Its allocated bytes are the host memory gauge's figure.
  BufferPool pinned_;
  std::vector<Slot> slots_;
  std::mutex mutex_;
  std::vector<Slot*> free_slots_;
  // Jobs' device buffers. Freed buffers stay in it, for the next job on any
  // stream, up to options_.max_idle_device_bytes.
  cudaMemPool_t device_pool_ = nullptr;
  std::atomic<int> jobs_started_{0};
  Notification stop_hang_watch_;
  std::thread hang_watch_;
  // Destroyed first: joins the stream threads before the slots go.
  std::unique_ptr<WorkerPool> workers_;
};

class CudaBackend::Job final : public TransposeJob {
 public:
  // `mapped_output` is empty unless the kernel works on the host buffers.
  Job(CudaBackend& backend, const TransposeSpec& spec, uint64_t bytes,
      BufferPool::Buffer host, BufferPool::Buffer mapped_output)
      : backend_(backend),
        load_(backend.load_),
        spec_(spec),
        bytes_(bytes),
        host_(std::move(host)),
        mapped_output_(std::move(mapped_output)),
        created_(absl::Now()) {}
  ~Job() override {
    host_.Reset();
    mapped_output_.Reset();
  }

  void AppendInput(absl::Span<const absl::string_view> pieces,
                   std::shared_ptr<const void>) override {
    // Into pinned memory, which the copy to the device needs.
    received_ = CopyPieces(pieces, host_.span(), received_);
  }
  // The result is copied back into the same pinned buffer the input came from,
  // or written by the kernel into its own.
  absl::Span<const uint8_t> output() const override {
    return {result(), bytes_};
  }
  const TransposeStats& stats() const override { return stats_; }

  void Run(JobDoneCallback done) override {
    backend_.workers_->Schedule(
        [this, queued = absl::Now(), done = std::move(done)]() mutable {
          stats_.queue_seconds = absl::ToDoubleSeconds(absl::Now() - queued);
          absl::Status status =
              backend_.Execute(spec_, bytes_, host_.data(), result(), stats_);
          stats_.total_seconds = absl::ToDoubleSeconds(absl::Now() - created_);
          load_.Release();
          std::move(done)(std::move(status));
        });
  }

 private:
  uint8_t* result() const {
    return mapped_output_.size() > 0 ? mapped_output_.data() : host_.data();
  }

  CudaBackend& backend_;
  JobLoad load_;
  const TransposeSpec spec_;
  const uint64_t bytes_;
  BufferPool::Buffer host_;
  BufferPool::Buffer mapped_output_;
  uint64_t received_ = 0;
  const absl::Time created_;
  TransposeStats stats_;
};

CudaBackend::CudaBackend(int device, const CudaBackendOptions& options,
                         Metrics& metrics)
    : device_(device),
      options_(options),
      metrics_(metrics),
      pinned_(std::make_unique<PinnedAllocator>(device, healthy_),
              options.max_idle_pinned_bytes) {}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    int device, const CudaBackendOptions& options, Metrics& metrics) {
  std::unique_ptr<CudaBackend> backend(
      new CudaBackend(device, options, metrics));
  TRANSPOSE_RETURN_IF_ERROR(backend->Init());
  return backend;
}

absl::Status CudaBackend::Init() {
  if (device_ == options_.testing_unusable_device) {
    return absl::FailedPreconditionError(
        "a testing flag (--testing_cuda_unusable_device) keeps it from coming "
        "up");
  }
  const ScopedDevice scoped_device(device_);
  TRANSPOSE_RETURN_IF_ERROR(scoped_device.status());
  cudaDeviceProp properties;
  TRANSPOSE_RETURN_IF_ERROR(
      CudaStatus(cudaGetDeviceProperties(&properties, device_),
                 "cudaGetDeviceProperties"));
  info_.name = absl::StrCat("cuda:", device_);
  info_.device_name = properties.name;
  info_.total_memory_bytes = properties.totalGlobalMem;
  // Kernels on host memory need the device to map it (every GPU this toolkit
  // supports can, with unified addressing); otherwise every job copies.
  mapped_max_bytes_ =
      properties.canMapHostMemory && properties.unifiedAddressing
          ? options_.mapped_max_bytes
          : 0;
  max_shared_bytes_per_block_ =
      options_.testing_max_shared_bytes_per_block > 0
          ? options_.testing_max_shared_bytes_per_block
          : properties.sharedMemPerBlockOptin;
  char pci_bus_id[64] = {};
  TRANSPOSE_RETURN_IF_ERROR(
      CudaStatus(cudaDeviceGetPCIBusId(pci_bus_id, sizeof(pci_bus_id), device_),
                 "cudaDeviceGetPCIBusId"));
  info_.pci_bus_id = pci_bus_id;
  info_.streams = std::max(1, options_.streams_per_device);
  info_.algorithms.assign(kernels::AllAlgorithms().begin(),
                          kernels::AllAlgorithms().end());
  for (absl::string_view name : kernels::AllKernelNames()) {
    info_.kernel_names.emplace_back(name);
  }
  info_.kernel_loading = CurrentKernelLoading();

  int pools_supported = 0;
  TRANSPOSE_RETURN_IF_ERROR(CudaStatus(
      cudaDeviceGetAttribute(&pools_supported, cudaDevAttrMemoryPoolsSupported,
                             device_),
      "cudaDeviceGetAttribute"));
  if (!pools_supported) {
    return absl::FailedPreconditionError(absl::StrCat(
        info_.name, " (", info_.device_name,
        ") has no stream-ordered memory pools; a newer driver may add them"));
  }
  cudaMemPoolProps pool_properties = {};
  pool_properties.allocType = cudaMemAllocationTypePinned;
  pool_properties.location.type = cudaMemLocationTypeDevice;
  pool_properties.location.id = device_;
  TRANSPOSE_RETURN_IF_ERROR(CudaStatus(
      cudaMemPoolCreate(&device_pool_, &pool_properties), "cudaMemPoolCreate"));
  // Without a threshold the pool would hand every freed byte back to the
  // device at the next synchronisation, and each job would map its buffers
  // anew.
  uint64_t release_threshold = options_.max_idle_device_bytes;
  TRANSPOSE_RETURN_IF_ERROR(CudaStatus(
      cudaMemPoolSetAttribute(device_pool_, cudaMemPoolAttrReleaseThreshold,
                              &release_threshold),
      "cudaMemPoolSetAttribute"));
  // Otherwise a job could take memory another stream has yet to free, and wait
  // for that stream's work: streams would no longer overlap.
  int reuse_across_pending_frees = 0;
  TRANSPOSE_RETURN_IF_ERROR(CudaStatus(
      cudaMemPoolSetAttribute(device_pool_,
                              cudaMemPoolReuseAllowInternalDependencies,
                              &reuse_across_pending_frees),
      "cudaMemPoolSetAttribute"));

  slots_.resize(info_.streams);
  for (Slot& slot : slots_) {
    TRANSPOSE_RETURN_IF_ERROR(CudaStatus(
        cudaStreamCreateWithFlags(&slot.stream, cudaStreamNonBlocking),
        "cudaStreamCreateWithFlags"));
    TRANSPOSE_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreate(&slot.start), "cudaEventCreate"));
    TRANSPOSE_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreate(&slot.copied_in), "cudaEventCreate"));
    TRANSPOSE_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreate(&slot.transposed), "cudaEventCreate"));
    TRANSPOSE_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreate(&slot.copied_out), "cudaEventCreate"));
    TRANSPOSE_RETURN_IF_ERROR(
        CudaStatus(cudaEventCreateWithFlags(&slot.copied_out_sleeping,
                                            cudaEventBlockingSync),
                   "cudaEventCreateWithFlags"));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Slot& slot : slots_) free_slots_.push_back(&slot);
  }

  TRANSPOSE_ASSIGN_OR_RETURN(info_.copy_bandwidth_bytes_per_second,
                             CalibrateCopyBandwidth());

  series_ = metrics_.AddBackend(info_.name, info_.kernel_names);
  series_->peak_bandwidth->Set(info_.copy_bandwidth_bytes_per_second);
  // The gauge, not series_: the registry keeps it for the process's life.
  pinned_.ObserveAllocatedBytes(
      [host = series_->host_memory_used_bytes](size_t bytes) {
        host->Set(static_cast<double>(bytes));
      });
  workers_ = std::make_unique<WorkerPool>(
      info_.streams, [device = device_](int) { cudaSetDevice(device); },
      options_.stream_thread_spin);
  if (options_.hang_limit > absl::ZeroDuration()) {
    hang_watch_ = std::thread([this] { WatchForHangs(); });
  }
  return absl::OkStatus();
}

CudaBackend::~CudaBackend() {
  stop_hang_watch_.Notify();
  if (hang_watch_.joinable()) hang_watch_.join();
  workers_.reset();
  const ScopedDevice scoped_device(device_);
  for (Slot& slot : slots_) {
    if (slot.stream != nullptr) cudaStreamSynchronize(slot.stream);
    for (cudaEvent_t event : {slot.start, slot.copied_in, slot.transposed,
                              slot.copied_out, slot.copied_out_sleeping}) {
      if (event != nullptr) cudaEventDestroy(event);
    }
    if (slot.stream != nullptr) cudaStreamDestroy(slot.stream);
  }
  if (device_pool_ != nullptr) cudaMemPoolDestroy(device_pool_);
}

absl::StatusOr<double> CudaBackend::CalibrateCopyBandwidth() {
  const size_t bytes = std::min<size_t>(options_.calibration_bytes,
                                        info_.total_memory_bytes / 16);
  void* src = nullptr;
  void* dst = nullptr;
  absl::Cleanup free_buffers = [&] {
    cudaFree(src);
    cudaFree(dst);
  };
  TRANSPOSE_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&src, bytes), "cudaMalloc"));
  TRANSPOSE_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&dst, bytes), "cudaMalloc"));
  TRANSPOSE_RETURN_IF_ERROR(
      CudaStatus(cudaMemset(src, 1, bytes), "cudaMemset"));
  Slot& slot = slots_.front();
  std::vector<float> ms;
  for (int i = 0; i < 12; ++i) {
    TRANSPOSE_RETURN_IF_ERROR(CudaStatus(
        cudaEventRecord(slot.start, slot.stream), "cudaEventRecord"));
    TRANSPOSE_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, slot.stream),
        "cudaMemcpyAsync"));
    TRANSPOSE_RETURN_IF_ERROR(CudaStatus(
        cudaEventRecord(slot.copied_out, slot.stream), "cudaEventRecord"));
    TRANSPOSE_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(slot.copied_out),
                                         "cudaEventSynchronize"));
    if (i >= 2)
      ms.push_back(ElapsedMs(slot.start, slot.copied_out));  // 2 warm-ups.
  }
  std::sort(ms.begin(), ms.end());
  return 2.0 * static_cast<double>(bytes) / (ms[ms.size() / 2] * 1e-3);
}

absl::Status CudaBackend::CanRun(const TransposeSpec& spec) const {
  // From the header, so that a kernel too large for this GPU is refused before
  // the upload; the job checks again against its buffers, whose alignment
  // AUTO's pick also reads (its picks all fit every supported GPU).
  absl::Status fits = kernels::CheckFitsDevice(spec.algorithm, ArgsOf(spec),
                                               max_shared_bytes_per_block_);
  if (!fits.ok()) {
    return absl::Status(fits.code(),
                        absl::StrCat(info_.name, ": ", fits.message()));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::OutOfServiceError() const {
  return absl::UnavailableError(absl::StrCat(
      info_.name,
      " is out of service after a fault or hang (until the server restarts)"));
}

absl::StatusOr<std::unique_ptr<TransposeJob>> CudaBackend::CreateJob(
    const TransposeSpec& spec, uint64_t bytes) {
  if (!healthy()) {
    return OutOfServiceError();
  }
  TRANSPOSE_ASSIGN_OR_RETURN(BufferPool::Buffer host, pinned_.Acquire(bytes));
  BufferPool::Buffer mapped_output;
  if (bytes <= mapped_max_bytes_) {
    TRANSPOSE_ASSIGN_OR_RETURN(mapped_output, pinned_.Acquire(bytes));
  }
  return std::make_unique<Job>(*this, spec, bytes, std::move(host),
                               std::move(mapped_output));
}

Slot& CudaBackend::AcquireSlot() {
  // There are as many stream threads as slots, so a running job always finds
  // one.
  std::lock_guard<std::mutex> lock(mutex_);
  Slot* slot = free_slots_.back();
  free_slots_.pop_back();
  slot->busy_since = absl::Now();
  series_->busy_streams->Increment();
  return *slot;
}

void CudaBackend::ReleaseSlot(Slot& slot) {
  std::lock_guard<std::mutex> lock(mutex_);
  slot.busy_since = absl::InfiniteFuture();
  free_slots_.push_back(&slot);
  series_->busy_streams->Decrement();
}

absl::Status CudaBackend::Check(cudaError_t error, absl::string_view what) {
  // Once per device: the line (and transpose_backend_healthy's 0) an operator
  // looks for when one GPU of a pod stops serving while the others go on
  // (health turns NOT_SERVING only when none is left).
  if (error != cudaSuccess && IsStickyCudaError(error)) {
    TakeOutOfService(absl::StrFormat("%s (%s) in %s", cudaGetErrorName(error),
                                     cudaGetErrorString(error), what));
  }
  // A kernel launch checks for errors with cudaGetLastError, which would
  // otherwise report this one against the next job on this thread.
  if (error != cudaSuccess && !IsStickyCudaError(error)) cudaGetLastError();
  return CudaStatus(error, what);
}

void CudaBackend::TakeOutOfService(absl::string_view why) {
  if (!healthy_.exchange(false)) return;
  series_->healthy->Set(0);
  Log(LogLevel::kError,
      "%s: %s: the device is out of service until the server restarts",
      info_.name, why);
}

void CudaBackend::WatchForHangs() {
  const absl::Duration limit = options_.hang_limit;
  const absl::Duration period =
      std::clamp(limit / 4, absl::Milliseconds(10), absl::Seconds(1));
  while (!stop_hang_watch_.WaitForNotificationWithTimeout(period)) {
    absl::Time oldest = absl::InfiniteFuture();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const Slot& slot : slots_) {
        oldest = std::min(oldest, slot.busy_since);
      }
    }
    const absl::Duration running = absl::Now() - oldest;
    if (running > limit) {
      // Nothing can stop the job: its thread and buffers stay with it. Health
      // turns NOT_SERVING once no device is left, and the orchestrator
      // restarts the process.
      TakeOutOfService(absl::StrFormat(
          "a job has held its stream for %.1fs, past the %gs a job may take "
          "(a kernel or copy that does not end)",
          absl::ToDoubleSeconds(running), absl::ToDoubleSeconds(limit)));
      // The jobs queued for the streams, and those run later, fail now (out of
      // service) instead of waiting for their callers' deadlines behind
      // stream threads that may never come back.
      workers_->RunTasksOnCallersFromNowOn();
      return;
    }
  }
}

absl::StatusOr<void*> CudaBackend::AllocateOnDevice(uint64_t bytes,
                                                    cudaStream_t stream) {
  void* data = nullptr;
  cudaError_t error =
      cudaMallocFromPoolAsync(&data, bytes, device_pool_, stream);
  if (error == cudaErrorMemoryAllocation) {
    cudaGetLastError();  // Not sticky; clear it.
    absl::Status status = absl::ResourceExhaustedError(
        absl::StrFormat("%s: out of device memory for a %d-byte matrix (%s)",
                        info_.name, bytes, cudaGetErrorString(error)));
    // Other jobs (or processes) hold the memory for now: a job that fits the
    // device when it is empty is worth sending again.
    return 2 * bytes <= info_.total_memory_bytes ? RetryLater(status) : status;
  }
  TRANSPOSE_RETURN_IF_ERROR(Check(error, "cudaMallocFromPoolAsync"));
  return data;
}

void CudaBackend::UpdateDeviceMemoryGauge() {
  // Read and set together, or an older reading could overwrite a newer one.
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t reserved = 0;
  if (cudaMemPoolGetAttribute(device_pool_, cudaMemPoolAttrReservedMemCurrent,
                              &reserved) == cudaSuccess) {
    series_->device_memory_used_bytes->Set(static_cast<double>(reserved));
  }
}

absl::Status CudaBackend::Execute(const TransposeSpec& spec, uint64_t bytes,
                                  uint8_t* input, uint8_t* output,
                                  TransposeStats& stats) {
  if (!healthy()) {
    return OutOfServiceError();
  }
  Slot& slot = AcquireSlot();
  cudaStream_t stream = slot.stream;
  // Small jobs' kernels work on the pinned host buffers directly; the rest copy
  // in and out of device buffers from the pool.
  const bool on_host = output != input;
  void* pooled_input = nullptr;
  void* pooled_output = nullptr;
  absl::Cleanup release = [&] {
    // On an error path a copy or kernel may still be using the buffers; the
    // caller frees the host ones next.
    if (pooled_input != nullptr) cudaFreeAsync(pooled_input, stream);
    if (pooled_output != nullptr) cudaFreeAsync(pooled_output, stream);
    cudaStreamSynchronize(stream);
    if (!on_host) UpdateDeviceMemoryGauge();
    ReleaseSlot(slot);
  };
  kernels::TransposeArgs args = ArgsOf(spec);
  if (on_host) {
    void* device_input = nullptr;
    void* device_output = nullptr;
    TRANSPOSE_RETURN_IF_ERROR(
        Check(cudaHostGetDevicePointer(&device_input, input, 0), "map input"));
    TRANSPOSE_RETURN_IF_ERROR(Check(
        cudaHostGetDevicePointer(&device_output, output, 0), "map output"));
    args.input = device_input;
    args.output = device_output;
  } else {
    TRANSPOSE_ASSIGN_OR_RETURN(pooled_input, AllocateOnDevice(bytes, stream));
    TRANSPOSE_ASSIGN_OR_RETURN(pooled_output, AllocateOnDevice(bytes, stream));
    args.input = pooled_input;
    args.output = pooled_output;
  }
  TRANSPOSE_RETURN_IF_ERROR(kernels::CanImplement(spec.algorithm, args));

  const int jobs_before = jobs_started_.fetch_add(1);
  if (options_.testing_fault_after_jobs > 0 &&
      jobs_before >= options_.testing_fault_after_jobs) {
    kernels::internal::LaunchFaultForTesting(stream);
  }
  if (options_.testing_hang_after_jobs > 0 &&
      jobs_before >= options_.testing_hang_after_jobs) {
    TRANSPOSE_RETURN_IF_ERROR(
        Check(static_cast<cudaError_t>(kernels::internal::LaunchSpinForTesting(
                  stream, absl::ToDoubleSeconds(kTestingHang))),
              "testing hang"));
  }
  // On the host buffers there are no copies, and no events to time them.
  cudaEvent_t copied_in = on_host ? slot.start : slot.copied_in;
  TRANSPOSE_RETURN_IF_ERROR(
      Check(cudaEventRecord(slot.start, stream), "record"));
  if (!on_host) {
    TRANSPOSE_RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(pooled_input, input, bytes,
                              cudaMemcpyHostToDevice, stream),
              "copy in"));
    TRANSPOSE_RETURN_IF_ERROR(
        Check(cudaEventRecord(copied_in, stream), "record"));
  }
  if (absl::Status s = kernels::LaunchTranspose(spec.algorithm, args, stream);
      !s.ok()) {
    Check(cudaPeekAtLastError(), "launch")
        .IgnoreError();  // Only to mark a sticky fault.
    return s;
  }
  // Small jobs finish in tens of microseconds: spinning on them beats the
  // wake-up of a sleeping thread. Larger ones let the thread sleep, not spin a
  // core for milliseconds. Kernel completion makes an on-host kernel's writes
  // to host memory visible.
  constexpr uint64_t kSpinMaxBytes = 1 << 20;
  cudaEvent_t copied_out =
      bytes <= kSpinMaxBytes ? slot.copied_out : slot.copied_out_sleeping;
  cudaEvent_t transposed = on_host ? copied_out : slot.transposed;
  TRANSPOSE_RETURN_IF_ERROR(
      Check(cudaEventRecord(transposed, stream), "record"));
  if (!on_host) {
    TRANSPOSE_RETURN_IF_ERROR(
        Check(cudaMemcpyAsync(output, pooled_output, bytes,
                              cudaMemcpyDeviceToHost, stream),
              "copy out"));
    // Freed before the event the thread waits on, so that once the job is done
    // its buffers are free for any stream.
    for (void** pooled : {&pooled_input, &pooled_output}) {
      // Off the cleanup's list even if the free fails: never freed twice.
      void* buffer = std::exchange(*pooled, nullptr);
      TRANSPOSE_RETURN_IF_ERROR(
          Check(cudaFreeAsync(buffer, stream), "cudaFreeAsync"));
    }
    TRANSPOSE_RETURN_IF_ERROR(
        Check(cudaEventRecord(copied_out, stream), "record"));
  }
  TRANSPOSE_RETURN_IF_ERROR(
      Check(cudaEventSynchronize(copied_out), "transpose"));

  stats.backend = info_.name;
  stats.algorithm = std::string(kernels::KernelName(spec.algorithm, args));
  stats.copy_in_seconds = ElapsedMs(slot.start, copied_in) * 1e-3;
  stats.copy_out_seconds = ElapsedMs(transposed, copied_out) * 1e-3;
  // On the host buffers, the kernel's time includes its reads and writes across
  // PCIe.
  SetKernelTime(ElapsedMs(copied_in, transposed) * 1e-3, bytes,
                info_.copy_bandwidth_bytes_per_second, stats);
  metrics_.RecordKernel(*series_, stats, bytes);
  return absl::OkStatus();
}

}  // namespace

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

std::string WhyNoCudaDevice() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  cudaGetLastError();
  if (error != cudaSuccess) {
    return absl::StrCat(
        "CUDA sees none (cudaGetDeviceCount: ", cudaGetErrorName(error), ", ",
        cudaGetErrorString(error), ")");
  }
  return absl::StrCat("CUDA sees ", count, " of them");
}

absl::StatusOr<CudaBackends> CreateCudaBackends(
    const CudaBackendOptions& options, Metrics& metrics) {
  const int count = CudaDeviceCount();
  if (count == 0) return absl::UnavailableError("no CUDA device is visible");
  CudaBackends backends;
  for (int device = 0; device < count; ++device) {
    absl::StatusOr<std::unique_ptr<CudaBackend>> backend =
        CudaBackend::Create(device, options, metrics);
    if (backend.ok()) {
      backends.usable.push_back(*std::move(backend));
    } else {
      backends.failed.push_back(absl::Status(
          backend.status().code(),
          absl::StrCat("cuda:", device, ": ", backend.status().message())));
    }
  }
  return backends;
}

}  // namespace transpose
