#include "kernels/gpu_transpose.h"

#include <cuda_runtime_api.h>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "kernels/gpu_launch.h"

namespace transpose::kernels {
namespace {

using internal::Kernel;

absl::StatusOr<Kernel> KernelFor(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto:
      return Kernel::kPadded64x8;
    case Algorithm::kNaive:
      return Kernel::kNaive;
    case Algorithm::kShared:
      return Kernel::kShared;
    case Algorithm::kPadded32:
      return Kernel::kPadded32;
    case Algorithm::kPadded64:
      return Kernel::kPadded64;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("algorithm %d is unknown", static_cast<int>(algorithm)));
}

absl::string_view NameOf(Kernel kernel) {
  switch (kernel) {
    case Kernel::kNaive:
      return "naive";
    case Kernel::kShared:
      return "shared";
    case Kernel::kPadded32:
      return "padded_32";
    case Kernel::kPadded64:
      return "padded_64";
    case Kernel::kPadded64x8:
      return "padded_64x8";
  }
  return "unknown";
}

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat(
      "%s: %s (%s)", what, cudaGetErrorString(error), cudaGetErrorName(error)));
}

}  // namespace

absl::string_view KernelName(Algorithm algorithm, const TransposeArgs&) {
  absl::StatusOr<Kernel> kernel = KernelFor(algorithm);
  return kernel.ok() ? NameOf(*kernel) : "unknown";
}

absl::Status CanImplement(Algorithm algorithm, const TransposeArgs& args) {
  if (absl::Status status = CheckArgs(args); !status.ok()) return status;
  absl::StatusOr<Kernel> kernel = KernelFor(algorithm);
  if (!kernel.ok()) return kernel.status();
  int device = 0;
  if (absl::Status status = CudaStatus(cudaGetDevice(&device), "cudaGetDevice");
      !status.ok()) {
    return status;
  }
  int max_shared = 0;
  if (absl::Status status = CudaStatus(
          cudaDeviceGetAttribute(
              &max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
          "cudaDeviceGetAttribute");
      !status.ok()) {
    return status;
  }
  const size_t shared = internal::SharedMemoryBytes(*kernel, args.element_size);
  if (shared > static_cast<size_t>(max_shared)) {
    return absl::UnimplementedError(absl::StrFormat(
        "kernel %s needs %d bytes of shared memory for %d-byte elements; "
        "device %d has %d",
        NameOf(*kernel), shared, args.element_size, device, max_shared));
  }
  return absl::OkStatus();
}

absl::Status LaunchTranspose(Algorithm algorithm, const TransposeArgs& args,
                             void* cuda_stream) {
  absl::StatusOr<Kernel> kernel = KernelFor(algorithm);
  if (!kernel.ok()) return kernel.status();
  const int error = internal::Launch(*kernel, args, cuda_stream);
  return CudaStatus(static_cast<cudaError_t>(error),
                    absl::StrFormat("launching %s", NameOf(*kernel)));
}

}  // namespace transpose::kernels
