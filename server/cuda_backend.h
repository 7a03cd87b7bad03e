// The GPU backend: per visible GPU, a pool of CUDA streams, each with a thread
// that runs one job at a time (copy-in, kernel, copy-out), a stream-ordered
// pool of device memory and a pool of pinned host buffers. Once warm, a request
// maps no new memory and never synchronises the whole device; jobs on different
// streams overlap their copies and kernels.
#ifndef TRANSPOSE_SERVER_CUDA_BACKEND_H_
#define TRANSPOSE_SERVER_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/backend.h"
#include "server/metrics.h"

namespace transpose {

struct CudaBackendOptions {
  // Streams (concurrent requests) per GPU.
  int streams_per_device = 4;
  // Bytes copied device-to-device to calibrate each GPU's copy bandwidth at
  // start-up (at most a sixteenth of the device's memory). Large copies reach
  // the ceiling that large transposes are measured against: on an H200, 256 MiB
  // copies ran at 3.96 TB/s and 1 GiB copies at 4.2.
  uint64_t calibration_bytes = uint64_t{1} << 30;
  // A job on a stream longer than this takes the device out of service, as a
  // sticky fault does: a kernel or copy that never ends (a device that stops
  // answering, with no error) would otherwise hold its stream, and its
  // caller's admission, for good while health said SERVING. Jobs take
  // milliseconds to seconds (a 4 GiB matrix crosses PCIe in about 0.2 s each
  // way). Zero: never.
  absl::Duration hang_limit = absl::Seconds(60);
  // Testing only: after this many jobs, run a faulting kernel (0: never).
  int testing_fault_after_jobs = 0;
  // Testing only: after this many jobs, each job first runs a kernel that
  // spins for 30 s (0: never).
  int testing_hang_after_jobs = 0;
  // Testing only: this device fails to come up, as a broken one would (-1:
  // none).
  int testing_unusable_device = -1;
  // Testing only: the shared memory per block taken for the device's (0: the
  // device's own), to show refusals that today's large GPUs never need.
  size_t testing_max_shared_bytes_per_block = 0;
  // Released pinned host buffers kept for reuse, per GPU.
  size_t max_idle_pinned_bytes = size_t{4} << 30;
  // Device memory kept for reuse once jobs free it, per GPU; a job needs twice
  // its matrix. Past it, freed memory goes back to the device, so one huge
  // request does not hold its buffers for the life of the process.
  uint64_t max_idle_device_bytes = uint64_t{8} << 30;
  // Jobs up to this size skip both copies: the kernel reads the input from
  // pinned host memory and writes the result to pinned host memory over PCIe.
  // For a 64x64 float32 matrix one launch costs less than two copies and a
  // launch. 0: every job copies.
  uint64_t mapped_max_bytes = 64 << 10;
  // How long an idle stream thread polls for the next job before it sleeps
  // (WorkerPool): longer than the gap between one client's back-to-back small
  // requests.
  absl::Duration stream_thread_spin = absl::Microseconds(500);
};

// GPUs visible to this process; 0 without a driver or device, or in a build
// without CUDA.
int CudaDeviceCount();

// Why CudaDeviceCount() is 0, for a log line: a build without CUDA, or CUDA's
// error.
std::string WhyNoCudaDevice();

// What became of the visible GPUs: a calibrated backend, named "cuda:N", for
// each that came up, and why each other did not ("cuda:N: ...").
struct CudaBackends {
  std::vector<std::unique_ptr<Backend>> usable;
  std::vector<absl::Status> failed;
};

// Brings up every visible GPU; one that fails leaves the others up, for the
// caller to serve on or not. UNAVAILABLE without a GPU or in a build without
// CUDA. `metrics` must outlive the backends.
absl::StatusOr<CudaBackends> CreateCudaBackends(
    const CudaBackendOptions& options, Metrics& metrics);

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CUDA_BACKEND_H_
