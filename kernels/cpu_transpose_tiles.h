// The tiling driver of the CPU transpose, shared by the portable and the AVX2
// translation units: each compiles it with its own micro-kernels. Internal to
// kernels/.
#ifndef TRANSPOSE_KERNELS_CPU_TRANSPOSE_TILES_H_
#define TRANSPOSE_KERNELS_CPU_TRANSPOSE_TILES_H_

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/types/span.h"
#include "kernels/cpu_transpose.h"
#include "kernels/transpose_args.h"

namespace transpose::kernels::internal {
// Each including file compiles its own copy of everything up to the entry
// points, with its own instruction set (-mavx2, -mavx512f or neither): with
// external linkage the copies would share names, and the linker would keep one
// of them for every file, perhaps one built for instructions this CPU lacks.
namespace {

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

// TransposeBlocks' input in one buffer, args.input.
template <typename T>
class ContiguousInput {
 public:
  // Matrices may have edges narrower than a block.
  static constexpr bool kEdges = true;

  explicit ContiguousInput(const TransposeArgs& args)
      : in_(static_cast<const T*>(args.input)), cols_(args.cols) {}

  // Row `row`, counted across the batch.
  const T* Row(uint64_t row) const { return in_ + row * cols_; }

  // The lines of one strip of rows.
  class Strip {
   public:
    static constexpr uint64_t kEdge = 64 / sizeof(T);
    Strip(const T* first_row, uint64_t cols) : first_(first_row), cols_(cols) {}
    // Reads the strip's kEdge lines from column c0 into `block` (kEdge x
    // kEdge).
    template <typename Micro>
    void Load(uint64_t c0, T* block) {
      for (uint64_t i = 0; i < kEdge; ++i) {
        Micro::LoadLine(block + i * kEdge, first_ + i * cols_ + c0);
      }
    }
    // Points lines[i] at the strip's line i from column c0; `scratch` (kEdge x
    // kEdge) is unused here.
    void Lines(uint64_t c0, const T** lines, T* /*scratch*/) {
      for (uint64_t i = 0; i < kEdge; ++i) lines[i] = first_ + i * cols_ + c0;
    }

   private:
    const T* first_;
    uint64_t cols_;
  };
  Strip StartStrip(uint64_t row) const { return Strip(Row(row), cols_); }

 private:
  const T* in_;
  uint64_t cols_;
};

// TransposeBlocks' input in pieces as a transport delivered them (a socket
// read's worth each, with no regard for rows), read where they lie. While
// every row of a strip has its next lines in one piece, lines are read through
// per-row pointers as from one buffer; a line split between two pieces is
// gathered. Only for shapes without edges (CanTransposeFromPieces).
template <typename T>
class PieceInput {
 public:
  static constexpr bool kEdges = false;

  PieceInput(const TransposeArgs& args, absl::Span<const InputPiece> pieces)
      : pieces_(pieces), row_bytes_(args.cols * sizeof(T)) {}

  class Strip {
   public:
    static constexpr uint64_t kLine = 64;
    static constexpr uint64_t kEdge = kLine / sizeof(T);

    Strip(absl::Span<const InputPiece> pieces, uint64_t first_row_offset,
          uint64_t row_bytes) {
      for (uint64_t i = 0; i < kEdge; ++i) {
        row_offset_[i] = first_row_offset + i * row_bytes;
        // The last piece starting at or before the row.
        piece_[i] =
            std::upper_bound(pieces.begin(), pieces.end(), row_offset_[i],
                             [](uint64_t offset, const InputPiece& p) {
                               return offset < p.offset;
                             }) -
            1;
      }
    }

    // Reads the strip's kEdge lines from column c0 into `block` (kEdge x
    // kEdge). Columns only grow.
    template <typename Micro>
    void Load(uint64_t c0, T* block) {
      if (c0 + kEdge > in_place_end_) FindPieces(c0);
      if (c0 + kEdge <= in_place_end_) {
        for (uint64_t i = 0; i < kEdge; ++i) {
          Micro::LoadLine(
              block + i * kEdge,
              reinterpret_cast<const T*>(row_address_[i] + c0 * sizeof(T)));
        }
        return;
      }
      for (uint64_t i = 0; i < kEdge; ++i) {
        Gather(i, c0 * sizeof(T),
               reinterpret_cast<uint8_t*>(block + i * kEdge));
      }
    }

    // Points lines[i] at the strip's line i from column c0, where it lies or,
    // when a piece boundary splits any of them, gathered into `scratch` (kEdge
    // x kEdge). Columns only grow.
    void Lines(uint64_t c0, const T** lines, T* scratch) {
      if (c0 + kEdge > in_place_end_) FindPieces(c0);
      if (c0 + kEdge <= in_place_end_) {
        for (uint64_t i = 0; i < kEdge; ++i) {
          lines[i] =
              reinterpret_cast<const T*>(row_address_[i] + c0 * sizeof(T));
        }
        return;
      }
      for (uint64_t i = 0; i < kEdge; ++i) {
        Gather(i, c0 * sizeof(T),
               reinterpret_cast<uint8_t*>(scratch + i * kEdge));
        lines[i] = scratch + i * kEdge;
      }
    }

   private:
    // Moves each row to the piece holding its line at column c0, and finds
    // how far every row's line can be read in place.
    void FindPieces(uint64_t c0) {
      in_place_end_ = ~uint64_t{0};
      for (uint64_t i = 0; i < kEdge; ++i) {
        const uint64_t at = row_offset_[i] + c0 * sizeof(T);
        while (at >= piece_[i]->offset + piece_[i]->size) ++piece_[i];
        // Where column 0 of the row would be if the piece held all of it: an
        // address only, wrapping below the piece, never dereferenced there.
        row_address_[i] = reinterpret_cast<uintptr_t>(piece_[i]->data) +
                          (row_offset_[i] - piece_[i]->offset);
        in_place_end_ = std::min(
            in_place_end_,
            (piece_[i]->offset + piece_[i]->size - row_offset_[i]) / sizeof(T));
      }
    }

    // Copies row i's line at byte `column_byte` from the pieces it spans.
    void Gather(uint64_t i, uint64_t column_byte, uint8_t* line) {
      const uint64_t at = row_offset_[i] + column_byte;
      const InputPiece* piece = piece_[i];
      while (at >= piece->offset + piece->size) ++piece;
      for (uint64_t done = 0; done < kLine; ++piece) {
        if (piece->size == 0) continue;  // Its data may be null.
        const uint64_t from = at + done - piece->offset;
        const uint64_t n = std::min(kLine - done, piece->size - from);
        std::memcpy(line + done,
                    static_cast<const uint8_t*>(piece->data) + from, n);
        done += n;
      }
    }

    uint64_t row_offset_[kEdge];
    const InputPiece* piece_[kEdge];
    uintptr_t row_address_[kEdge];
    // Columns below this are in place for every row (from FindPieces).
    uint64_t in_place_end_ = 0;
  };
  Strip StartStrip(uint64_t row) const {
    return Strip(pieces_, row * row_bytes_, row_bytes_);
  }

 private:
  absl::Span<const InputPiece> pieces_;
  uint64_t row_bytes_;
};

// Transposes every matrix of `args` through square blocks of one cache line's
// worth of rows and columns (kEdge = 64 / sizeof(T) elements a side), each
// written out as kEdge whole output lines, with streaming stores when the
// output is large and its rows are line-aligned. Two kinds of micro-kernel:
// - Buffered (AVX2, portable): a block's kEdge input lines are read whole into
//   a local buffer, transposed there by Micro::Block in sub-blocks, and stored
//   line by line by Micro::StoreLine.
// - Whole lines (AVX-512, kWholeLines): one register holds a line, so
//   Micro::Tile loads the kEdge lines where they lie, transposes them in
//   registers and stores the result, with no buffer in between.
// Reading whole lines at once matters: with power-of-two row strides, all rows
// of a block fall into one cache set, so a half-read line would be evicted
// before its second half is used. Threads take strips of kEdge input rows (or,
// with fewer strips than threads, parts of strips in whole blocks) and walk
// them left to right, so reads are sequential. Edges narrower than a block
// go element by element. The input comes from `input` (ContiguousInput or
// PieceInput). Only input rows [first_row, last_row) are transposed, counted
// across the batch (row r of matrix b is b * rows + r); both bounds are
// multiples of kCpuRowGranule or ends of a matrix.
template <typename T, typename Micro, typename Input>
void TransposeBlocks(const TransposeArgs& args, uint64_t first_row,
                     uint64_t last_row, int threads, const Input& input) {
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
  T* out = static_cast<T*>(args.output);
  // The size spelled out, not args.bytes(): an inline member function outside
  // this file's unnamed namespace would be compiled here with this build's
  // instruction set and shared with the others (cpu_transpose_symbols_test).
  const uint64_t bytes = args.batch * rows * cols * sizeof(T);
  const bool stream = bytes >= kStreamMinBytes &&
                      reinterpret_cast<uintptr_t>(out) % kLine == 0 &&
                      (rows * sizeof(T)) % kLine == 0;
  const uint64_t c_full = cols / kEdge * kEdge;
  // Short, wide matrices have fewer strips than threads: each strip's
  // columns are split too, in whole blocks, so that every thread has work (an
  // 8-row matrix is one strip).
  const auto strip_count = static_cast<uint64_t>(end_strip - first_strip);
  const uint64_t col_blocks = (cols + kEdge - 1) / kEdge;
  // As many splits as threads: each thread then takes strip_count of them.
  const uint64_t splits =
      strip_count >= static_cast<uint64_t>(threads)
          ? 1
          : std::min(col_blocks, static_cast<uint64_t>(threads));
  const uint64_t split_cols = (col_blocks + splits - 1) / splits * kEdge;
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    alignas(64) T block_in[kEdge * kEdge];
    alignas(64) T block_out[kEdge * kEdge];
#pragma omp for schedule(static)
    for (int64_t w = 0; w < static_cast<int64_t>(strip_count * splits); ++w) {
      const uint64_t t = first_strip + static_cast<uint64_t>(w) / splits;
      const uint64_t c_begin = static_cast<uint64_t>(w) % splits * split_cols;
      const uint64_t c_end = std::min(cols, c_begin + split_cols);
      if (c_begin >= c_end) continue;
      const uint64_t b = t / strips;
      const uint64_t r0 = t % strips * kEdge;
      T* dst = out + b * rows * cols;
      if constexpr (Input::kEdges) {
        if (r0 + kEdge > rows) {  // The bottom strip, shorter than a block.
          TransposeScalar(input.Row(b * rows + r0) + c_begin, cols,
                          dst + c_begin * rows + r0, rows, rows - r0,
                          c_end - c_begin);
          continue;
        }
      }
      typename Input::Strip strip = input.StartStrip(b * rows + r0);
      for (uint64_t c0 = c_begin; c0 < std::min(c_end, c_full); c0 += kEdge) {
        T* const tile_out = dst + c0 * rows + r0;
        if constexpr (Micro::kWholeLines) {
          const T* lines[kEdge];
          strip.Lines(c0, lines, block_in);
          Micro::Tile(lines, tile_out, rows, stream);
        } else {
          strip.template Load<Micro>(c0, block_in);
          for (uint64_t c = 0; c < kEdge; c += kBlock) {
            for (uint64_t r = 0; r < kEdge; r += kBlock) {
              Micro::Block(block_in + r * kEdge + c, kEdge,
                           block_out + c * kEdge + r, kEdge);
            }
          }
          for (uint64_t j = 0; j < kEdge; ++j) {
            Micro::StoreLine(tile_out + j * rows, block_out + j * kEdge,
                             stream);
          }
        }
      }
      if constexpr (Input::kEdges) {
        if (c_end > c_full) {  // The right edge, narrower than a block.
          TransposeScalar(input.Row(b * rows + r0) + c_full, cols,
                          dst + c_full * rows + r0, rows, kEdge, cols - c_full);
        }
      }
    }
    if (stream) Micro::Fence();
  }
}

// Runs TransposeBlocks for element type T, from args.input or, when there are
// any, from `pieces`.
template <typename T, typename Micro>
void TransposeFrom(const TransposeArgs& args, const RowRange& range,
                   int threads, absl::Span<const InputPiece> pieces) {
  if (pieces.empty()) {
    TransposeBlocks<T, Micro>(args, range.first, range.last, threads,
                              ContiguousInput<T>(args));
  } else {
    TransposeBlocks<T, Micro>(args, range.first, range.last, threads,
                              PieceInput<T>(args, pieces));
  }
}

// Runs TransposeBlocks with Micros<T> for the element size of `args`.
template <template <typename> class Micros>
void TransposeBySize(const TransposeArgs& args, const RowRange& range,
                     int threads, absl::Span<const InputPiece> pieces) {
  switch (args.element_size) {
    case 1:
      TransposeFrom<uint8_t, Micros<uint8_t>>(args, range, threads, pieces);
      break;
    case 2:
      TransposeFrom<uint16_t, Micros<uint16_t>>(args, range, threads, pieces);
      break;
    case 4:
      TransposeFrom<uint32_t, Micros<uint32_t>>(args, range, threads, pieces);
      break;
    case 8:
      TransposeFrom<uint64_t, Micros<uint64_t>>(args, range, threads, pieces);
      break;
    case 16:
      TransposeFrom<Element16, Micros<Element16>>(args, range, threads, pieces);
      break;
  }
}

// Portable micro-kernel: an 8 x 8 block, element by element; lines move with
// memcpy.
template <typename T>
struct ScalarMicro {
  static constexpr bool kWholeLines = false;
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

}  // namespace

// The portable build's entry point.
void TransposePortable(const TransposeArgs& args, const RowRange& range,
                       int threads, absl::Span<const InputPiece> pieces);

// Whether this CPU runs the AVX2 build, and that build's entry point.
bool HaveAvx2();
void TransposeAvx2(const TransposeArgs& args, const RowRange& range,
                   int threads, absl::Span<const InputPiece> pieces);

// Whether this CPU runs the AVX-512 build, which takes 4-, 8- and 16-byte
// elements (Avx512Takes), and that build's entry point.
bool HaveAvx512();
bool Avx512Takes(const TransposeArgs& args);
void TransposeAvx512(const TransposeArgs& args, const RowRange& range,
                     int threads, absl::Span<const InputPiece> pieces);

}  // namespace transpose::kernels::internal

#endif  // TRANSPOSE_KERNELS_CPU_TRANSPOSE_TILES_H_
