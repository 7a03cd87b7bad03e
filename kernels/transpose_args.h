// What every transpose (GPU or CPU) takes: element size, shape and two
// non-overlapping buffers.
#ifndef TRANSPOSE_KERNELS_TRANSPOSE_ARGS_H_
#define TRANSPOSE_KERNELS_TRANSPOSE_ARGS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace transpose::kernels {

// The kernels a caller can ask for by name. The numbers equal the API's
// Algorithm numbers.
enum class Algorithm : int {
  // The fastest correct kernel for the element size and shape.
  kAuto = 0,
  // Coalesced reads, strided writes: each warp's 32 writes land in 32 different
  // cache lines.
  kNaive = 1,
  // Shared-memory tile without padding: coalesced both ways, but reading a tile
  // column hits one
  // bank 32 times.
  kShared = 2,
  // tile[32][33], 32x8 threads (Harris): the padding column spreads a tile
  // column over all banks.
  kPadded32 = 3,
  // tile[64][65], 64x16 threads: the same with more bytes moved per block.
  kPadded64 = 4,
};

// Every algorithm, kAuto first.
absl::Span<const Algorithm> AllAlgorithms();

// "auto", "naive", "shared", "padded_32", "padded_64"; "unknown" outside the
// enum.
absl::string_view AlgorithmName(Algorithm algorithm);

// Transposes `batch` row-major rows x cols matrices at `input` into `batch`
// row-major cols x rows matrices at `output`. Both buffers hold
// batch*rows*cols*element_size bytes and must not overlap.
struct TransposeArgs {
  size_t element_size = 0;  // 1, 2, 4, 8 or 16.
  uint64_t batch = 1;
  uint64_t rows = 0;
  uint64_t cols = 0;
  const void* input = nullptr;
  void* output = nullptr;

  uint64_t elements() const { return batch * rows * cols; }
  uint64_t bytes() const { return elements() * element_size; }
};

// OK when the element size, batch, rows and cols of `args` are ones any
// backend can run: a supported element size, non-zero dimensions whose byte
// size fits in 64 bits. The buffers are not looked at.
absl::Status CheckShape(const TransposeArgs& args);

// OK when `args` describes a transpose any backend can run: a supported element
// size, non-zero dimensions whose byte size fits in 64 bits, non-null and
// non-overlapping buffers aligned to their elements (16-byte elements to 16
// bytes): the backends read and write them as typed elements.
absl::Status CheckArgs(const TransposeArgs& args);

// OK when `buffer` (named `what` in the error) is aligned to
// `element_size`-byte elements.
absl::Status CheckAligned(absl::string_view what, const void* buffer,
                          uint64_t element_size);

}  // namespace transpose::kernels

#endif  // TRANSPOSE_KERNELS_TRANSPOSE_ARGS_H_
