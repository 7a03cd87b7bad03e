// The interfaces between the engine and the devices it transposes on.
// Implementations: CpuBackend, CudaBackend (one per GPU), and fakes in tests.
// No transport types.
#ifndef TRANSPOSE_SERVER_BACKEND_H_
#define TRANSPOSE_SERVER_BACKEND_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "kernels/transpose_args.h"
#include "server/core/matrix.h"
#include "server/core/stats.h"

namespace transpose {

// What to transpose; the data arrives separately, through
// TransposeJob::AppendInput.
struct TransposeSpec {
  DataType dtype = DataType::kUnspecified;
  MatrixShape shape;
  kernels::Algorithm algorithm = kernels::Algorithm::kAuto;

  friend bool operator==(const TransposeSpec& a, const TransposeSpec& b) {
    return a.dtype == b.dtype && a.shape == b.shape &&
           a.algorithm == b.algorithm;
  }
};

// The kernels' args for `spec`: its element size and shape, no buffers yet.
inline kernels::TransposeArgs ArgsOf(const TransposeSpec& spec) {
  kernels::TransposeArgs args;
  args.element_size = ElementSize(spec.dtype);
  args.batch = spec.shape.batch;
  args.rows = spec.shape.rows;
  args.cols = spec.shape.cols;
  return args;
}

// Called once when a job finishes: OK, or why it failed.
using JobDoneCallback = absl::AnyInvocable<void(absl::Status) &&>;

// One request's workspace on one backend, from the header's arrival until its
// result has been sent. Destroying it gives its buffers back; a job must not be
// destroyed while running.
class TransposeJob {
 public:
  virtual ~TransposeJob() = default;

  // Takes the next bytes of the input, in order, in the pieces the transport
  // delivered them in. A job may read them in place instead of copying them for
  // as long as it holds `owner`, which keeps them alive; with a null owner the
  // caller keeps them alive until the job is destroyed. The pieces add up to
  // the spec's bytes before Run. Called from one thread at a time.
  virtual void AppendInput(absl::Span<const absl::string_view> pieces,
                           std::shared_ptr<const void> owner) = 0;
  // The result; valid once Run has reported OK, until the job is destroyed.
  virtual absl::Span<const uint8_t> output() const = 0;
  // Filled once Run has reported OK.
  virtual const TransposeStats& stats() const = 0;

  // Transposes the input into output(). `done` runs exactly once, on a backend
  // thread or, for small jobs, on the calling thread before Run returns; it may
  // destroy the job. Call at most once.
  virtual void Run(JobDoneCallback done) = 0;
};

// For jobs that keep their input in one buffer: copies `pieces` into `buffer`
// from `offset` on and returns the offset after them.
inline uint64_t CopyPieces(absl::Span<const absl::string_view> pieces,
                           absl::Span<uint8_t> buffer, uint64_t offset) {
  for (absl::string_view piece : pieces) {
    std::memcpy(buffer.data() + offset, piece.data(), piece.size());
    offset += piece.size();
  }
  return offset;
}

// When a GPU's kernels are loaded onto it.
enum class KernelLoading {
  kNotAGpu,
  kUnknown,  // The driver cannot say.
  kAtStart,
  // Each by its first run (CUDA_MODULE_LOADING=LAZY), whose kernel time, which
  // the caller and /metrics get, is then longer by the loading.
  kOnFirstRun,
};

// What a backend tells clients about itself.
struct BackendInfo {
  std::string name;         // "cuda:N" or "cpu".
  std::string device_name;  // "NVIDIA H200", a CPU model, ...
  // Measured at start-up: (bytes read + bytes written) / time of a copy on this
  // device.
  double copy_bandwidth_bytes_per_second = 0;
  int streams = 0;
  uint64_t total_memory_bytes = 0;
  // The device's PCI address ("0000:3B:00.0"); empty for the CPU.
  std::string pci_bus_id;
  std::vector<kernels::Algorithm> algorithms;
  // Names of the kernels this backend may report in TransposeStats::algorithm.
  std::vector<std::string> kernel_names;
  KernelLoading kernel_loading = KernelLoading::kNotAGpu;
};

// One device with its own streams and buffers.
class Backend {
 public:
  virtual ~Backend() = default;

  virtual const BackendInfo& info() const = 0;
  // False once the device has had a fault that makes its results untrustworthy.
  virtual bool healthy() const = 0;
  // Jobs created and not yet done: uploading, waiting to run, or running. A
  // job still uploading counts, because it will run here: a large upload
  // takes longer than its transpose, and the headers that arrive meanwhile
  // should go to a backend with fewer such jobs.
  virtual int load() const = 0;

  // OK when this backend can run `spec`; UNIMPLEMENTED for an algorithm it
  // lacks. The spec is already valid.
  virtual absl::Status CanRun(const TransposeSpec& spec) const = 0;
  // Reserves host memory for a job of `bytes`; RESOURCE_EXHAUSTED when it is
  // not there.
  virtual absl::StatusOr<std::unique_ptr<TransposeJob>> CreateJob(
      const TransposeSpec& spec, uint64_t bytes) = 0;
};

// A job's share of its backend's load(): one from the job's creation until
// Release (when the job is done) or its destruction, whichever comes first.
class JobLoad {
 public:
  explicit JobLoad(std::atomic<int>& load) : load_(&load) {
    load.fetch_add(1, std::memory_order_relaxed);
  }
  JobLoad(const JobLoad&) = delete;
  JobLoad& operator=(const JobLoad&) = delete;
  ~JobLoad() { Release(); }

  void Release() {
    if (std::atomic<int>* load = load_.exchange(nullptr)) {
      load->fetch_sub(1, std::memory_order_relaxed);
    }
  }

 private:
  std::atomic<std::atomic<int>*> load_;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_BACKEND_H_
