#include "kernels/gpu_transpose.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda_status.h"
#include "kernels/gpu_launch.h"

namespace transpose::kernels {
namespace {

using internal::Kernel;

absl::StatusOr<Kernel> KernelFor(Algorithm algorithm,
                                 const TransposeArgs& args) {
  switch (algorithm) {
    case Algorithm::kAuto:
      return internal::AutoKernel(args);
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
namespace {

// Fraction of the matrix covered by whole tile_rows x tile_cols tiles.
double FullTileFraction(const TransposeArgs& args, uint64_t tile_rows,
                        uint64_t tile_cols) {
  const double full = static_cast<double>(args.rows / tile_rows * tile_rows) *
                      static_cast<double>(args.cols / tile_cols * tile_cols);
  return full /
         (static_cast<double>(args.rows) * static_cast<double>(args.cols));
}

// Whether the vector kernel takes `args` with most of the matrix in whole
// tiles.
bool VectorTilesMostlyFull(const TransposeArgs& args) {
  if (!CanVectorize(args)) return false;
  const TileShape tile = VectorTileOf(args);
  return FullTileFraction(args, tile.rows, tile.cols) >= 0.75;
}

// Whether every output row starts on a 32-byte sector (given an aligned
// output buffer, as the engine's are).
bool OutputRowsSectorAligned(const TransposeArgs& args) {
  return args.rows * args.element_size % 32 == 0;
}

// Whether AUTO gives small_matrices a matrix the kernel takes (so its size is
// bounded): up to 16 KiB any, past it (a block then holds one matrix) 1-byte
// ones of any shape and 2-byte ones up to 32 KiB with an odd row or column
// count. On the H200 (explore38, explore39) 1-byte matrices of 32 to 128 KiB
// read 55-97% of memcpy there against 31-47% for the tiles (180 x 180, whose
// gathers fall on two banks, the 55%), 2-byte 127 x 129 and 126 x 129 (32 KiB)
// 101-106% against 62-66%; but 2-byte 255 x 257 (128 KiB) 64% against 70%,
// 200 x 300 (117 KiB, even both ways: the gathers fall on one bank) 39%
// against 71%, and 4-byte 127 x 129 (64 KiB) 88% against 96%.
bool SmallMatricesSuitAuto(const TransposeArgs& args) {
  const uint64_t bytes = args.rows * args.cols * args.element_size;
  if (bytes <= internal::kSmallMatricesSharedBytes) return true;
  if (args.element_size == 1) return true;
  return args.element_size == 2 && bytes <= (32 << 10) &&
         (args.rows % 2 == 1 || args.cols % 2 == 1);
}

// Whether AUTO gives a 1- or 2-byte matrix that neither the vector kernel
// (with mostly full tiles) nor the word kernel takes to the skewed kernel:
// from 5.5 MiB (1-byte), 16 MiB (2-byte, output rows not sector-aligned) or
// 32 MiB (2-byte, sector-aligned), with at least 768 (1-byte) or 1024 (2-byte)
// rows, the length of its output rows, along which its windows run. On the
// H200 (transpose_bench --shape, docs/BENCHMARKS.md attempt 37), GB/s of
// skewed against the better padded tile: 1-byte 2505 x 2507 (6 MiB) +8%, 2401
// x 2403 (5.5 MiB) +2%, 16385 x 383 +20%, 98305 x 64 +23%, 400009 x 33 +60%,
// 4096 x 4097 (16 MiB, output rows on sectors: padded_64x8 stores a byte per
// thread either way) +38%, 8192 x 8191 +93%, 900 x 9321 +11%, 767 x 10937
// +2%, but 2291 x 2289 (5 MiB) -4 to -7% and 2047 x 2049 (4 MiB) -14%; 2-byte
// 3203 x 3205 (20 MiB) +6%, 65537 x 129 +24%, 2897 x 2899 (16 MiB) and 8191 x
// 1025 within 1%, 1025 x 8191 -2%, but 2505 x 2507 (12 MiB) -7%, 16385 x 255 (8
// MiB) -9%; on sectors 8192 x 8191 (128 MiB) +18%, 4096 x 8191 +13%, 4096 x
// 4097 (32 MiB) +1-2%, but 2048 x 4097 (16 MiB) -10%; 511 x 16385 -20%.
bool SkewedSuitsAuto(const TransposeArgs& args) {
  const uint64_t min_rows = args.element_size == 1 ? 768 : 1024;
  const uint64_t min_bytes = args.element_size == 1          ? 11 << 19
                             : OutputRowsSectorAligned(args) ? 32 << 20
                                                             : 16 << 20;
  return args.bytes() >= min_bytes && args.rows >= min_rows;
}

// Whether AUTO gives the thin kernel a matrix with k = min(rows, columns) at
// most kThinMaxK: up to 20 of any element size; with N at least 4096, up to 32
// columns (N x k, the output its k runs) of elements up to 8 bytes and up to 31
// rows (k x N) of elements up to 4 bytes, 32 of 1-byte ones. On the H200
// (docs/BENCHMARKS.md, attempt 38), % of memcpy against the best other kernel,
// for matrices of 64 MiB: k = 2 to 16 either way, 53-71% (1-byte), 74-101%
// (2-byte), 96-108% (4-byte), 99-109% (8-byte) and 102-110% (16-byte), against
// at most 22%, 47%, 66%, 96% and 96% (4-byte N x 3 17%, 3 x N 24%), and since
// attempts 39 and 40 1- and 2-byte k = 2 to 4 88-100% (1-byte 4 x N 88%),
// since attempt 41 1-byte k = 5 to 8 74-90% and 2-byte 8 x N 87%; k =
// 20, 8-byte 20 x N 103% against 100%, 16-byte 105% against 100%, 16-byte N x
// 20 102% against 99%. N x 24 to N x 32: 1-byte 59-64% against 32-39%, 2-byte
// 83-90% against 65-81%, 4-byte 91-97% against 76-80%, 8-byte 95-97% against
// 91-94%, but 16-byte 96-100% against 100-104%. 24 x N to 31 x N: 1-byte 47-51%
// against 22-28%, 2-byte 67-71% against 43-56%, 4-byte 91-93% against 77-88%,
// but 8- and 16-byte 93-98% against 101-107%; 32 x N, whose 32 x 32 tiles are
// full: 1-byte 48% against 40%, but 2-byte 65% against 72%, 4-byte 91% against
// 100%.
bool ThinSuitsAuto(const TransposeArgs& args) {
  const uint64_t k = std::min(args.rows, args.cols);
  if (k <= 20) return true;
  // Past 20 only with rows of several spans (all measured had 135301 or more):
  // batches of 32 x 32 or 64 x 32 matrices fill their tiles, and would leave
  // most of a thin block's span empty.
  constexpr uint64_t kMinLongSide = 4096;
  if (k > 32 || std::max(args.rows, args.cols) < kMinLongSide) return false;
  if (args.cols == k && args.element_size <= 8) return true;
  return args.element_size == 1 || (args.element_size <= 4 && k < 32);
}

// The padded tile AUTO gives a 1- or 2-byte matrix no other kernel suits: the
// 32 x 32 tile below 16 MiB and where most 64 x 64 tiles would be partial (as
// for 4- and 8-byte elements), the 64 x 64 tile otherwise. On the H200 (attempt
// 37): 1-byte 2047 x 2049 87% of memcpy against padded_64x8's 83%, 2-byte
// 1023 x 1025 127% against 110%, 2-byte batches of 126 x 130 (12 MiB) 82%
// against 73% and of 255 x 257 (25 MiB) 78% against 74%; but 2-byte 2048 x 4097
// (16 MiB) 75% against 81%, 1023 x 16385 74% against 76%.
Kernel PaddedTileBySize(const TransposeArgs& args) {
  return args.bytes() < (16 << 20) || FullTileFraction(args, 64, 64) < 0.9
             ? Kernel::kPadded32
             : Kernel::kPadded64x8;
}

}  // namespace

// AUTO's pick, from transpose_bench on the H200 (docs/BENCHMARKS.md): for
// matrices of at most 16 KiB (some larger: SmallMatricesSuitAuto) that 32 x 32
// tiles would leave mostly partial (batches of 63 x 65, 31 x 33, 15 x 17), the
// whole matrices in shared memory
// (run68: 4-byte 63 x 65 91% of memcpy and 15 x 17 112%, against 77% and 42%
// for padded_32; 31 x 33 1-byte 96% against 20%, 2-byte 106% against 39%,
// 8-byte 110% against 106%, 16-byte 118% against 111%: attempts 32 to 34;
// 2-byte 90 x 91 99% against padded_64x8's 48%), but not 1- and 2-byte
// matrices the vector kernel's tiles mostly cover (its 64 x 64 2-byte tiles
// read 101% on batches of 64 x 64, small_matrices 68%).
// Then, for matrices with few rows or columns (ThinSuitsAuto), the thin
// kernel. Otherwise the vector kernel for 1- and 2-byte elements where its
// 16-byte accesses are possible and its tiles mostly full (else the word kernel
// for bytes, then the skewed kernel for large matrices, SkewedSuitsAuto, then a
// padded tile, PaddedTileBySize; a batch of 64 x 64 2-byte matrices gets 64 x
// 64 tiles), and for 16-byte elements wherever its accesses are possible. For
// 4- and 8-byte elements: where most 64 x 64 tiles would be partial (small odd
// matrices, often batched), the 32 x 32 tile, which wastes less (4-byte batches
// of 63 x 65 to 511 x 513: 87-100% of memcpy, against 74-94% for the 64 x 64
// tile and 30-80% for the skewed kernel, whose edge tiles take its slow path);
// otherwise the skewed kernel for output rows that are not sector-aligned and
// the padded 64 x 64 tile with 64 x 8 threads for those that are.
Kernel AutoKernel(const TransposeArgs& args) {
  if (TakesSmallMatrices(args) && SmallMatricesSuitAuto(args) &&
      FullTileFraction(args, 32, 32) < 0.9 &&
      !(args.element_size <= 2 && VectorTilesMostlyFull(args))) {
    return Kernel::kSmallMatrices;
  }
  if (ThinSuitsAuto(args)) return Kernel::kThin;
  switch (args.element_size) {
    case 1:
      if (VectorTilesMostlyFull(args)) return Kernel::kVector;
      if (internal::CanUseWords(args)) return Kernel::kWord;
      return SkewedSuitsAuto(args) ? Kernel::kSkewed : PaddedTileBySize(args);
    case 2:
      if (VectorTilesMostlyFull(args)) return Kernel::kVector;
      return SkewedSuitsAuto(args) ? Kernel::kSkewed : PaddedTileBySize(args);
    case 16:
      return internal::CanVectorize(args) ? Kernel::kVector : Kernel::kPadded32;
    default:
      if (FullTileFraction(args, 64, 64) < 0.9) return Kernel::kPadded32;
      return OutputRowsSectorAligned(args) ? Kernel::kPadded64x8
                                           : Kernel::kSkewed;
  }
}

// AUTO's tuning, from transpose_bench on the H200 (docs/BENCHMARKS.md,
// attempts 28 and 30; docs/results/transpose_bench_h200_2026-12-02.md, each
// run timed from an L2 holding none of its data), against the default
// column-major walk with plain loads:
// - Evict-last input for the vector kernel and padded_64x8 from a 64 MiB
//   matrix: 1.1 to 2.5 points more from 64 MiB up (4-byte 4096² 96.9 ->
//   99.0%, 1-byte 8192² 95.3 -> 96.8%, 2-byte 8192² 95.0 -> 96.5%, 4-byte
//   4096 x (64 x 64) 98.8 -> 101.3%), -0.5 to +1.3 at 32 MiB (2-byte 4096²
//   gained 1.3 in one run and nothing in another). (The older timing let each
//   run's dirty output lines spill into the next, and put the threshold at
//   128 MiB.)
//   Not measured for 1-byte elements on other kernels; the word kernel gained
//   nothing from it.
// - Groups of tile rows for 16-byte elements where input and output rows are
//   both 128 KiB long (8192²): narrow column bands of such rows read 7-11%
//   slower than wide ones (attempts 14 and 15), and the groups' wider read
//   bands gain more than their shorter write runs cost: 96.2% against 93.2%
//   for evict-last alone. 8-byte 16384², whose rows are 128 KiB too, reads
//   within 0.2 points either way in full runs (94.6% with groups, 94.5%
//   without) and, in the twenty-fourth session's runs, 96.9-97.0% without
//   them run alone, against 94.4% with them, so it walks whole tile columns.
//   Elsewhere the groups lose up to 14 points, or gain under half a point
//   (2-byte 16 x 2048² and 4096 x (64 x 64) in one run, after losing 2 in
//   another).
Tuning AutoTuning(Kernel kernel, const TransposeArgs& args) {
  Tuning tuning;
  // Measured for 1-byte elements on the vector kernel only.
  if (!SupportsTuning(kernel) ||
      (args.element_size == 1 && kernel != Kernel::kVector)) {
    return tuning;
  }
  constexpr uint64_t kEvictLastFromBytes = uint64_t{64} << 20;
  constexpr uint64_t kGroupedRowBytes = uint64_t{128} << 10;
  tuning.input_evict_last = args.bytes() >= kEvictLastFromBytes;
  tuning.grouped_tile_rows =
      args.element_size == 16 &&
      args.cols * args.element_size == kGroupedRowBytes &&
      args.rows * args.element_size == kGroupedRowBytes;
  return tuning;
}

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
    case Kernel::kSmallMatrices:
      return "small_matrices";
    case Kernel::kThin:
      return "thin";
  }
  return "unknown";
}
}  // namespace internal

using internal::CudaStatus;

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
  if (absl::Status status = CheckFitsDevice(algorithm, args, max_shared);
      !status.ok()) {
    return absl::Status(status.code(), absl::StrFormat("device %d: %s", device,
                                                       status.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckFitsDevice(Algorithm algorithm, const TransposeArgs& args,
                             size_t max_shared_bytes) {
  absl::StatusOr<Kernel> kernel = KernelFor(algorithm, args);
  if (!kernel.ok()) return kernel.status();
  const size_t shared = internal::SharedMemoryBytes(*kernel, args.element_size);
  if (shared > max_shared_bytes) {
    return absl::UnimplementedError(absl::StrFormat(
        "kernel %s needs %d bytes of shared memory per block for %d-byte "
        "elements; the device has %d",
        internal::KernelNameOf(*kernel), shared, args.element_size,
        max_shared_bytes));
  }
  // Row tiles go along the grid's x, at most 2^31 - 1 of them, and no kernel's
  // tiles are fewer than 32 rows.
  constexpr uint64_t kMaxRows = uint64_t{32} * 0x7fffffff;
  if (args.rows > kMaxRows) {
    return absl::UnimplementedError(absl::StrFormat(
        "%d rows are more than a launch grid takes (%d)", args.rows, kMaxRows));
  }
  return absl::OkStatus();
}

absl::Status LaunchTranspose(Algorithm algorithm, const TransposeArgs& args,
                             void* cuda_stream) {
  if (absl::Status status = CheckArgs(args); !status.ok()) return status;
  absl::StatusOr<Kernel> kernel = KernelFor(algorithm, args);
  if (!kernel.ok()) return kernel.status();
  const internal::Tuning tuning = algorithm == Algorithm::kAuto
                                      ? internal::AutoTuning(*kernel, args)
                                      : internal::Tuning{};
  const int error = internal::Launch(*kernel, args, cuda_stream, tuning);
  return CudaStatus(
      static_cast<cudaError_t>(error),
      absl::StrFormat("launching %s", internal::KernelNameOf(*kernel)));
}

}  // namespace transpose::kernels
