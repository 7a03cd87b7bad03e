// The transpose kernels. Each block transposes one tile; the host launches
// grids of at most 65535 tile columns and 65535 batch entries at a time, so
// kernels carry no grid-stride loops (they cost registers, and registers cost
// occupancy). Every kernel handles any shape its launcher accepts: a block
// whose tile reaches past the matrix's edge takes a bounds-checked path (the
// branch is uniform across the block), interior tiles run unchecked. Offsets
// are 64-bit.
//
// Blocks walk the tiles in column-major order (blockIdx.x runs down a tile
// column): the blocks in flight together then write whole output rows
// one after another, and scatter their reads instead. Writes scattered over
// DRAM pages cost more than reads: on the H200 this order took 4-byte 16384²
// from 93% to 97% of memcpy and 2-byte 16384² from 88% to 95%. The kernels
// AUTO runs also take a Tuning (gpu_launch.h): groups of tile rows instead of
// whole tile columns, and evict-last input loads.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cuda/annotated_ptr>

#include "kernels/gpu_launch.h"

namespace transpose::kernels::internal {
namespace {

struct alignas(8) Element8 {
  uint32_t lo, hi;
};
struct alignas(16) Element16 {
  uint64_t lo, hi;
};

constexpr uint64_t kMaxGridY = 65535;
constexpr uint64_t kMaxGridZ = 65535;

constexpr uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

// Where a block's tile starts, and how much of it lies inside the matrix.
struct Tile {
  uint64_t row0, col0;
  uint32_t rows, cols;  // In-matrix extent, up to the tile's size.
  uint64_t offset;      // Of the block's matrix in the batch, in elements.
};

// kGroup = 0 walks the tiles column-major (blockIdx.x runs down a tile column,
// blockIdx.y across). kGroup > 0 walks groups of kGroup tile rows, each group
// column by column: the blocks in flight then read wider column bands of
// fewer rows and write shorter runs of more output rows.
template <int kTileRows, int kTileCols, int kGroup = 0>
__device__ __forceinline__ Tile LocateTile(uint64_t rows, uint64_t cols,
                                           uint64_t col_tile0,
                                           uint64_t batch0) {
  uint64_t row_tile = blockIdx.x, col_tile = blockIdx.y;
  if constexpr (kGroup > 0) {
    const uint64_t linear = blockIdx.x + uint64_t{blockIdx.y} * gridDim.x;
    const uint64_t per_group = uint64_t{kGroup} * gridDim.y;
    const uint64_t group = linear / per_group, within = linear % per_group;
    const uint64_t group_rows =
        min(uint64_t{kGroup}, gridDim.x - group * kGroup);
    row_tile = group * kGroup + within % group_rows;
    col_tile = within / group_rows;
  }
  Tile t;
  t.row0 = row_tile * kTileRows;
  t.col0 = (col_tile0 + col_tile) * kTileCols;
  t.rows = static_cast<uint32_t>(min(uint64_t{kTileRows}, rows - t.row0));
  t.cols = static_cast<uint32_t>(min(uint64_t{kTileCols}, cols - t.col0));
  t.offset = (batch0 + blockIdx.z) * rows * cols;
  return t;
}

// A load of the input. With kEvictLast the line is marked evict-last in L2
// (libcu++'s "persisting" property). The input is read once, so nothing is
// kept for reuse; the mark changes which lines L2 evicts first, the output's
// dirty lines, and so when the writes reach DRAM among the reads (measured in
// docs/BENCHMARKS.md, attempt 24). The marked lines stay marked after the
// kernel ends, until evicted.
template <bool kEvictLast, typename T>
__device__ __forceinline__ T LoadInput(const T* p) {
  if constexpr (kEvictLast) {
    return cuda::annotated_ptr<const T, cuda::access_property::persisting>(
        p)[0];
  } else {
    return *p;
  }
}

// Coalesced reads, strided writes: a warp reads one 128-byte line of a row but
// writes 32 elements `rows` apart, one cache line each, so writes run at a
// fraction of DRAM bandwidth.
template <typename T, int kTile, int kBlockRows>
__global__ void __launch_bounds__(kTile* kBlockRows)
    NaiveTranspose(const T* __restrict__ in, T* __restrict__ out, uint64_t rows,
                   uint64_t cols, uint64_t col_tile0, uint64_t batch0) {
  const Tile t = LocateTile<kTile, kTile>(rows, cols, col_tile0, batch0);
  const T* src = in + t.offset + t.row0 * cols + t.col0;
  T* dst = out + t.offset + t.col0 * rows + t.row0;
  const uint32_t c = threadIdx.x;
#pragma unroll
  for (int j = 0; j < kTile; j += kBlockRows) {
    const uint32_t r = threadIdx.y + j;
    if (r < t.rows && c < t.cols) dst[c * rows + r] = src[r * cols + c];
  }
}

// Stages a kTile x kTile tile in shared memory so both the global read and the
// global write are row-contiguous. kPad = 0 is the unpadded lesson: reading a
// tile column touches one bank per element, a 32-way conflict for 4-byte
// elements. kPad = 1 shifts each row by one bank, so a column spans all 32
// banks and the kernel runs near copy speed.
template <typename T, int kTile, int kBlockRows, int kPad, int kGroup = 0,
          bool kEvictLast = false>
__global__ void __launch_bounds__(kTile* kBlockRows)
    TiledTranspose(const T* __restrict__ in, T* __restrict__ out, uint64_t rows,
                   uint64_t cols, uint64_t col_tile0, uint64_t batch0) {
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  T* tile = reinterpret_cast<T*>(shared_bytes);
  constexpr int kStride = kTile + kPad;
  const Tile t =
      LocateTile<kTile, kTile, kGroup>(rows, cols, col_tile0, batch0);
  const T* src = in + t.offset + t.row0 * cols + t.col0;
  T* dst = out + t.offset + t.col0 * rows + t.row0;
  const uint32_t x = threadIdx.x;
  if (t.rows == kTile && t.cols == kTile) {
#pragma unroll
    for (int j = 0; j < kTile; j += kBlockRows) {
      tile[(threadIdx.y + j) * kStride + x] =
          LoadInput<kEvictLast>(src + (threadIdx.y + j) * cols + x);
    }
    __syncthreads();
    // Output row = input column, output column = input row.
#pragma unroll
    for (int j = 0; j < kTile; j += kBlockRows) {
      dst[(threadIdx.y + j) * rows + x] = tile[x * kStride + threadIdx.y + j];
    }
  } else {
#pragma unroll
    for (int j = 0; j < kTile; j += kBlockRows) {
      const uint32_t r = threadIdx.y + j;
      if (r < t.rows && x < t.cols)
        tile[r * kStride + x] = LoadInput<kEvictLast>(src + r * cols + x);
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kTile; j += kBlockRows) {
      const uint32_t c = threadIdx.y + j;
      if (c < t.cols && x < t.rows) dst[c * rows + x] = tile[x * kStride + c];
    }
  }
}

// Transposes the 4 x 4 bytes of four words, one per row: out[k] holds byte k
// of in[0..3], in order.
__device__ __forceinline__ void TransposeBytes4x4(const uint32_t (&in)[4],
                                                  uint32_t (&out)[4]) {
  const uint32_t t0 = __byte_perm(in[0], in[1], 0x5140),
                 t1 = __byte_perm(in[0], in[1], 0x7362);
  const uint32_t t2 = __byte_perm(in[2], in[3], 0x5140),
                 t3 = __byte_perm(in[2], in[3], 0x7362);
  out[0] = __byte_perm(t0, t2, 0x5410);
  out[1] = __byte_perm(t0, t2, 0x7632);
  out[2] = __byte_perm(t1, t3, 0x5410);
  out[3] = __byte_perm(t1, t3, 0x7632);
}

// Row `r`'s 16-byte chunk `chunk` of a shared tile, XOR-swizzled by row group
// so that both the row-wise writes and the column-wise reads of a warp spread
// over all banks without padding.
template <int E>
__device__ __forceinline__ int SwizzledChunk(int r, int chunk) {
  return chunk ^ ((r / E) & 7);
}

// Packs a 16-byte chunk of elements into the four words of one vector store.
__device__ __forceinline__ uint4 Pack(const uint16_t (&e)[8]) {
  return make_uint4(e[0] | uint32_t{e[1]} << 16, e[2] | uint32_t{e[3]} << 16,
                    e[4] | uint32_t{e[5]} << 16, e[6] | uint32_t{e[7]} << 16);
}
__device__ __forceinline__ uint4 Pack(const uint32_t (&e)[4]) {
  return make_uint4(e[0], e[1], e[2], e[3]);
}
__device__ __forceinline__ uint4 Pack(const Element8 (&e)[2]) {
  return make_uint4(e[0].lo, e[0].hi, e[1].lo, e[1].hi);
}
__device__ __forceinline__ uint4 Pack(const Element16 (&e)[1]) {
  return make_uint4(
      static_cast<uint32_t>(e[0].lo), static_cast<uint32_t>(e[0].lo >> 32),
      static_cast<uint32_t>(e[0].hi), static_cast<uint32_t>(e[0].hi >> 32));
}

// P adjacent elements of a tile row, read from shared memory in one load.
template <typename T, int P>
struct alignas(P * sizeof(T)) Adjacent {
  T e[P];
};

// 16-byte global loads and stores both ways for 2-, 4-, 8- and 16-byte
// elements: a thread loads 16-byte chunks of input rows, and stores 16-byte
// chunks of output rows gathered from E = 16 / S input rows, so a warp moves
// 512 bytes per instruction either way, and 2-byte elements no longer cost a
// global instruction each. For each of its E rows a thread reads P adjacent
// elements in one shared load and stores the P output chunks they make:
// 2-byte elements go in pairs (4-byte loads), so 8 shared loads make two
// chunks instead of one; with a load per element that kernel read 89% of
// memcpy at 4096² and 94% at 8192² on the H200, with pairs 95.9-98.8% and
// 95.9-98.5% over five runs (docs/BENCHMARKS.md, attempt 30). A warp stores 32
// chunks: B = 32 P / E chunks of each of E / P output rows per instruction (128
// bytes of 4 rows for 2- and 4-byte elements, 256 of 2 for 8-byte, 512 of 1 for
// 16-byte). Needs rows and columns whose byte lengths are multiples of 16.
template <typename T, int TR, int TC, int NT, int kGroup = 0,
          bool kEvictLast = false>
__global__ void __launch_bounds__(NT)
    VectorTranspose(const T* __restrict__ in, T* __restrict__ out,
                    uint64_t rows, uint64_t cols, uint64_t col_tile0,
                    uint64_t batch0) {
  constexpr int S = sizeof(T);
  constexpr int E = 16 / S;             // Elements per chunk.
  constexpr int CH = TC / E;            // Chunks per tile row.
  constexpr int NV_IN = TR * CH;        // Input chunks per tile.
  constexpr int QN = TR / E;            // Output chunks per output tile row.
  constexpr int P = S == 2 ? 2 : 1;     // Adjacent elements per shared load.
  constexpr int JG = TC / P;            // Groups of P output rows.
  constexpr int NV_OUT = QN * JG / NT;  // Units of P output chunks per thread.
  constexpr int A = E / P, B = 32 / A;  // A warp: A row groups x B chunks.
  static_assert(NV_IN % NT == 0 && (QN * JG) % NT == 0 && QN % B == 0 &&
                JG % A == 0);
  __shared__ __align__(16) uint4 tile[TR * CH];
  T* const elements = reinterpret_cast<T*>(tile);
  const Tile t = LocateTile<TR, TC, kGroup>(rows, cols, col_tile0, batch0);
  const T* src = in + t.offset + t.row0 * cols + t.col0;
  T* dst = out + t.offset + t.col0 * rows + t.row0;
  if (t.rows == TR && t.cols == TC) {
    uint4 v[NV_IN / NT];
#pragma unroll
    for (int i = 0; i < NV_IN / NT;
         ++i) {  // Every load in flight before the first store.
      const int idx = threadIdx.x + i * NT, r = idx / CH, ch = idx % CH;
      v[i] = LoadInput<kEvictLast>(
          reinterpret_cast<const uint4*>(src + r * cols + ch * E));
    }
#pragma unroll
    for (int i = 0; i < NV_IN / NT; ++i) {
      const int idx = threadIdx.x + i * NT, r = idx / CH, ch = idx % CH;
      tile[r * CH + SwizzledChunk<E>(r, ch)] = v[i];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < NV_OUT; ++i) {
      // Lanes: A groups of P output rows, then B chunks along them. Each
      // phase of a warp's shared load then reads distinct banks: 4-byte loads
      // (2- and 4-byte elements) 32 words of the warp, 8-byte loads 16 pairs
      // of a half-warp, 16-byte loads 8 chunks of a quarter-warp.
      const int unit = threadIdx.x + i * NT, rest = unit / 32;
      const int j0 = ((rest % (JG / A)) * A + unit % A) * P;
      const int q = (rest / (JG / A)) * B + (unit / A) % B;
      Adjacent<T, P> a[E];
#pragma unroll
      for (int k = 0; k < E; ++k) {
        const int r = q * E + k;
        a[k] = *reinterpret_cast<const Adjacent<T, P>*>(
            elements + (r * CH + SwizzledChunk<E>(r, j0 / E)) * E + j0 % E);
      }
#pragma unroll
      for (int p = 0; p < P; ++p) {
        T e[E];
#pragma unroll
        for (int k = 0; k < E; ++k) e[k] = a[k].e[p];
        // An explicit 16-byte store: the compiler cannot prove the address
        // aligned and would otherwise split it into E narrow stores.
        __stwb(reinterpret_cast<uint4*>(dst + (j0 + p) * rows + q * E),
               Pack(e));
      }
    }
  } else {
    for (int idx = threadIdx.x; idx < TR * TC; idx += NT) {
      const int r = idx / TC, c = idx % TC;
      if (r < t.rows && c < t.cols) {
        elements[(r * CH + SwizzledChunk<E>(r, c / E)) * E + c % E] =
            LoadInput<kEvictLast>(src + r * cols + c);
      }
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < TR * TC; idx += NT) {
      const int j = idx / TR, r = idx % TR;
      if (r < t.rows && j < t.cols) {
        dst[j * rows + r] =
            elements[(r * CH + SwizzledChunk<E>(r, j / E)) * E + j % E];
      }
    }
  }
}

// The vector kernel for 1-byte elements: 16-byte accesses both ways, the
// transpose done on 4 x 4 byte blocks in registers (__byte_perm). A thread
// loads 16-byte chunks of input rows into the shared tile; then, for one
// 4-byte column of 16 input rows, reads those 16 words, transposes their four
// 4 x 4 blocks and stores 16-byte chunks of 4 output rows. The word kernel's
// 4-byte accesses read 87-89% of memcpy at 8192² and 16384² on the H200; this
// 96-98% (docs/BENCHMARKS.md, attempt 28). Tile: TR rows x TW words (4 TW
// bytes); QG = TR / 16 row groups, one per lane in a group of QG lanes, so a
// warp's store covers 32 / QG output rows x TR bytes. Shared words are
// XOR-swizzled by row group in steps of 32 / QG words: 16-byte chunks stay
// whole, and a warp's column reads fall on 32 different banks. Needs rows and
// columns that are multiples of 16; `rows` and `cols` count bytes.
template <int TR, int TW, int NT, int kGroup = 0, bool kEvictLast = false>
__global__ void __launch_bounds__(NT)
    VectorTransposeBytes(const uint8_t* __restrict__ in,
                         uint8_t* __restrict__ out, uint64_t rows,
                         uint64_t cols, uint64_t col_tile0, uint64_t batch0) {
  constexpr int TC = TW * 4, CH = TW / 4, QG = TR / 16, WL = 32 / QG;
  constexpr int kLoads = TR * CH / NT, kUnits = TW * QG / NT;
  static_assert(QG <= 8 && TW % 32 == 0 && (TR * CH) % NT == 0 &&
                (TW * QG) % NT == 0);
  __shared__ __align__(16) uint32_t tile[TR * TW];
  // Row r's swizzle: its row group's step.
  const auto swizzle = [](int r) { return ((r / 16) % QG) * WL; };
  const Tile t = LocateTile<TR, TC, kGroup>(rows, cols, col_tile0, batch0);
  const uint8_t* src = in + t.offset + t.row0 * cols + t.col0;
  uint8_t* dst = out + t.offset + t.col0 * rows + t.row0;
  if (t.rows == TR && t.cols == TC) {
    uint4 v[kLoads];
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {  // Every load in flight first.
      const int idx = threadIdx.x + i * NT, r = idx / CH, ch = idx % CH;
      v[i] = LoadInput<kEvictLast>(
          reinterpret_cast<const uint4*>(src + r * cols) + ch);
    }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int idx = threadIdx.x + i * NT, r = idx / CH, ch = idx % CH;
      reinterpret_cast<uint4*>(tile + r * TW)[(ch * 4 ^ swizzle(r)) / 4] = v[i];
    }
    __syncthreads();
#pragma unroll
    for (int u = 0; u < kUnits; ++u) {
      const int unit = threadIdx.x + u * NT, q = unit % QG, w = unit / QG;
      const int column = w ^ (q * WL);  // Every row of group q: swizzle(r).
      uint32_t o[4][4];  // o[k][m]: output row 4w + k, input rows 16q + 4m...
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        uint32_t a[4], b[4];
#pragma unroll
        for (int k = 0; k < 4; ++k)
          a[k] = tile[(q * 16 + m * 4 + k) * TW + column];
        TransposeBytes4x4(a, b);
#pragma unroll
        for (int k = 0; k < 4; ++k) o[k][m] = b[k];
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        __stwb(reinterpret_cast<uint4*>(dst + (w * 4 + k) * rows + q * 16),
               make_uint4(o[k][0], o[k][1], o[k][2], o[k][3]));
      }
    }
  } else {
    // An edge tile, a byte at a time through the same layout.
    uint8_t* const bytes = reinterpret_cast<uint8_t*>(tile);
    const auto at = [&swizzle](int r, int c) {
      return (r * TW + ((c / 4) ^ swizzle(r))) * 4 + c % 4;
    };
    for (int idx = threadIdx.x; idx < TR * TC; idx += NT) {
      const int r = idx / TC, c = idx % TC;
      if (r < t.rows && c < t.cols)
        bytes[at(r, c)] = LoadInput<kEvictLast>(src + r * cols + c);
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < TR * TC; idx += NT) {
      const int j = idx / TR, r = idx % TR;
      if (r < t.rows && j < t.cols) dst[j * rows + r] = bytes[at(r, j)];
    }
  }
}

// 1-byte elements as 4-byte words: a thread reads 4 words from 4 consecutive
// rows of the shared tile and transposes that 4 x 4 byte block in registers
// (__byte_perm), so every global and shared access moves a word instead of a
// byte. Shared words are XOR-swizzled by row group. Needs rows and columns that
// are multiples of 4; `rows` and `cols` here count bytes.
template <int TR, int TW, int NT, int kGroup = 0, bool kEvictLast = false>
__global__ void __launch_bounds__(NT)
    WordTranspose(const uint32_t* __restrict__ in, uint32_t* __restrict__ out,
                  uint64_t rows, uint64_t cols, uint64_t col_tile0,
                  uint64_t batch0) {
  constexpr int G = TR / 4;  // Row groups = output words per output tile row.
  static_assert(TW % 32 == 0 && G % 32 == 0 && (TR * TW) % NT == 0 &&
                (TW * G) % NT == 0);
  __shared__ uint32_t tile[TR * TW];
  const uint64_t words = cols / 4, out_words = rows / 4;
  const Tile t = LocateTile<TR, TW, kGroup>(rows, words, col_tile0, batch0);
  const uint32_t* src = in + t.offset + t.row0 * words + t.col0;
  uint32_t* dst = out + t.offset + t.col0 * 4 * out_words + t.row0 / 4;
  const bool full = t.rows == TR && t.cols == TW;
  uint32_t v[TR * TW / NT];
#pragma unroll
  for (int i = 0; i < TR * TW / NT; ++i) {
    const int idx = threadIdx.x + i * NT, r = idx / TW, w = idx % TW;
    v[i] = full || (r < t.rows && w < t.cols)
               ? LoadInput<kEvictLast>(src + r * words + w)
               : 0;
  }
#pragma unroll
  for (int i = 0; i < TR * TW / NT; ++i) {
    const int idx = threadIdx.x + i * NT, r = idx / TW, w = idx % TW;
    tile[r * TW + (w ^ ((r / 4) & 31))] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < TW * G / NT; ++i) {
    const int idx = threadIdx.x + i * NT, g = idx % G, w = idx / G;
    if (!full && (w >= t.cols || g * 4 >= t.rows)) continue;
    uint32_t a[4], b[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) a[k] = tile[(g * 4 + k) * TW + (w ^ (g & 31))];
    TransposeBytes4x4(a, b);
    uint32_t* row = dst + (w * 4) * out_words + g;
#pragma unroll
    for (int k = 0; k < 4; ++k) row[k * out_words] = b[k];
  }
}

// For shapes whose output rows do not start on 32-byte sector boundaries
// (12345 x 6789, say): square tiles would begin and end every output row
// segment in a partial sector, and partial-sector writes cost far more than
// their bytes (on the H200 the padded tile ran at 65% of memcpy there in
// row-major tile order, 84% in column-major order; this kernel 100%). Here a
// block covers 64 input columns and, for each output row j, a window of TR
// output elements that starts on a sector boundary: the windows down a tile
// column are shifted per output row by that row's misalignment, so the block
// loads the TR + A input rows any of its windows needs (A = elements per
// sector) and every warp store covers whole sectors.
template <typename T, int TR>
__global__ void __launch_bounds__(512)
    SkewedTranspose(const T* __restrict__ in, T* __restrict__ out,
                    uint64_t rows, uint64_t cols, uint64_t col_tile0,
                    uint64_t batch0) {
  constexpr int kCols = 64, kBlockRows = 8, A = 32 / sizeof(T);
  constexpr int kRowsIn = TR + A, kStride = kRowsIn + 1;
  static_assert(TR % 32 == 0);
  // Stored column-major (tile[c][r]): the loads write a column with an odd
  // stride, the stores read along a row; neither conflicts on banks.
  __shared__ T tile[kCols * kStride];
  const int64_t r_base = int64_t{blockIdx.x} * TR - A;
  const uint64_t col0 = (col_tile0 + blockIdx.y) * kCols;
  const uint64_t offset = (batch0 + blockIdx.z) * rows * cols;
  const uint32_t x = threadIdx.x;
  if (r_base >= 0 && r_base + kRowsIn <= int64_t(rows) &&
      col0 + kCols <= cols) {
    const T* src = in + offset + uint64_t(r_base) * cols + col0;
#pragma unroll
    for (int j = 0; j < kRowsIn; j += kBlockRows) {
      const int r = threadIdx.y + j;
      if (kRowsIn % kBlockRows == 0 || r < kRowsIn)
        tile[x * kStride + r] = src[uint64_t(r) * cols + x];
    }
  } else {
    for (int r = threadIdx.y; r < kRowsIn; r += kBlockRows) {
      const int64_t row = r_base + r;
      if (row >= 0 && row < int64_t(rows) && col0 + x < cols)
        tile[x * kStride + r] = in[offset + uint64_t(row) * cols + col0 + x];
    }
  }
  __syncthreads();
  // One warp per output row at a time; 16 warps. Output buffers are
  // sector-aligned (cudaMalloc's are), so a row's misalignment follows from
  // its element offset. (A separate unchecked path for whole windows measured
  // 2% slower.)
  const int warp = (threadIdx.y * kCols + x) / 32, lane = x % 32;
  for (int c = warp; c < kCols; c += kCols * kBlockRows / 32) {
    const uint64_t j = col0 + c;
    if (j >= cols) break;
    T* row = out + offset + j * rows;
    const int shift = static_cast<int>((A - (offset + j * rows) % A) % A);
    const int64_t start = r_base + shift;  // Output column of the window.
#pragma unroll
    for (int h = 0; h < TR; h += 32) {
      const int64_t i = start + h + lane;
      if (i >= 0 && i < int64_t(rows))
        row[i] = tile[c * kStride + shift + h + lane];
    }
  }
}

// The skewed kernel for 1- and 2-byte elements, whose rows start at any byte:
// element-wise global accesses would cost an instruction per one or two bytes,
// so both sides move 4-byte words (K = 4 / sizeof(T) elements). Output windows
// of TR elements start on 32-byte sectors (A elements), shifted per output row
// as in SkewedTranspose; the block loads the TR + A - 1 input rows its windows
// need, each as 32 words from the one holding the tile's first column, so a
// tile has 32 K - (K - 1) columns whatever the row's alignment. The shared
// tile is column-major (one output row's window contiguous): each element of a
// loaded word is stored on its own, and each output word is funnel-shifted out
// of the two shared words it straddles. A warp's input rows lie 16 apart (a
// multiple of 4 bytes), so they share one misalignment: the interior path
// loads at constant offsets from one pointer. On the H200 (docs/BENCHMARKS.md,
// attempt 36) 1-byte 12345 x 6789 reads 82% of memcpy and 4097 x 4099 87%,
// where padded_64x8 reads 40% and 58%; 2-byte 88% (64%) and 89% (77%). Windows
// on words instead of sectors (no shift per output row) read 67%, 84%, 81% and
// 85%: partial sectors at both ends of every window cost more than the 28 or
// 14 more input rows. It is bound by instructions and shared-memory stores
// (one per element). A variant that transposed groups of 4 rows in registers
// before one vector store (exploration 45) issued more instructions.
template <typename T, int TR>
__global__ void __launch_bounds__(512)
    SkewedWordsTranspose(const T* __restrict__ in, T* __restrict__ out,
                         uint64_t rows, uint64_t cols, uint64_t col_tile0,
                         uint64_t batch0) {
  constexpr int E = sizeof(T), K = 4 / E, A = 32 / E;
  constexpr int kCols = 32 * K - (K - 1);
  constexpr int kSharedCols = 32 * K + K - 1;  // Column K - 1 is the first.
  constexpr int kRowsIn = TR + A - 1;
  constexpr int kStride = kRowsIn | 1;  // Odd: a warp's stores hit 32 banks.
  constexpr int kWarps = 16;
  constexpr int kRowsPerWarp = (kRowsIn + kWarps - 1) / kWarps;
  constexpr int kColsPerWarp = (kCols + kWarps - 1) / kWarps;
  constexpr int kWordsOut = TR / K / 32;
  static_assert(TR % (32 * K) == 0 && TR % A == 0 && kWarps % K == 0);
  __shared__ uint32_t tile_words[(kSharedCols * kStride + K - 1) / K + 1];
  T* tile = reinterpret_cast<T*>(tile_words);
  const int64_t r_base = int64_t{blockIdx.x} * TR - (A - 1);
  const uint64_t col0 = (col_tile0 + blockIdx.y) * kCols;
  const uint64_t n = rows * cols;
  const uint64_t offset = (batch0 + blockIdx.z) * n;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int c_end = static_cast<int>(min(uint64_t{kCols}, cols - col0));
  // Whole windows, words inside the matrix and offsets within the tile in 32
  // bits. r_base >= 0 means r_base >= TR - (A - 1), more than the up to K - 1
  // elements the first row's first word starts before its column; lane 31's
  // word of the last row ends within 32 K - 1 elements past it.
  const bool interior = r_base >= 0 && r_base + kRowsIn <= int64_t(rows) &&
                        kRowsIn * cols * E < (uint64_t{1} << 31) &&
                        kCols * rows * E < (uint64_t{1} << 31) &&
                        (r_base + kRowsIn - 1) * cols + col0 + 32 * K <= n;
  if (interior) {
    const T* row = in + (offset + r_base * cols + col0) +
                   warp * static_cast<uint32_t>(cols);
    const int m = static_cast<int>(reinterpret_cast<uintptr_t>(row) % 4);
    const uint32_t* src = reinterpret_cast<const uint32_t*>(
                              reinterpret_cast<const char*>(row) - m) +
                          lane;
    const uint32_t step = kWarps * static_cast<uint32_t>(cols) * E / 4;
    uint32_t v[kRowsPerWarp];
#pragma unroll
    for (int q = 0; q < kRowsPerWarp; ++q) {
      if (q == kRowsPerWarp - 1 && warp + q * kWarps >= kRowsIn) break;
      v[q] = src[q * step];
    }
    T* dst = tile + ((K - 1) - m / E + lane * K) * kStride + warp;
#pragma unroll
    for (int q = 0; q < kRowsPerWarp; ++q) {
      if (q == kRowsPerWarp - 1 && warp + q * kWarps >= kRowsIn) break;
#pragma unroll
      for (int k = 0; k < K; ++k)
        dst[k * kStride + q * kWarps] = T(v[q] >> (8 * E * k));
    }
  } else {
    // Rows past the matrix are skipped (their elements are never stored);
    // words reaching past it are loaded element by element.
    const T* matrix = in + offset;
    const uint32_t head = reinterpret_cast<uintptr_t>(matrix) % 4;
    const uint32_t* words = reinterpret_cast<const uint32_t*>(
        reinterpret_cast<const char*>(matrix) - head);
    for (int r = warp; r < kRowsIn; r += kWarps) {
      const int64_t row = r_base + r;
      if (row < 0 || row >= int64_t(rows)) continue;
      const uint64_t byte = head + (uint64_t(row) * cols + col0) * E;
      const uint64_t w = byte / 4 + lane;
      uint32_t v = 0;
      if (w * 4 >= head && w * 4 + 4 <= head + n * E) {
        v = words[w];
      } else {
#pragma unroll
        for (int k = 0; k < K; ++k) {
          const int64_t e = (int64_t(w * 4) - int64_t(head)) / E + k;
          if (e >= 0 && uint64_t(e) < n)
            v |= uint32_t(matrix[e]) << (8 * E * k);
        }
      }
      const int sc0 = (K - 1) - static_cast<int>(byte % 4) / E + lane * K;
#pragma unroll
      for (int k = 0; k < K; ++k)
        tile[(sc0 + k) * kStride + r] = T(v >> (8 * E * k));
    }
  }
  __syncthreads();
  // Warp w writes output rows col0 + w + 16 q, each window starting shift
  // elements past r_base, where it starts on a sector: from output element o
  // of (col0 + w, r_base), whose place in its sector is `phase`.
  const uint64_t o = offset + (col0 + warp) * rows + r_base;
  const uint32_t phase =
      static_cast<uint32_t>((reinterpret_cast<uintptr_t>(out) / E + o) % A);
  const uint32_t phase_step = kWarps * static_cast<uint32_t>(rows % A);
  const auto window = [&](int q, int* shift, const uint32_t** from, int* bits) {
    *shift = static_cast<int>((A - (phase + q * phase_step) % A) % A);
    const int p = (warp + q * kWarps + K - 1) * kStride + *shift + lane * K;
    *from = tile_words + p / K;
    *bits = (p % K) * E * 8;
  };
  if (interior) {
    T* const first = out + o;
    const uint32_t step = kWarps * static_cast<uint32_t>(rows);
#pragma unroll
    for (int q = 0; q < kColsPerWarp; ++q) {
      if (warp + q * kWarps >= c_end) break;
      int shift, bits;
      const uint32_t* from;
      window(q, &shift, &from, &bits);
      uint32_t* to =
          reinterpret_cast<uint32_t*>(first + (q * step + shift)) + lane;
#pragma unroll
      for (int h = 0; h < kWordsOut; ++h)
        to[h * 32] = __funnelshift_r(from[h * 32], from[h * 32 + 1], bits);
    }
  } else {
    for (int q = 0; q < kColsPerWarp; ++q) {
      if (warp + q * kWarps >= c_end) break;
      int shift, bits;
      const uint32_t* from;
      window(q, &shift, &from, &bits);
#pragma unroll
      for (int h = 0; h < kWordsOut; ++h) {
        const uint32_t word =
            __funnelshift_r(from[h * 32], from[h * 32 + 1], bits);
        const int i0 = shift + (h * 32 + lane) * K;  // From r_base.
#pragma unroll
        for (int k = 0; k < K; ++k) {
          if (r_base + i0 + k >= 0 && r_base + i0 + k < int64_t(rows))
            out[o + uint64_t(q * kWarps) * rows + i0 + k] =
                T(word >> (8 * E * k));
        }
      }
    }
  }
}

// q = n / d for 32-bit n and d (Granlund and Montgomery): a multiply-high, an
// add and a shift, where a division takes about twenty instructions.
struct Divider {
  uint32_t magic = 1, shift = 0;
  explicit Divider(uint32_t d) {
    while ((uint64_t{1} << shift) < d) ++shift;
    magic = static_cast<uint32_t>(
        ((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }
  __device__ __forceinline__ uint32_t Div(uint32_t n) const {
    return static_cast<uint32_t>((uint64_t{__umulhi(magic, n)} + n) >> shift);
  }
};

// A 16-byte unit of memory seen as the elements it holds.
template <typename T>
union Unit {
  uint4 bits;
  T element[sizeof(uint4) / sizeof(T)];
};

// Moves one unit's elements between `unit` and their places in shared memory
// (into shared memory when kToShared), those of group elements j0 + k within
// [0, total). Along a unit, one index of the other side's layout runs fast
// (up to `fast_len`) and its place steps by `slow_len`: for a scatter the
// input's column, stepping output rows; for a gather the output's column (the
// input's row), stepping input rows. kBranchFree: see SmallMatricesTranspose.
template <typename T, bool kToShared, bool kBranchFree>
__device__ __forceinline__ void MoveUnit(Unit<T>& unit, T* shared, int64_t j0,
                                         uint32_t total, uint32_t n,
                                         uint32_t lead, uint32_t fast_len,
                                         uint32_t slow_len,
                                         const Divider& div_n,
                                         const Divider& div_fast) {
  constexpr uint32_t E = sizeof(uint4) / sizeof(T);
  // The unit's first element of this group, as (m, slow, fast), and its place.
  const uint32_t j = static_cast<uint32_t>(max(j0, int64_t{0}));
  uint32_t m = div_n.Div(j), w = j - m * n;
  uint32_t slow = div_fast.Div(w), fast = w - slow * fast_len;
  uint32_t place = lead + m * n + fast * slow_len + slow;
  const auto move = [&](uint32_t k, uint32_t at) {
    if constexpr (kToShared) {
      shared[at] = unit.element[k];
    } else {
      unit.element[k] = shared[at];
    }
  };
  if (kBranchFree && fast_len >= E && j0 >= 0 && j0 + E <= total) {
    // The slow index changes at most once, after `split` elements.
    const uint32_t split = fast_len - fast;
    const uint32_t next =
        slow + 1 < slow_len ? lead + m * n + slow + 1 : lead + (m + 1) * n;
    const uint32_t other = next - split * slow_len;
#pragma unroll
    for (uint32_t k = 0; k < E; ++k)
      move(k, (k < split ? place : other) + k * slow_len);
    return;
  }
#pragma unroll
  for (uint32_t k = 0; k < E; ++k) {
    if (j0 + k < j || j0 + k >= total) continue;
    move(k, place);
    if (++fast == fast_len) {
      fast = 0;
      if (++slow == slow_len) {
        slow = 0;
        ++m;
      }
      place = lead + m * n + slow;
    } else {
      place += slow_len;
    }
  }
}

// Global unit `u` of a run of `len` elements (`run`, whose element x0 is the
// unit's first): loaded whole where the unit lies inside the run, else element
// by element, those inside it. The run's neighbours own the rest of such a
// unit, and the buffer may end inside it.
template <typename T>
__device__ __forceinline__ uint4 LoadRunUnit(const uint4* units, uint64_t u,
                                             const T* run, int64_t x0,
                                             uint64_t len) {
  constexpr uint32_t E = sizeof(uint4) / sizeof(T);
  if (x0 >= 0 && static_cast<uint64_t>(x0) + E <= len) return units[u];
  Unit<T> unit{};
#pragma unroll
  for (uint32_t t = 0; t < E; ++t) {
    const int64_t x = x0 + t;
    if (x >= 0 && static_cast<uint64_t>(x) < len) unit.element[t] = run[x];
  }
  return unit.bits;
}

// Stores `unit` as global unit `u` of such a run: whole where it lies inside
// the run, else only its elements inside it.
template <typename T>
__device__ __forceinline__ void StoreRunUnit(uint4* units, uint64_t u, T* run,
                                             int64_t x0, uint64_t len,
                                             const Unit<T>& unit) {
  constexpr uint32_t E = sizeof(uint4) / sizeof(T);
  if (x0 >= 0 && static_cast<uint64_t>(x0) + E <= len) {
    units[u] = unit.bits;
    return;
  }
#pragma unroll
  for (uint32_t t = 0; t < E; ++t) {
    const int64_t x = x0 + t;
    if (x >= 0 && static_cast<uint64_t>(x) < len) run[x] = unit.element[t];
  }
}

// Batches of small matrices, each staged whole in shared memory: a block takes
// `per_block` matrices and moves one side of the transpose as a flat copy of
// 16-byte units, the other element by element. With kScatterInput (odd row
// counts) it scatters each input unit's elements to their transposed places in
// shared memory, which holds the output as it will lie, and copies the output
// out whole; otherwise it copies the input in whole and gathers each output
// unit's elements from it. Shared memory mirrors global memory's 16-byte
// alignment, so the copied side needs no index arithmetic and the other side
// pays it once per unit (two multiply-high divisions). The elements a warp
// scatters (gathers) at once lie a unit's worth of output (input) rows apart,
// 4 x rows (cols) words, and rows wrap within a unit: an odd row (column)
// count spreads them over the banks, about 2-way on average, where an even
// one can pile them up (16-way for 4-byte 64 x 64 gathers). Units at a group's
// edges are shared with the neighbouring groups: such output units are stored
// element by element, input units past the buffer's ends loaded so. On the
// H200 transpose_bench reads 96-97%, 106-107% and 112% of memcpy for 1- and
// 2-byte batches of 31 x 33 and 4-byte 15 x 17 matrices and 91% for 4-byte 63
// x 65, where the element-by-element kernel before it read 31%, 56%, 98% and
// 82%; 8- and 16-byte batches read as before (docs/BENCHMARKS.md, attempts 33
// and 34).
template <typename T, int NT, bool kScatterInput>
__global__ void __launch_bounds__(NT)
    SmallMatricesTranspose(const T* __restrict__ in, T* __restrict__ out,
                           uint32_t rows, uint32_t cols, uint32_t per_block,
                           uint64_t batch, uint32_t in_head, uint32_t out_head,
                           Divider div_cols, Divider div_rows, Divider div_n) {
  constexpr uint32_t E = sizeof(uint4) / sizeof(T);  // Elements per unit.
  constexpr int kLoads = 4;  // Units in flight per thread.
  // For 1- and 2-byte elements, units wholly inside the group whose elements
  // change row (column) at most once skip the per-element checks and steps:
  // each element's place is one of two bases plus k rows (columns). The kernel
  // is bound by its instructions there (Nsight Compute, 1-byte 31 x 33: issue
  // slots 83% busy, DRAM 18%); this took those batches from 51% to 99% of
  // memcpy. 4-byte elements read 2-4 points slower with it.
  constexpr bool kBranchFree = E >= 8;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  uint4* shared_units = reinterpret_cast<uint4*>(shared_bytes);
  T* shared = reinterpret_cast<T*>(shared_bytes);
  const uint32_t n = rows * cols;
  const uint64_t m0 = uint64_t{blockIdx.x} * per_block;
  const uint32_t total =
      static_cast<uint32_t>(min(uint64_t{per_block}, batch - m0)) * n;
  // Element indices into the whole batch; unit u of a buffer whose first
  // element lies `head` elements past a 16-byte boundary holds elements u * E
  // - head to u * E - head + E - 1.
  const uint64_t begin = m0 * n, all = batch * n;
  const uint4* in_units = reinterpret_cast<const uint4*>(
      reinterpret_cast<uintptr_t>(in) - in_head * sizeof(T));
  uint4* out_units = reinterpret_cast<uint4*>(reinterpret_cast<uintptr_t>(out) -
                                              out_head * sizeof(T));
  // Shared memory holds the copied side's units from the one holding `begin`,
  // which lands at element `lead`.
  const uint32_t copied_head = kScatterInput ? out_head : in_head;
  const uint64_t unit0 = (begin + copied_head) / E;
  const uint32_t lead = static_cast<uint32_t>((begin + copied_head) % E);
  const uint32_t units = (lead + total + E - 1) / E;
  // A unit of the input, element by element where it reaches past the buffer.
  const auto load = [&](uint64_t u) {
    return LoadRunUnit(in_units, u, in, static_cast<int64_t>(u * E) - in_head,
                       all);
  };
  if constexpr (kScatterInput) {
    const uint64_t first = (begin + in_head) / E,
                   last = (begin + total - 1 + in_head) / E;
    for (uint64_t base = first; base <= last; base += NT * kLoads) {
      uint4 v[kLoads];
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const uint64_t u = base + i * NT + threadIdx.x;
        if (u <= last) v[i] = load(u);
      }
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const uint64_t u = base + i * NT + threadIdx.x;
        if (u > last) continue;
        const int64_t j0 =
            static_cast<int64_t>(u * E) - in_head - static_cast<int64_t>(begin);
        Unit<T> unit;
        unit.bits = v[i];
        MoveUnit<T, true, kBranchFree>(unit, shared, j0, total, n, lead, cols,
                                       rows, div_n, div_cols);
      }
    }
    __syncthreads();
    for (uint32_t q = threadIdx.x; q < units; q += NT) {
      Unit<T> unit;
      unit.bits = shared_units[q];
      StoreRunUnit(out_units, unit0 + q, out + begin,
                   static_cast<int64_t>(q * E) - lead, total, unit);
    }
  } else {
    for (uint32_t base = 0; base < units; base += NT * kLoads) {
      uint4 v[kLoads];
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const uint32_t q = base + i * NT + threadIdx.x;
        if (q < units) v[i] = load(unit0 + q);
      }
#pragma unroll
      for (int i = 0; i < kLoads; ++i) {
        const uint32_t q = base + i * NT + threadIdx.x;
        if (q < units) shared_units[q] = v[i];
      }
    }
    __syncthreads();
    const uint64_t first = (begin + out_head) / E,
                   last = (begin + total - 1 + out_head) / E;
    for (uint64_t u = first + threadIdx.x; u <= last; u += NT) {
      const int64_t j0 =
          static_cast<int64_t>(u * E) - out_head - static_cast<int64_t>(begin);
      Unit<T> unit;
      MoveUnit<T, false, kBranchFree>(unit, shared, j0, total, n, lead, rows,
                                      cols, div_n, div_rows);
      StoreRunUnit(out_units, u, out + begin, j0, total, unit);
    }
  }
}

// Moves one 16-byte unit of a thin matrix's contiguous run between `unit` and
// the shared rows (into them when kToShared): its elements e0 + t within [0,
// total), element e being position e / k of short row e % k. Row j's elements
// start at j * row_stride + lead_j, lead_j = (lead0 + j * n_mod) mod E: each
// step to the next row moves the place by a row and by the change in lead, and
// a step past the last row goes back to the first, one position on. Units
// wholly inside the run skip the checks.
template <typename T, bool kToShared>
__device__ __forceinline__ void MoveThinUnit(Unit<T>& unit, T* shared,
                                             int64_t e0, uint32_t total,
                                             uint32_t k, uint32_t row_stride,
                                             uint32_t lead0, uint32_t n_mod,
                                             const Divider& div_k) {
  constexpr uint32_t E = sizeof(uint4) / sizeof(T);
  const uint32_t e = static_cast<uint32_t>(max(e0, int64_t{0}));
  uint32_t i = div_k.Div(e), j = e - i * k;
  uint32_t lead = (lead0 + j * n_mod) % E;
  uint32_t place = j * row_stride + lead + i;
  const auto move = [&](uint32_t t) {
    if constexpr (kToShared) {
      shared[place] = unit.element[t];
    } else {
      unit.element[t] = shared[place];
    }
  };
  const auto step = [&] {
    if (++j == k) {
      j = 0;
      ++i;
      lead = lead0;
      place = lead0 + i;
    } else {
      const uint32_t next = (lead + n_mod) % E;
      place += row_stride + next - lead;
      lead = next;
    }
  };
  if (e0 >= 0 && e0 + E <= total) {
#pragma unroll
    for (uint32_t t = 0; t < E; ++t) {
      move(t);
      step();
    }
    return;
  }
#pragma unroll
  for (uint32_t t = 0; t < E; ++t) {
    if (e0 + t < e || e0 + t >= total) continue;
    move(t);
    step();
  }
}

// Thin matrices, whose rows or columns number k <= kThinMaxK (an array of
// structures and its structure of arrays: N x 3 points, 3 x N coordinates).
// Tiles leave most of a block idle there (32 x 32 tiles on N x 3 use 3 of 32
// columns): on the H200 4-byte N x 3 read 17% of memcpy in the best tiled
// kernel, 3 x N 24%. Here a block takes a span of positions along N for all k
// short rows. The side of the transpose that is k rows of N elements (kTall:
// the output; else the input) is k runs of the span, staged in k shared rows
// laid out as their global 16-byte units are (run j from element lead_j of its
// first unit) and copied in whole units; the other side is one contiguous run
// of span x k elements, moved in 16-byte units whose elements are scattered
// to (kTall) or gathered from their places in the shared rows (MoveThinUnit).
// Units at a run's ends are shared with the neighbouring blocks: those are
// stored element by element, and loaded so. Rows of an odd number of units
// spread a unit's scattered elements over the banks. With k up to 16, N x k
// and k x N matrices of 64 MiB read 96-110% of memcpy for 4- to 16-byte
// elements, 74-101% for 2-byte and 53-71% for 1-byte ones, whose units move
// 8 or 16 elements one by one (docs/BENCHMARKS.md, attempt 38); LaunchThin
// gives them ThinGroupsTranspose instead for 1-byte k = 2 to 8 and some
// 2-byte shapes.
template <typename T, int NT, bool kTall>
__global__ void __launch_bounds__(NT)
    ThinTranspose(const T* __restrict__ in, T* __restrict__ out, uint32_t k,
                  uint64_t n, uint32_t span, uint32_t row_units,
                  uint64_t batch0, uint32_t in_head, uint32_t out_head,
                  Divider div_k, Divider div_row_units) {
  constexpr uint32_t E = sizeof(uint4) / sizeof(T);  // Elements per unit.
  constexpr int kLoads = 4;  // Units in flight per thread.
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  uint4* shared_units = reinterpret_cast<uint4*>(shared_bytes);
  T* shared = reinterpret_cast<T*>(shared_bytes);
  const uint64_t b = batch0 + blockIdx.y;
  const uint64_t p0 = uint64_t{blockIdx.x} * span;
  const uint32_t len = static_cast<uint32_t>(min(uint64_t{span}, n - p0));
  const uint32_t row_stride = row_units * E;
  // The k runs: run j starts at element (b k + j) n + p0 of its buffer (g_j),
  // which lies lead_j elements into its unit.
  const uint32_t runs_head = kTall ? out_head : in_head;
  const uint32_t lead0 =
      static_cast<uint32_t>((b * k * n + p0 + runs_head) % E);
  const uint32_t n_mod = static_cast<uint32_t>(n % E);
  const auto run_start = [&](uint32_t j) { return (b * k + j) * n + p0; };
  // The contiguous side: elements (b n + p0) k to that + len k.
  const uint32_t flat_head = kTall ? in_head : out_head;
  const uint64_t flat0 = (b * n + p0) * k;
  const uint32_t flat_len = len * k;
  const uint64_t first = (flat0 + flat_head) / E,
                 last = (flat0 + flat_len - 1 + flat_head) / E;
  const auto flat_offset = [&](uint64_t u) {
    return static_cast<int64_t>(u * E) - flat_head -
           static_cast<int64_t>(flat0);
  };
  // Shared unit s: row j = s / row_units, unit q of it, whose first element
  // is run position i0; false where it starts past the run's end.
  const auto run_unit = [&](uint32_t s, uint32_t& j, int64_t& i0) {
    j = div_row_units.Div(s);
    const uint32_t q = s - j * row_units;
    i0 = int64_t{q} * E - (lead0 + j * n_mod) % E;
    return i0 < len;
  };
  const uint32_t shared_units_used = k * row_units;
  if constexpr (kTall) {
    const uint4* in_units = reinterpret_cast<const uint4*>(
        reinterpret_cast<uintptr_t>(in) - flat_head * sizeof(T));
    for (uint64_t base = first; base <= last; base += NT * kLoads) {
      uint4 v[kLoads];
#pragma unroll
      for (int l = 0; l < kLoads; ++l) {
        const uint64_t u = base + l * NT + threadIdx.x;
        if (u <= last)
          v[l] = LoadRunUnit(in_units, u, in + flat0, flat_offset(u), flat_len);
      }
#pragma unroll
      for (int l = 0; l < kLoads; ++l) {
        const uint64_t u = base + l * NT + threadIdx.x;
        if (u > last) continue;
        Unit<T> unit;
        unit.bits = v[l];
        MoveThinUnit<T, true>(unit, shared, flat_offset(u), flat_len, k,
                              row_stride, lead0, n_mod, div_k);
      }
    }
    __syncthreads();
    uint4* out_units = reinterpret_cast<uint4*>(
        reinterpret_cast<uintptr_t>(out) - out_head * sizeof(T));
    for (uint32_t s = threadIdx.x; s < shared_units_used; s += NT) {
      uint32_t j;
      int64_t i0;
      if (!run_unit(s, j, i0)) continue;
      const uint64_t g = run_start(j);
      Unit<T> unit;
      unit.bits = shared_units[s];
      StoreRunUnit(out_units, (g + out_head) / E + (s - j * row_units), out + g,
                   i0, len, unit);
    }
  } else {
    const uint4* in_units = reinterpret_cast<const uint4*>(
        reinterpret_cast<uintptr_t>(in) - in_head * sizeof(T));
    for (uint32_t base = 0; base < shared_units_used; base += NT * kLoads) {
      uint4 v[kLoads];
#pragma unroll
      for (int l = 0; l < kLoads; ++l) {
        const uint32_t s = base + l * NT + threadIdx.x;
        uint32_t j;
        int64_t i0;
        if (s >= shared_units_used || !run_unit(s, j, i0)) continue;
        const uint64_t g = run_start(j);
        v[l] = LoadRunUnit(in_units, (g + in_head) / E + (s - j * row_units),
                           in + g, i0, len);
      }
#pragma unroll
      for (int l = 0; l < kLoads; ++l) {
        const uint32_t s = base + l * NT + threadIdx.x;
        uint32_t j;
        int64_t i0;
        if (s < shared_units_used && run_unit(s, j, i0)) shared_units[s] = v[l];
      }
    }
    __syncthreads();
    uint4* out_units = reinterpret_cast<uint4*>(
        reinterpret_cast<uintptr_t>(out) - flat_head * sizeof(T));
    for (uint64_t u = first + threadIdx.x; u <= last; u += NT) {
      const int64_t e0 = flat_offset(u);
      Unit<T> unit;
      MoveThinUnit<T, false>(unit, shared, e0, flat_len, k, row_stride, lead0,
                             n_mod, div_k);
      StoreRunUnit(out_units, u, out + flat0, e0, flat_len, unit);
    }
  }
}

// The __byte_perm selector of the 4 bytes that start `shift` bytes (0 to 3)
// into lo:hi.
__device__ __forceinline__ uint32_t FunnelSelector(uint32_t shift) {
  return 0x3210 + 0x1111 * shift;
}

// The 16 bytes that start `shift` bytes (0 to 15) into lo:hi. The whole words
// are picked by a branch, uniform across a warp where the shift is, so that no
// register is indexed by a runtime value; the rest is a byte permute.
__device__ __forceinline__ uint4 FunnelUnit(const uint4& lo, const uint4& hi,
                                            uint32_t shift) {
  const uint32_t selector = FunnelSelector(shift & 3);
  const auto permute = [selector](uint32_t a, uint32_t b, uint32_t c,
                                  uint32_t d, uint32_t e) {
    return make_uint4(__byte_perm(a, b, selector), __byte_perm(b, c, selector),
                      __byte_perm(c, d, selector), __byte_perm(d, e, selector));
  };
  switch (shift >> 2) {
    case 0:
      return permute(lo.x, lo.y, lo.z, lo.w, hi.x);
    case 1:
      return permute(lo.y, lo.z, lo.w, hi.x, hi.y);
    case 2:
      return permute(lo.z, lo.w, hi.x, hi.y, hi.z);
    default:
      return permute(lo.w, hi.x, hi.y, hi.z, hi.w);
  }
}

// One 32-bit word of 4 / S elements of S bytes (1 or 2), element b taken from
// byte `at[b]` of word `from[b]`; with the indices known at compile time, one
// byte permute per pair of source words.
template <int S>
__device__ __forceinline__ uint32_t PackWord(const uint32_t* from,
                                             const int* at) {
  if constexpr (S == 2) {
    return __byte_perm(
        from[0], from[1],
        at[0] | (at[0] + 1) << 4 | (at[1] + 4) << 8 | (at[1] + 5) << 12);
  } else {
    const uint32_t lo = __byte_perm(from[0], from[1], at[0] | (at[1] + 4) << 4);
    const uint32_t hi = __byte_perm(from[2], from[3], at[2] | (at[3] + 4) << 4);
    return __byte_perm(lo, hi, 0x5410);
  }
}

// Transposes, in registers, the K 16-byte units of a thin matrix's
// contiguous side that hold a group of E positions (`flat`: element p K + j
// is position p of run j) into the units of its K runs (`runs[j]`: positions
// 0 to E - 1 of run j).
template <typename T, int K>
__device__ __forceinline__ void TransposeThinGroup(
    const uint32_t (&flat)[4 * K], uint32_t (&runs)[K][4]) {
  constexpr int S = sizeof(T), kPerWord = 4 / S;
#pragma unroll
  for (int w = 0; w < 4 * K; ++w) {  // A word of `runs`.
    uint32_t from[kPerWord];
    int at[kPerWord];
#pragma unroll
    for (int b = 0; b < kPerWord; ++b) {
      const int j = w / 4, p = (w % 4) * kPerWord + b, e = p * K + j;
      from[b] = flat[e / kPerWord];
      at[b] = (e % kPerWord) * S;
    }
    runs[w / 4][w % 4] = PackWord<S>(from, at);
  }
}

// Thin matrices of 1- and 2-byte elements with K = 2 to 8 short rows or
// columns (N x 3 RGB pixels to 3 x N planes and back). ThinTranspose moves
// their contiguous side element by element, 8 or 16 per unit, and is bound by
// those instructions (1-byte N x 3 71% of memcpy, 3 x N 64%); here whole words
// are moved by byte permutes fixed at compile time. N x K (kTall): a thread
// per group of E positions loads the K + 1 input units that hold it straight
// from global memory, shifts them into place whole (FunnelUnit), transposes
// them in registers (TransposeThinGroup) and stores its K run units to shared
// memory with position 0 at a unit's start; the block then copies the runs
// out in global units, shifted back. K x N: the block stages its runs as in
// global memory; a thread per output unit gathers that unit's positions from
// each run (a few words at a runtime shared address) and stores it straight
// to global memory, so that a warp's stores are contiguous. kOutputOnUnits
// (each block's output starts on a unit) spares the final shift where K
// divides E. Blocks stage K runs of span / E + 1 units, span / E = 1024 / K -
// 1 groups, so that the K x N loads take one round of 4 units per thread.
// On the H200 (docs/BENCHMARKS.md, attempts 39 and 40), against
// ThinTranspose: 1-byte N x 2, 3 and 4 read 88-94% of memcpy against 66-71%;
// 2 x N, 3 x N and 4 x N 100%, 96% and 88% against 62%, 64% and 57%; 2-byte 2
// x N, 3 x N, 4 x N and N x 4 99%, 90%, 88% and 99% against 86%, 86%, 78% and
// 95%. ThinTranspose stays faster for 2-byte N x 2 and N x 3 (97% and 94%
// against 94% and 89%). Attempt 41: 1-byte N x 5 to N x 8 74-90% against
// 61-68%, 5 x N to 8 x N 75-87% against 56-61%; 2-byte 8 x N 87% against 75%;
// past K = 8, slower than ThinTranspose.
template <typename T, int K, int NT, bool kTall, bool kOutputOnUnits = false>
__global__ void __launch_bounds__(NT)
    ThinGroupsTranspose(const T* __restrict__ in, T* __restrict__ out,
                        uint64_t n, uint32_t span, uint64_t batch0,
                        uint32_t in_head, uint32_t out_head,
                        Divider div_run_units) {
  constexpr uint32_t S = sizeof(T), E = sizeof(uint4) / S;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  uint4* shared_units = reinterpret_cast<uint4*>(shared_bytes);
  const uint64_t b = batch0 + blockIdx.y;
  const uint64_t p0 = uint64_t{blockIdx.x} * span;
  const uint32_t len = static_cast<uint32_t>(min(uint64_t{span}, n - p0));
  const uint32_t groups = (len + E - 1) / E;
  const uint4* in_units = reinterpret_cast<const uint4*>(
      reinterpret_cast<uintptr_t>(in) - in_head * S);
  uint4* out_units =
      reinterpret_cast<uint4*>(reinterpret_cast<uintptr_t>(out) - out_head * S);
  // Run j starts at element (b K + j) n + p0 of its buffer, lead_j elements
  // into its global unit; its unit q holds positions q E - lead_j on, and at
  // most run_units of them hold positions of the span.
  const uint32_t run_units = span / E + 1;
  const uint32_t runs_head = kTall ? out_head : in_head;
  const auto run_start = [&](uint32_t j) { return (b * K + j) * n + p0; };
  const auto run_lead = [&](uint32_t j) {
    return static_cast<uint32_t>((run_start(j) + runs_head) % E);
  };
  // The contiguous side: elements (b n + p0) K to that + len K, from global
  // unit `first` on.
  const uint32_t flat_head = kTall ? in_head : out_head;
  const uint64_t flat0 = (b * n + p0) * K;
  const uint32_t flat_len = len * K;
  const uint64_t first = (flat0 + flat_head) / E;
  if constexpr (kTall) {
    const auto words = [](const uint4& unit, uint32_t* to) {
      to[0] = unit.x;
      to[1] = unit.y;
      to[2] = unit.z;
      to[3] = unit.w;
    };
    // Run j's staged unit u (positions u E on, from u = -1) in this slot.
    // Slots -1 and `groups` are read unwritten where a shift reaches into
    // them, for positions outside [0, len) that are never stored.
    const auto run_slot = [&](uint32_t j, int32_t u) {
      return j * (run_units + 1) + 1 + u;
    };
    // Position 0 lies `shift` bytes into unit `first`.
    const uint32_t shift = static_cast<uint32_t>((flat0 + flat_head) % E) * S;
    for (uint32_t g = threadIdx.x; g < groups; g += NT) {
      uint4 v[K + 1];
#pragma unroll
      for (int c = 0; c <= K; ++c) {
        v[c] = LoadRunUnit(in_units, first + g * K + c, in + flat0,
                           int64_t{g * K + c} * E - shift / S, flat_len);
      }
      uint32_t flat[4 * K], runs[K][4];
#pragma unroll
      for (int c = 0; c < K; ++c)
        words(FunnelUnit(v[c], v[c + 1], shift), flat + 4 * c);
      TransposeThinGroup<T, K>(flat, runs);
#pragma unroll
      for (int j = 0; j < K; ++j)
        shared_units[run_slot(j, g)] =
            make_uint4(runs[j][0], runs[j][1], runs[j][2], runs[j][3]);
    }
    __syncthreads();
    for (uint32_t s = threadIdx.x; s < K * run_units; s += NT) {
      const uint32_t j = div_run_units.Div(s), q = s - j * run_units;
      const int64_t i0 = int64_t{q} * E - run_lead(j);
      if (i0 >= len) continue;
      // Positions i0 on lie in staged units floor(i0 / E) and the next.
      const int32_t u = i0 < 0 ? -1 : static_cast<int32_t>(i0 / E);
      Unit<T> unit;
      unit.bits = FunnelUnit(shared_units[run_slot(j, u)],
                             shared_units[run_slot(j, u + 1)],
                             static_cast<uint32_t>(i0 - int64_t{u} * E) * S);
      const uint64_t start = run_start(j);
      StoreRunUnit(out_units, (start + out_head) / E + q, out + start, i0, len,
                   unit);
    }
  } else {
    // Run j's unit q in this slot, as in global memory, between a unit before
    // that reads of positions before the span may reach into and one after
    // that reads past its end may (both unwritten: their elements are never
    // stored), and a spare.
    const auto run_slot = [&](uint32_t j, uint32_t q) {
      return j * (run_units + 3) + 1 + q;
    };
    constexpr int kLoads = 4;  // Units in flight per thread.
    for (uint32_t base = 0; base < K * run_units; base += NT * kLoads) {
      uint4 v[kLoads];
      uint32_t slot[kLoads];  // Past the last when the thread has no unit.
#pragma unroll
      for (int l = 0; l < kLoads; ++l) {
        const uint32_t s = base + l * NT + threadIdx.x;
        const uint32_t j = div_run_units.Div(s), q = s - j * run_units;
        const uint64_t start = run_start(j);
        slot[l] = run_slot(j, q);
        if (j < K)
          v[l] = LoadRunUnit(in_units, (start + in_head) / E + q, in + start,
                             int64_t{q} * E - run_lead(j), len);
      }
#pragma unroll
      for (int l = 0; l < kLoads; ++l) {
        if (slot[l] < run_slot(K, 0)) shared_units[slot[l]] = v[l];
      }
    }
    __syncthreads();
    // A thread per output unit, so that a warp's stores are contiguous: global
    // unit first + o, which holds the block's contiguous elements from x0 =
    // o E - `head` (negative where the block starts inside a unit); element e
    // is position floor(e / K) of run e mod K. Of each run it reads the P
    // positions from floor(x0 / K), from shared memory at a byte address known
    // only at run time, interleaves them with byte permutes fixed at compile
    // time, from run 0, and shifts the result by j0 = x0 mod K elements.
    constexpr uint32_t kPerWord = 4 / S;
    constexpr uint32_t kMaxJ0 = kOutputOnUnits && E % K == 0 ? 0 : K - 1;
    constexpr uint32_t P = (kMaxJ0 + E - 1) / K + 1;
    constexpr uint32_t kRowWords = (P * S + 3) / 4;
    constexpr uint32_t kFlatWords = kMaxJ0 ? 4 + kMaxJ0 * S / 4 + 1 : 4;
    const uint32_t* shared_words =
        reinterpret_cast<const uint32_t*>(shared_bytes);
    const uint32_t head =
        kOutputOnUnits ? 0 : static_cast<uint32_t>((flat0 + flat_head) % E);
    // Byte address of run j's position -E: the loop divides x0 + K E, not x0,
    // so as to stay unsigned.
    uint32_t lead_bytes[K];
#pragma unroll
    for (int j = 0; j < K; ++j)
      lead_bytes[j] = run_slot(j, 0) * sizeof(uint4) + run_lead(j) * S - E * S;
    const uint32_t units = (head + flat_len + E - 1) / E;
    for (uint32_t o = threadIdx.x; o < units; o += NT) {
      const uint32_t x = o * E + K * E - head, p = x / K, j0 = x - p * K;
      uint32_t rows[K][kRowWords];
#pragma unroll
      for (int j = 0; j < K; ++j) {
        const uint32_t at = lead_bytes[j] + p * S;
        const uint32_t* from = shared_words + at / 4;
        const uint32_t selector = FunnelSelector(at % 4);
        uint32_t next = from[0];
#pragma unroll
        for (int w = 0; w < kRowWords; ++w) {
          const uint32_t word = next;
          next = from[w + 1];
          rows[j][w] = __byte_perm(word, next, selector);
        }
      }
      uint32_t flat[kFlatWords];
#pragma unroll
      for (int w = 0; w < kFlatWords; ++w) {
        uint32_t from[kPerWord];
        int at[kPerWord];
#pragma unroll
        for (int b = 0; b < kPerWord; ++b) {
          const uint32_t v = w * kPerWord + b;
          const uint32_t byte = v < kMaxJ0 + E ? v / K * S : 0;
          from[b] = rows[v % K][byte / 4];
          at[b] = byte % 4;
        }
        flat[w] = PackWord<S>(from, at);
      }
      Unit<T> unit;
      if constexpr (kMaxJ0 == 0) {
        unit.bits = make_uint4(flat[0], flat[1], flat[2], flat[3]);
      } else {
        const uint32_t shift = j0 * S;
        const uint32_t selector = FunnelSelector(shift % 4);
        uint32_t shifted[4];
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          // Whole words first: a select per possible count, as registers
          // cannot be indexed at run time.
          uint32_t lo = flat[w], hi = flat[w + 1];
#pragma unroll
          for (uint32_t c = 1; c <= kMaxJ0 * S / 4; ++c) {
            if (shift / 4 == c) {
              lo = flat[w + c];
              hi = flat[w + c + 1];
            }
          }
          shifted[w] = __byte_perm(lo, hi, selector);
        }
        unit.bits = make_uint4(shifted[0], shifted[1], shifted[2], shifted[3]);
      }
      StoreRunUnit(out_units, first + o, out + flat0, int64_t{o} * E - head,
                   flat_len, unit);
    }
  }
}

struct LaunchShape {
  int tile;
  int block_rows;
  int pad;
};

LaunchShape ShapeOf(Kernel kernel) {
  switch (kernel) {
    case Kernel::kNaive:
      return {32, 8, 0};
    case Kernel::kShared:
      return {32, 8, 0};
    case Kernel::kPadded32:
      return {32, 8, 1};
    case Kernel::kPadded64:
      return {64, 16, 1};
    case Kernel::kPadded64x8:
      return {64, 8, 1};
    default:
      break;
  }
  return {32, 8, 1};
}

// The instantiation of a tunable kernel for `tuning`: Kernel<kGroup,
// kEvictLast> names it for each combination.
template <typename Function>
Function ForTuning(const Tuning& tuning, Function plain, Function evict_last,
                   Function grouped, Function grouped_evict_last) {
  if (tuning.grouped_tile_rows) {
    return tuning.input_evict_last ? grouped_evict_last : grouped;
  }
  return tuning.input_evict_last ? evict_last : plain;
}

// Elements of T from the start of the 16-byte unit that holds `p` to `p`.
template <typename T>
uint32_t HeadElements(const void* p) {
  return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(p) % sizeof(uint4) /
                               sizeof(T));
}

// Covers x_blocks x y_blocks x z_blocks blocks with grids of at most 65535
// along y and z: launch_grid(grid, y0, z0) launches one, whose first block
// is (0, y0, z0) of the whole. Stops at the first launch that fails. Past
// 2^31 - 1 blocks along x no device holds the data the blocks would cover.
template <typename LaunchGrid>
cudaError_t ForEachGrid(uint64_t x_blocks, uint64_t y_blocks, uint64_t z_blocks,
                        LaunchGrid launch_grid) {
  if (x_blocks > 0x7fffffffULL) return cudaErrorInvalidConfiguration;
  for (uint64_t z0 = 0; z0 < z_blocks; z0 += kMaxGridZ) {
    for (uint64_t y0 = 0; y0 < y_blocks; y0 += kMaxGridY) {
      launch_grid(
          dim3(static_cast<unsigned>(x_blocks),
               static_cast<unsigned>(std::min(kMaxGridY, y_blocks - y0)),
               static_cast<unsigned>(std::min(kMaxGridZ, z_blocks - z0))),
          y0, z0);
      if (cudaError_t error = cudaGetLastError(); error != cudaSuccess)
        return error;
    }
  }
  return cudaSuccess;
}

// Launches `kernel_fn` over `row_tiles` x `col_tiles` tiles per matrix, row
// tiles along grid x and tile columns along grid y (LocateTile maps them to
// the kernel's walk), batch entries along z.
template <typename Function, typename In, typename Out>
cudaError_t LaunchGrids(Function kernel_fn, dim3 block, size_t shared,
                        cudaStream_t stream, const In* in, Out* out,
                        uint64_t batch, uint64_t rows, uint64_t cols,
                        uint64_t row_tiles, uint64_t col_tiles) {
  return ForEachGrid(
      row_tiles, col_tiles, batch, [&](dim3 grid, uint64_t y0, uint64_t b0) {
        kernel_fn<<<grid, block, shared, stream>>>(in, out, rows, cols, y0, b0);
      });
}

template <typename T>
cudaError_t LaunchTyped(Kernel kernel, const TransposeArgs& args,
                        cudaStream_t stream, const Tuning& tuning) {
  const LaunchShape shape = ShapeOf(kernel);
  const T* in = static_cast<const T*>(args.input);
  T* out = static_cast<T*>(args.output);
  const size_t shared = SharedMemoryBytes(kernel, sizeof(T));
  void (*function)(const T*, T*, uint64_t, uint64_t, uint64_t, uint64_t) =
      nullptr;
  switch (kernel) {
    case Kernel::kNaive:
      function = NaiveTranspose<T, 32, 8>;
      break;
    case Kernel::kShared:
      function = TiledTranspose<T, 32, 8, 0>;
      break;
    case Kernel::kPadded32:
      function = TiledTranspose<T, 32, 8, 1>;
      break;
    case Kernel::kPadded64:
      function = TiledTranspose<T, 64, 16, 1>;
      break;
    case Kernel::kPadded64x8:
      function = ForTuning(tuning, TiledTranspose<T, 64, 8, 1, 0, false>,
                           TiledTranspose<T, 64, 8, 1, 0, true>,
                           TiledTranspose<T, 64, 8, 1, kTileRowGroup, false>,
                           TiledTranspose<T, 64, 8, 1, kTileRowGroup, true>);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  if (shared > 48 * 1024) {
    // Opting in past 48 KiB is per function and per device; a host-side
    // attribute, cheap enough to set on every launch.
    cudaError_t error = cudaFuncSetAttribute(
        function, cudaFuncAttributeMaxDynamicSharedMemorySize,
        static_cast<int>(shared));
    if (error != cudaSuccess) return error;
  }
  return LaunchGrids(function, dim3(shape.tile, shape.block_rows), shared,
                     stream, in, out, args.batch, args.rows, args.cols,
                     CeilDiv(args.rows, shape.tile),
                     CeilDiv(args.cols, shape.tile));
}

// Tile shapes for the vector kernel, per element size: 16 KiB tiles (8 KiB
// for narrow 2-byte matrices), 256 threads (1-byte elements:
// LaunchVectorBytes).
template <typename T>
struct VectorShape;
template <>
struct VectorShape<uint16_t> {
  static constexpr int kRows = 64, kCols = 128;
};
// For 2-byte matrices narrower than the tile, such as batches of 64 x 64: the
// 64 x 128 tile would be half empty, and an edge tile all the way.
struct NarrowVectorShape {
  static constexpr int kRows = 64, kCols = 64;
};
template <>
struct VectorShape<uint32_t> {
  static constexpr int kRows = 64, kCols = 64;
};
template <>
struct VectorShape<Element8> {
  static constexpr int kRows = 64, kCols = 32;
};
template <>
struct VectorShape<Element16> {
  static constexpr int kRows = 32, kCols = 32;
};

template <typename T, typename Shape = VectorShape<T>>
cudaError_t LaunchVector(const TransposeArgs& args, cudaStream_t stream,
                         const Tuning& tuning) {
  constexpr int kRows = Shape::kRows, kCols = Shape::kCols, kThreads = 256,
                kG = kTileRowGroup;
  const auto function =
      ForTuning(tuning, VectorTranspose<T, kRows, kCols, kThreads, 0, false>,
                VectorTranspose<T, kRows, kCols, kThreads, 0, true>,
                VectorTranspose<T, kRows, kCols, kThreads, kG, false>,
                VectorTranspose<T, kRows, kCols, kThreads, kG, true>);
  return LaunchGrids(
      function, dim3(kThreads), 0, stream, static_cast<const T*>(args.input),
      static_cast<T*>(args.output), args.batch, args.rows, args.cols,
      CeilDiv(args.rows, kRows), CeilDiv(args.cols, kCols));
}

// 1-byte elements: 128 x 256-byte tiles of 512 threads, each thread one
// column unit (64 x 128 tiles: 95-96%; 128 x 128: 93-97%; 256 threads on 128 x
// 256: within half a point).
constexpr int kVectorByteRows = 128, kVectorByteWords = 64;
cudaError_t LaunchVectorBytes(const TransposeArgs& args, cudaStream_t stream,
                              const Tuning& tuning) {
  constexpr int kRows = kVectorByteRows, kWords = kVectorByteWords,
                kThreads = 512, kG = kTileRowGroup;
  const auto function =
      ForTuning(tuning, VectorTransposeBytes<kRows, kWords, kThreads, 0, false>,
                VectorTransposeBytes<kRows, kWords, kThreads, 0, true>,
                VectorTransposeBytes<kRows, kWords, kThreads, kG, false>,
                VectorTransposeBytes<kRows, kWords, kThreads, kG, true>);
  return LaunchGrids(function, dim3(kThreads), 0, stream,
                     static_cast<const uint8_t*>(args.input),
                     static_cast<uint8_t*>(args.output), args.batch, args.rows,
                     args.cols, CeilDiv(args.rows, kRows),
                     CeilDiv(args.cols, kWords * 4));
}

cudaError_t LaunchWord(const TransposeArgs& args, cudaStream_t stream,
                       const Tuning& tuning) {
  constexpr int kRows = 128, kWords = 32, kThreads = 512, kG = kTileRowGroup;
  const auto function =
      ForTuning(tuning, WordTranspose<kRows, kWords, kThreads, 0, false>,
                WordTranspose<kRows, kWords, kThreads, 0, true>,
                WordTranspose<kRows, kWords, kThreads, kG, false>,
                WordTranspose<kRows, kWords, kThreads, kG, true>);
  // The kernel takes byte counts; its tiles are kRows x kWords words.
  return LaunchGrids(function, dim3(kThreads), 0, stream,
                     static_cast<const uint32_t*>(args.input),
                     static_cast<uint32_t*>(args.output), args.batch, args.rows,
                     args.cols, CeilDiv(args.rows, kRows),
                     CeilDiv(args.cols / 4, kWords));
}

// 128-element output windows for 1- and 2-byte elements, 512 threads: 256-
// element windows read 59-84% of memcpy where 128 read 74-94% (exploration
// 47), and tiles two words wide, on 256 or 512 threads, 45-59% against 70% at
// 1-byte 4096 x 4096 (explorations 42 and 44, windows on words).
template <typename T>
cudaError_t LaunchSkewedWords(const TransposeArgs& args, cudaStream_t stream) {
  constexpr int kWindow = 128, K = 4 / sizeof(T), kSector = 32 / sizeof(T),
                kCols = 32 * K - (K - 1);
  return LaunchGrids(SkewedWordsTranspose<T, kWindow>, dim3(512), 0, stream,
                     static_cast<const T*>(args.input),
                     static_cast<T*>(args.output), args.batch, args.rows,
                     args.cols, CeilDiv(args.rows + kSector - 1, kWindow),
                     CeilDiv(args.cols, kCols));
}

// 64-element output windows: 96 and 128 ran at 72% of memcpy for 4-byte
// elements on the H200, 64 at 93%.
template <typename T>
cudaError_t LaunchSkewed(const TransposeArgs& args, cudaStream_t stream) {
  constexpr int kWindow = 64, kSector = 32 / sizeof(T);
  return LaunchGrids(SkewedTranspose<T, kWindow>, dim3(64, 8), 0, stream,
                     static_cast<const T*>(args.input),
                     static_cast<T*>(args.output), args.batch, args.rows,
                     args.cols, CeilDiv(args.rows + kSector, kWindow),
                     CeilDiv(args.cols, 64));
}

// Groups of whole matrices, as many as fit kSmallMatricesSharedBytes (or one
// larger matrix), one per block, in one grid. Odd row
// counts scatter the input, others gather the output (SmallMatricesTranspose
// says why); with both even, gathering read faster for 2- and 8-byte 32 x 30
// matrices (88% against 75%, 117% against 79%), 5 points slower for 1-byte ones
// before the branch-free path (45% against 50%; 97% with it).
template <typename T>
cudaError_t LaunchSmallMatrices(const TransposeArgs& args,
                                cudaStream_t stream) {
  constexpr int kThreads = 256;
  const uint32_t rows = static_cast<uint32_t>(args.rows),
                 cols = static_cast<uint32_t>(args.cols), n = rows * cols;
  const uint32_t per_block = static_cast<uint32_t>(std::min<uint64_t>(
      args.batch, std::max<uint64_t>(1, kSmallMatricesSharedBytes /
                                            (uint64_t{n} * sizeof(T)))));
  const uint64_t groups = CeilDiv(args.batch, per_block);
  // A group's elements and the parts of the units at either end that are not.
  const size_t shared = per_block * n * sizeof(T) + 2 * sizeof(uint4);
  const auto kernel = rows % 2 == 1
                          ? SmallMatricesTranspose<T, kThreads, true>
                          : SmallMatricesTranspose<T, kThreads, false>;
  // A group holds at least 8 KiB unless it is the whole batch, so 2^31 groups
  // would be 16 TiB: one grid along x covers any batch a device holds.
  return ForEachGrid(groups, 1, 1, [&](dim3 grid, uint64_t, uint64_t) {
    kernel<<<grid, kThreads, shared, stream>>>(
        static_cast<const T*>(args.input), static_cast<T*>(args.output), rows,
        cols, per_block, args.batch, HeadElements<T>(args.input),
        HeadElements<T>(args.output), Divider(cols), Divider(rows), Divider(n));
  });
}

// Thin matrices of 1- and 2-byte elements with K = 2 to kThinGroupsMaxK
// (ThinGroupsTranspose): blocks of 1024 / K - 1 groups, about 16 KiB of each
// side.
template <typename T, int K>
cudaError_t LaunchThinGroups(const TransposeArgs& args, cudaStream_t stream) {
  constexpr int kThreads = 256;
  constexpr uint32_t E = sizeof(uint4) / sizeof(T);
  constexpr uint32_t kGroups = 1024 / K - 1;
  constexpr uint32_t span = kGroups * E;
  // The staged side: K runs of span / E + 1 units and their margins.
  constexpr size_t shared = sizeof(uint4) * K * (span / E + 4);
  static_assert(shared <= kThinMaxSharedBytes);
  const bool tall = args.cols <= args.rows;
  const uint64_t n = tall ? args.rows : args.cols;
  // Where each matrix's contiguous output starts on a unit, so does each
  // block's, and for K dividing E the kernel's K x N stores skip the shift
  // (attempt 40); for other K the variant only knows its head to be 0.
  const bool output_on_units =
      reinterpret_cast<uintptr_t>(args.output) % sizeof(uint4) == 0 &&
      (args.batch == 1 || n * K % E == 0);
  const auto kernel = tall ? ThinGroupsTranspose<T, K, kThreads, true>
                      : output_on_units
                          ? ThinGroupsTranspose<T, K, kThreads, false, true>
                          : ThinGroupsTranspose<T, K, kThreads, false, false>;
  return ForEachGrid(
      CeilDiv(n, span), args.batch, 1, [&](dim3 grid, uint64_t b0, uint64_t) {
        kernel<<<grid, kThreads, shared, stream>>>(
            static_cast<const T*>(args.input), static_cast<T*>(args.output), n,
            span, b0, HeadElements<T>(args.input), HeadElements<T>(args.output),
            Divider(span / E + 1));
      });
}

// The widest thin matrices that LaunchThin gives ThinGroupsTranspose. On the
// H200 (docs/BENCHMARKS.md, attempt 41) k = 12 and 16 read slower on it than
// on ThinTranspose: 1-byte N x k 46-53% of memcpy against 59-62%, 16 x N 49%
// against 53%, 2-byte N x 12 and N x 16 56-60% against 83-89%. Its N x k
// kernels take 75-115 registers from k = 9 (58-64 up to 8).
inline constexpr uint32_t kThinGroupsMaxK = 8;

// LaunchThinGroups<T, k> for k from K to kMaxK.
template <typename T, int K, int kMaxK>
cudaError_t LaunchThinGroupsFor(uint32_t k, const TransposeArgs& args,
                                cudaStream_t stream) {
  if constexpr (K < kMaxK) {
    if (k != K) return LaunchThinGroupsFor<T, K + 1, kMaxK>(k, args, stream);
  }
  return LaunchThinGroups<T, K>(args, stream);
}

// Thin matrices (ThinTranspose), one block per span of positions along N for
// one matrix of the batch, in grids of at most 65535 batch entries each.
// Blocks of about 16 KiB, with shared rows of at least 65 units (1 KiB runs)
// where 48 KiB allows (k up to 47). On the H200 (docs/BENCHMARKS.md, attempt
// 38, the kernel's first version) 16 KiB blocks read 99% of memcpy for 4-byte N
// x 3 against 89% for 32 KiB; for N x 32 86% against 88% (480-byte runs against
// 992), for N x 63 73% against 82% (224 against 480).
template <typename T>
cudaError_t LaunchThin(const TransposeArgs& args, cudaStream_t stream) {
  constexpr int kThreads = 256;
  constexpr uint32_t E = sizeof(uint4) / sizeof(T);
  const bool tall = args.cols <= args.rows;
  const uint32_t k = static_cast<uint32_t>(tall ? args.cols : args.rows);
  const uint64_t n = tall ? args.rows : args.cols;
  // ThinGroupsTranspose where it reads faster (attempts 39 to 42): 1-byte
  // elements with k = 2 to 8 both ways; 2-byte k x N with k = 2 to 4 and 8,
  // and N x 4. 2-byte 5 x N to 7 x N read 60-66% of memcpy on it against
  // 89-94% on ThinTranspose (H100); the likely cost is the selects that shift
  // their output units by two words or more.
  if constexpr (sizeof(T) == 1) {
    if (k >= 2 && k <= kThinGroupsMaxK) {
      return LaunchThinGroupsFor<T, 2, kThinGroupsMaxK>(k, args, stream);
    }
  } else if constexpr (sizeof(T) == 2) {
    if (tall ? k == 4 : k >= 2 && k <= 4) {
      return LaunchThinGroupsFor<T, 2, 4>(k, args, stream);
    }
    if (!tall && k == 8) return LaunchThinGroups<T, 8>(args, stream);
  }
  const uint32_t row_bytes = k * sizeof(uint4);
  uint32_t row_units =
      std::min<uint32_t>(std::max<uint32_t>((16 << 10) / row_bytes, 65),
                         kThinMaxSharedBytes / row_bytes);
  if (row_units % 2 == 0) --row_units;
  const uint32_t span = (row_units - 1) * E;
  const size_t shared = size_t{k} * row_units * sizeof(uint4);
  const auto kernel = tall ? ThinTranspose<T, kThreads, true>
                           : ThinTranspose<T, kThreads, false>;
  return ForEachGrid(
      CeilDiv(n, span), args.batch, 1, [&](dim3 grid, uint64_t b0, uint64_t) {
        kernel<<<grid, kThreads, shared, stream>>>(
            static_cast<const T*>(args.input), static_cast<T*>(args.output), k,
            n, span, row_units, b0, HeadElements<T>(args.input),
            HeadElements<T>(args.output), Divider(k), Divider(row_units));
      });
}
}  // namespace

namespace {
__global__ void WriteToInvalidAddress(uint64_t* target) { *target = 1; }

__device__ uint64_t GlobalTimerNs() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

__global__ void SpinFor(uint64_t ns) {
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < ns) {
  }
}
}  // namespace

int LaunchFaultForTesting(void* stream) {
  WriteToInvalidAddress<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      reinterpret_cast<uint64_t*>(uintptr_t{8}));
  return cudaGetLastError();
}

int LaunchSpinForTesting(void* stream, double seconds) {
  SpinFor<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<uint64_t>(seconds * 1e9));
  return cudaGetLastError();
}

bool CanVectorize(const TransposeArgs& args) {
  const auto aligned = [](const void* p) {
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
  };
  return (args.rows * args.element_size) % 16 == 0 &&
         (args.cols * args.element_size) % 16 == 0 && aligned(args.input) &&
         aligned(args.output);
}

bool CanSkew(const TransposeArgs& args) {
  return args.element_size == 1 || args.element_size == 2 ||
         args.element_size == 4 || args.element_size == 8;
}

bool TakesSmallMatrices(const TransposeArgs& args) {
  // Past 2^32 rows or columns the product below could wrap; such matrices are
  // far from small anyway.
  if (args.element_size == 0 || args.batch == 0 || args.rows == 0 ||
      args.cols == 0 || args.rows >= (uint64_t{1} << 32) ||
      args.cols >= (uint64_t{1} << 32)) {
    return false;
  }
  return args.rows * args.cols <= kSmallMatricesMaxBytes / args.element_size;
}

bool TakesThin(const TransposeArgs& args) {
  if (args.element_size == 0 || args.rows == 0 || args.cols == 0) return false;
  return std::min(args.rows, args.cols) <= kThinMaxK;
}

TileShape VectorTileOf(const TransposeArgs& args) {
  switch (args.element_size) {
    case 1:
      return {kVectorByteRows, kVectorByteWords * 4};
    case 2:
      return args.cols < VectorShape<uint16_t>::kCols
                 ? TileShape{NarrowVectorShape::kRows, NarrowVectorShape::kCols}
                 : TileShape{VectorShape<uint16_t>::kRows,
                             VectorShape<uint16_t>::kCols};
    case 4:
      return {VectorShape<uint32_t>::kRows, VectorShape<uint32_t>::kCols};
    case 8:
      return {VectorShape<Element8>::kRows, VectorShape<Element8>::kCols};
  }
  return {VectorShape<Element16>::kRows, VectorShape<Element16>::kCols};
}

bool CanUseWords(const TransposeArgs& args) {
  const auto aligned = [](const void* p) {
    return reinterpret_cast<uintptr_t>(p) % 4 == 0;
  };
  return args.element_size == 1 && args.rows % 4 == 0 && args.cols % 4 == 0 &&
         aligned(args.input) && aligned(args.output);
}

size_t SharedMemoryBytes(Kernel kernel, size_t element_size) {
  // The naive kernel uses none; the vector, word and skewed kernels declare
  // theirs statically.
  if (kernel == Kernel::kNaive || kernel == Kernel::kVector ||
      kernel == Kernel::kWord || kernel == Kernel::kSkewed)
    return 0;
  // At most, for any shape it takes.
  if (kernel == Kernel::kSmallMatrices)
    return kSmallMatricesMaxBytes + 2 * sizeof(uint4);
  if (kernel == Kernel::kThin) return kThinMaxSharedBytes;
  const LaunchShape shape = ShapeOf(kernel);
  return static_cast<size_t>(shape.tile) * (shape.tile + shape.pad) *
         element_size;
}

bool SupportsTuning(Kernel kernel) {
  return kernel == Kernel::kPadded64x8 || kernel == Kernel::kVector ||
         kernel == Kernel::kWord;
}

static_assert(kTileRowGroup == 32, "TuningNameOf names groups of 32");
const char* TuningNameOf(const Tuning& tuning) {
  if (tuning.grouped_tile_rows) {
    return tuning.input_evict_last ? "groups of 32 tile rows, evict-last input"
                                   : "groups of 32 tile rows";
  }
  return tuning.input_evict_last ? "column-major, evict-last input"
                                 : "column-major";
}

namespace {
// Calls `launch` with a value of the element type the kernels move for
// `element_size`-byte elements (the launchers take it as their template
// argument); cudaErrorInvalidValue for other sizes.
template <typename Launch>
cudaError_t ForElementSize(size_t element_size, const Launch& launch) {
  switch (element_size) {
    case 1:
      return launch(uint8_t{});
    case 2:
      return launch(uint16_t{});
    case 4:
      return launch(uint32_t{});
    case 8:
      return launch(uint64_t{});
    case 16:
      return launch(Element16{});
  }
  return cudaErrorInvalidValue;
}
}  // namespace

int Launch(Kernel kernel, const TransposeArgs& args, void* stream,
           const Tuning& tuning) {
  cudaStream_t cuda_stream = static_cast<cudaStream_t>(stream);
  if (!SupportsTuning(kernel) && !(tuning == Tuning{})) {
    return cudaErrorInvalidValue;
  }
  if (kernel == Kernel::kVector) {
    if (!CanVectorize(args)) return cudaErrorInvalidValue;
    switch (args.element_size) {
      case 1:
        return LaunchVectorBytes(args, cuda_stream, tuning);
      case 2:
        return VectorTileOf(args).cols == NarrowVectorShape::kCols
                   ? LaunchVector<uint16_t, NarrowVectorShape>(
                         args, cuda_stream, tuning)
                   : LaunchVector<uint16_t>(args, cuda_stream, tuning);
      case 4:
        return LaunchVector<uint32_t>(args, cuda_stream, tuning);
      case 8:
        return LaunchVector<Element8>(args, cuda_stream, tuning);
      case 16:
        return LaunchVector<Element16>(args, cuda_stream, tuning);
    }
    return cudaErrorInvalidValue;
  }
  if (kernel == Kernel::kWord) {
    if (!CanUseWords(args)) return cudaErrorInvalidValue;
    return LaunchWord(args, cuda_stream, tuning);
  }
  if (kernel == Kernel::kSmallMatrices) {
    if (!TakesSmallMatrices(args)) return cudaErrorInvalidValue;
    return ForElementSize(args.element_size, [&](auto element) {
      return LaunchSmallMatrices<decltype(element)>(args, cuda_stream);
    });
  }
  if (kernel == Kernel::kThin) {
    if (!TakesThin(args)) return cudaErrorInvalidValue;
    return ForElementSize(args.element_size, [&](auto element) {
      return LaunchThin<decltype(element)>(args, cuda_stream);
    });
  }
  if (kernel == Kernel::kSkewed) {
    switch (args.element_size) {
      case 1:
        return LaunchSkewedWords<uint8_t>(args, cuda_stream);
      case 2:
        return LaunchSkewedWords<uint16_t>(args, cuda_stream);
      case 4:
        return LaunchSkewed<uint32_t>(args, cuda_stream);
      case 8:
        return LaunchSkewed<uint64_t>(args, cuda_stream);
    }
    return cudaErrorInvalidValue;
  }
  return ForElementSize(args.element_size, [&](auto element) {
    return LaunchTyped<decltype(element)>(kernel, args, cuda_stream, tuning);
  });
}

}  // namespace transpose::kernels::internal
