// The tiling driver of the CPU transpose, shared by the portable and the AVX2
// translation units: each compiles it with its own micro-kernels. Internal to
// kernels/.
#ifndef TRANSPOSE_KERNELS_CPU_TRANSPOSE_TILES_H_
#define TRANSPOSE_KERNELS_CPU_TRANSPOSE_TILES_H_

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu_transpose.h"
#include "kernels/transpose_args.h"

namespace transpose::kernels::internal {

struct alignas(16) Element16 {
  uint64_t lo, hi;
};

// Element by element, for edges and the portable build.
template <typename T>
inline void TransposeScalar(const T* in, uint64_t in_stride, T* out,
                            uint64_t out_stride, uint64_t rows, uint64_t cols) {
  for (uint64_t c = 0; c < cols; ++c) {
    for (uint64_t r = 0; r < rows; ++r)
      out[c * out_stride + r] = in[r * in_stride + c];
  }
}

// Transposes every matrix of `args` through square blocks of one cache line's
// worth of rows and columns (kEdge = 64 / sizeof(T) elements a side). A block's
// kEdge input lines are read whole into a local buffer, transposed there by
// Micro::Block in registers, and written out as kEdge whole output lines by
// Micro::StoreLine, with streaming stores when the output is large and its rows
// are line-aligned. Reading whole lines at once matters: with power-of-two row
// strides, all rows of a block fall into one cache set, so a half-read line
// would be evicted before its second half is used. Threads take strips of kEdge
// input rows and walk them left to right, so reads are sequential. Edges
// narrower than a block go element by element.
// Only input rows [first_row, last_row) are transposed, counted across the
// batch (row r of matrix b is b * rows + r); both bounds are multiples of
// kCpuRowGranule or ends of a matrix.
template <typename T, typename Micro>
void TransposeBlocks(const TransposeArgs& args, uint64_t first_row,
                     uint64_t last_row, int threads) {
  constexpr uint64_t kLine = 64;
  constexpr uint64_t kEdge = kLine / sizeof(T);
  constexpr uint64_t kBlock = Micro::kBlock;
  static_assert(kEdge % kBlock == 0);
  // Streaming stores bypass the cache: a win when the output will not be read
  // soon, as a large matrix's will not; a loss for small results about to be
  // sent.
  constexpr uint64_t kStreamMinBytes = uint64_t{8} << 20;
  const uint64_t rows = args.rows;
  const uint64_t cols = args.cols;
  static_assert(kCpuRowGranule % kEdge == 0);
  const uint64_t strips = (rows + kEdge - 1) / kEdge;
  // Strips are numbered across the batch, so a row range is a strip range.
  const int64_t first_strip = static_cast<int64_t>(first_row / rows * strips +
                                                   first_row % rows / kEdge);
  const uint64_t last = last_row - 1;
  const int64_t end_strip = static_cast<int64_t>(last / rows * strips +
                                                 (last % rows + kEdge) / kEdge);
  const T* in = static_cast<const T*>(args.input);
  T* out = static_cast<T*>(args.output);
  const bool stream = args.bytes() >= kStreamMinBytes &&
                      reinterpret_cast<uintptr_t>(out) % kLine == 0 &&
                      (rows * sizeof(T)) % kLine == 0;
  const uint64_t c_full = cols / kEdge * kEdge;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    alignas(64) T block_in[kEdge * kEdge];
    alignas(64) T block_out[kEdge * kEdge];
#pragma omp for schedule(static)
    for (int64_t t = first_strip; t < end_strip; ++t) {
      const uint64_t b = static_cast<uint64_t>(t) / strips;
      const uint64_t r0 = static_cast<uint64_t>(t) % strips * kEdge;
      const T* src = in + b * rows * cols;
      T* dst = out + b * rows * cols;
      if (r0 + kEdge > rows) {  // The bottom strip, shorter than a block.
        TransposeScalar(src + r0 * cols, cols, dst + r0, rows, rows - r0, cols);
        continue;
      }
      for (uint64_t c0 = 0; c0 < c_full; c0 += kEdge) {
        for (uint64_t i = 0; i < kEdge; ++i) {
          Micro::LoadLine(block_in + i * kEdge, src + (r0 + i) * cols + c0);
        }
        for (uint64_t c = 0; c < kEdge; c += kBlock) {
          for (uint64_t r = 0; r < kEdge; r += kBlock) {
            Micro::Block(block_in + r * kEdge + c, kEdge,
                         block_out + c * kEdge + r, kEdge);
          }
        }
        for (uint64_t j = 0; j < kEdge; ++j) {
          Micro::StoreLine(dst + (c0 + j) * rows + r0, block_out + j * kEdge,
                           stream);
        }
      }
      TransposeScalar(src + r0 * cols + c_full, cols, dst + c_full * rows + r0,
                      rows, kEdge, cols - c_full);
    }
    if (stream) Micro::Fence();
  }
}

// Runs TransposeBlocks with Micros<T> for the element size of `args`.
template <template <typename> class Micros>
void TransposeBySize(const TransposeArgs& args, const RowRange& range,
                     int threads) {
  const uint64_t first = range.first, last = range.last;
  switch (args.element_size) {
    case 1:
      TransposeBlocks<uint8_t, Micros<uint8_t>>(args, first, last, threads);
      break;
    case 2:
      TransposeBlocks<uint16_t, Micros<uint16_t>>(args, first, last, threads);
      break;
    case 4:
      TransposeBlocks<uint32_t, Micros<uint32_t>>(args, first, last, threads);
      break;
    case 8:
      TransposeBlocks<uint64_t, Micros<uint64_t>>(args, first, last, threads);
      break;
    case 16:
      TransposeBlocks<Element16, Micros<Element16>>(args, first, last, threads);
      break;
  }
}

// Portable micro-kernel: an 8 x 8 block, element by element; lines move with
// memcpy.
template <typename T>
struct ScalarMicro {
  static constexpr uint64_t kBlock = 64 / sizeof(T) < 8 ? 64 / sizeof(T) : 8;
  static void Block(const T* in, uint64_t in_stride, T* out,
                    uint64_t out_stride) {
    TransposeScalar(in, in_stride, out, out_stride, kBlock, kBlock);
  }
  static void LoadLine(T* line, const T* src) { std::memcpy(line, src, 64); }
  static void StoreLine(T* dst, const T* line, bool) {
    std::memcpy(dst, line, 64);
  }
  static void Fence() {}
};

// The portable build's entry point.
void TransposePortable(const TransposeArgs& args, const RowRange& range,
                       int threads);

// Whether this CPU runs the AVX2 build, and that build's entry point.
bool HaveAvx2();
void TransposeAvx2(const TransposeArgs& args, const RowRange& range,
                   int threads);

}  // namespace transpose::kernels::internal

#endif  // TRANSPOSE_KERNELS_CPU_TRANSPOSE_TILES_H_
