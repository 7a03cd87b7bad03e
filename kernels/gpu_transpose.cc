#include "kernels/gpu_transpose.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "kernels/gpu_launch.h"

namespace transpose::kernels {
namespace {

using internal::Kernel;

// Fraction of the matrix covered by whole tile_rows x tile_cols tiles.
double FullTileFraction(const TransposeArgs& args, uint64_t tile_rows,
                        uint64_t tile_cols) {
  const double full = static_cast<double>(args.rows / tile_rows * tile_rows) *
                      static_cast<double>(args.cols / tile_cols * tile_cols);
  return full /
         (static_cast<double>(args.rows) * static_cast<double>(args.cols));
}

// Whether every output row starts on a 32-byte sector (given an aligned
// output buffer, as the engine's are).
bool OutputRowsSectorAligned(const TransposeArgs& args) {
  return args.rows * args.element_size % 32 == 0;
}

// AUTO's pick, from transpose_bench on the H200 (docs/BENCHMARKS.md): the word
// kernel for bytes, the vector kernel for 2- and 16-byte elements where its
// 16-byte accesses are possible and its larger tiles are mostly full (a batch
// of 64 x 64 2-byte matrices would leave its 64 x 128 tiles half empty). For
// 4- and 8-byte elements: where most 64 x 64 tiles would be partial (small
// odd matrices, often batched), the 32 x 32 tile, which wastes less (4-byte
// batches of 63 x 65 to 511 x 513: 87-100% of memcpy, against 74-94% for the
// 64 x 64 tile and 30-80% for the skewed kernel, whose edge tiles take its
// slow path); otherwise the skewed kernel for output rows that are not
// sector-aligned and the padded 64 x 64 tile with 64 x 8 threads for those
// that are.
Kernel AutoKernel(const TransposeArgs& args) {
  switch (args.element_size) {
    case 1:
      return internal::CanUseWords(args) ? Kernel::kWord : Kernel::kPadded64x8;
    case 2:
      return internal::CanVectorize(args) &&
                     FullTileFraction(args, 64, 128) >= 0.75
                 ? Kernel::kVector
                 : Kernel::kPadded64x8;
    case 16:
      return internal::CanVectorize(args) ? Kernel::kVector : Kernel::kPadded32;
    default:
      if (FullTileFraction(args, 64, 64) < 0.9) return Kernel::kPadded32;
      return OutputRowsSectorAligned(args) ? Kernel::kPadded64x8
                                           : Kernel::kSkewed;
  }
}

absl::StatusOr<Kernel> KernelFor(Algorithm algorithm,
                                 const TransposeArgs& args) {
  switch (algorithm) {
    case Algorithm::kAuto:
      return AutoKernel(args);
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

}  // namespace

namespace internal {
const char* KernelNameOf(Kernel kernel) {
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
    case Kernel::kVector:
      return "vector";
    case Kernel::kWord:
      return "word";
    case Kernel::kSkewed:
      return "skewed";
  }
  return "unknown";
}
}  // namespace internal

namespace {

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat(
      "%s: %s (%s)", what, cudaGetErrorString(error), cudaGetErrorName(error)));
}

}  // namespace

absl::Span<const absl::string_view> AllKernelNames() {
  static const auto* const names = [] {
    auto* names = new std::vector<absl::string_view>;
    for (Kernel kernel : internal::kAllKernels)
      names->push_back(internal::KernelNameOf(kernel));
    return names;
  }();
  return *names;
}

absl::string_view KernelName(Algorithm algorithm, const TransposeArgs& args) {
  absl::StatusOr<Kernel> kernel = KernelFor(algorithm, args);
  return kernel.ok() ? internal::KernelNameOf(*kernel) : "unknown";
}

absl::Status CanImplement(Algorithm algorithm, const TransposeArgs& args) {
  if (absl::Status status = CheckArgs(args); !status.ok()) return status;
  absl::StatusOr<Kernel> kernel = KernelFor(algorithm, args);
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
        internal::KernelNameOf(*kernel), shared, args.element_size, device,
        max_shared));
  }
  return absl::OkStatus();
}

absl::Status LaunchTranspose(Algorithm algorithm, const TransposeArgs& args,
                             void* cuda_stream) {
  absl::StatusOr<Kernel> kernel = KernelFor(algorithm, args);
  if (!kernel.ok()) return kernel.status();
  const int error = internal::Launch(*kernel, args, cuda_stream);
  return CudaStatus(
      static_cast<cudaError_t>(error),
      absl::StrFormat("launching %s", internal::KernelNameOf(*kernel)));
}

}  // namespace transpose::kernels
