// The boundary between the nvcc-compiled kernels and the host library that
// wraps them in absl::Status (the .cu files return plain cudaError_t values).
// Internal to kernels/ and its benchmark.
#ifndef TRANSPOSE_KERNELS_GPU_LAUNCH_H_
#define TRANSPOSE_KERNELS_GPU_LAUNCH_H_

#include <cstddef>
#include <cstdint>

#include "kernels/transpose_args.h"

namespace transpose::kernels::internal {

// Identifies one compiled kernel family.
enum class Kernel : int {
  kNaive,
  kShared,
  kPadded32,
  kPadded64,
  // tile[64][65] with 64x8 threads: each thread moves 8 elements, more loads in
  // flight per warp.
  kPadded64x8,
  // 16-byte chunks both ways, 1- to 16-byte elements (1-byte ones through 4 x 4
  // byte blocks in registers); needs CanVectorize.
  kVector,
  // 4 x 4 byte blocks transposed in registers (1-byte elements); needs
  // CanUseWords.
  kWord,
  // Output windows shifted per row to start on 32-byte sectors, for output
  // rows that are not sector-aligned (1- and 2-byte elements moved in words
  // both ways); needs CanSkew.
  kSkewed,
  // Whole matrices staged in shared memory, one side of the transpose copied
  // in 16-byte units: batches of small matrices that tiles would leave mostly
  // partial; needs TakesSmallMatrices.
  kSmallMatrices,
  // k short rows of N elements staged in shared memory, the other side one
  // contiguous run: matrices with at most kThinMaxK rows or columns (N x 3
  // points and their 3 x N coordinates); needs TakesThin.
  kThin,
};

// Every kernel, in the order tables list them.
inline constexpr Kernel kAllKernels[] = {
    Kernel::kNaive,    Kernel::kShared,     Kernel::kPadded32,
    Kernel::kPadded64, Kernel::kPadded64x8, Kernel::kVector,
    Kernel::kWord,     Kernel::kSkewed,     Kernel::kSmallMatrices,
    Kernel::kThin};

// The kernel's name, as metrics label it ("padded_64x8").
const char* KernelNameOf(Kernel kernel);

// Whether kVector can run `args`: rows and columns whose byte lengths are
// multiples of 16, and 16-byte aligned buffers.
bool CanVectorize(const TransposeArgs& args);
// The vector kernel's tile for `args`, in elements: it depends on the element
// size, and for 2-byte elements on whether the matrix is narrower than the
// usual tile.
struct TileShape {
  uint64_t rows, cols;
};
TileShape VectorTileOf(const TransposeArgs& args);
// Whether kWord can run `args`: 1-byte elements, rows and columns multiples of
// 4, 4-byte aligned buffers.
bool CanUseWords(const TransposeArgs& args);
// Whether kSkewed can run `args`: 1-, 2-, 4- or 8-byte elements.
bool CanSkew(const TransposeArgs& args);
// Whether kSmallMatrices can run `args`: one matrix fits
// kSmallMatricesMaxBytes.
bool TakesSmallMatrices(const TransposeArgs& args);
// Each block takes as many matrices as fit kSmallMatricesSharedBytes, or one
// of at most kSmallMatricesMaxBytes, whose block then holds at most 48 KiB of
// shared memory, what every device gives a block without opting in.
inline constexpr size_t kSmallMatricesSharedBytes = 16 << 10;
inline constexpr size_t kSmallMatricesMaxBytes = (48 << 10) - 32;
// Whether kThin can run `args`: at most kThinMaxK rows or columns.
bool TakesThin(const TransposeArgs& args);
inline constexpr uint64_t kThinMaxK = 64;
// Shared memory a thin block holds, at most: what every device gives a block
// without opting in.
inline constexpr uint32_t kThinMaxSharedBytes = 48 << 10;

// How a kernel walks its tiles and loads its input; AUTO picks it per shape
// (kernels/gpu_transpose.cc). Only the tunable kernels take it
// (SupportsTuning); the others run the default.
struct Tuning {
  // Groups of kTileRowGroup tile rows, each walked column by column, instead
  // of whole tile columns one after another.
  bool grouped_tile_rows = false;
  // Input loads marked evict-last in L2. The marks outlive the kernel: the
  // lines stay evict-last until they are evicted anyway, reset, or read
  // again with another property.
  bool input_evict_last = false;

  bool operator==(const Tuning& other) const {
    return grouped_tile_rows == other.grouped_tile_rows &&
           input_evict_last == other.input_evict_last;
  }
};
inline constexpr int kTileRowGroup = 32;

// Every tuning, in the order tables list them.
inline constexpr Tuning kAllTunings[] = {
    {false, false}, {false, true}, {true, false}, {true, true}};

// "column-major", "column-major, evict-last input", "groups of 32 tile rows",
// "groups of 32 tile rows, evict-last input".
const char* TuningNameOf(const Tuning& tuning);

// The kernel AUTO picks for `args`, and the tuning it launches it with
// (gpu_transpose.cc).
Kernel AutoKernel(const TransposeArgs& args);
Tuning AutoTuning(Kernel kernel, const TransposeArgs& args);

// Whether `kernel` runs tunings other than the default: padded_64x8, vector
// and word.
bool SupportsTuning(Kernel kernel);

// Dynamic shared memory `kernel` needs per block for `element_size`-byte
// elements.
size_t SharedMemoryBytes(Kernel kernel, size_t element_size);

// Testing only: launches a kernel that writes to an invalid address, leaving
// the context with a sticky cudaErrorIllegalAddress.
int LaunchFaultForTesting(void* stream);

// Testing only: launches a one-thread kernel that runs for `seconds` doing
// nothing, as a hung kernel would (a device that stops answering).
int LaunchSpinForTesting(void* stream, double seconds);

// Launches `kernel` with `tuning` on `stream`; returns the cudaError_t of the
// launch as an int (0 on success; cudaErrorInvalidValue for a tuning the kernel
// does not support).
int Launch(Kernel kernel, const TransposeArgs& args, void* stream,
           const Tuning& tuning = {});

}  // namespace transpose::kernels::internal

#endif  // TRANSPOSE_KERNELS_GPU_LAUNCH_H_
