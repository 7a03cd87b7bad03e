#include "kernels/cpu_transpose.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>

#include "absl/status/status.h"

namespace transpose::kernels {
namespace {

// Below this many bytes, waking other threads costs more than it saves.
constexpr uint64_t kParallelMinBytes = 1 << 20;

struct alignas(16) Element16 {
  uint64_t lo, hi;
};

// Square tile edge, in elements, sized so that a tile of input plus one of
// output stays in L1 (2 x 64 x 64 x 4 bytes = 32 KiB for float32).
template <typename T>
constexpr uint64_t TileEdge() {
  return sizeof(T) <= 4 ? 64 : 32;
}

template <typename T>
void TransposeTile(const T* __restrict in, T* __restrict out, uint64_t rows,
                   uint64_t cols, uint64_t r0, uint64_t r1, uint64_t c0,
                   uint64_t c1) {
  // Walk the output row by row so writes stream; the reads stride but stay
  // within the tile's cache lines, which the first output row pulled in.
  for (uint64_t c = c0; c < c1; ++c) {
    T* out_row = out + c * rows;
    for (uint64_t r = r0; r < r1; ++r) out_row[r] = in[r * cols + c];
  }
}

template <typename T>
void TransposeTyped(const TransposeArgs& args, int threads) {
  constexpr uint64_t kTile = TileEdge<T>();
  const uint64_t rows = args.rows;
  const uint64_t cols = args.cols;
  const uint64_t row_tiles = (rows + kTile - 1) / kTile;
  const uint64_t col_tiles = (cols + kTile - 1) / kTile;
  const uint64_t tiles_per_matrix = row_tiles * col_tiles;
  const uint64_t total_tiles = args.batch * tiles_per_matrix;
  const T* in = static_cast<const T*>(args.input);
  T* out = static_cast<T*>(args.output);
  const int64_t n = static_cast<int64_t>(total_tiles);
  // Tiles are numbered column-tile-major within a matrix, so consecutive tiles
  // write consecutive output rows and a static schedule hands each thread a
  // contiguous band of output.
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int64_t t = 0; t < n; ++t) {
    const uint64_t b = static_cast<uint64_t>(t) / tiles_per_matrix;
    const uint64_t in_matrix = static_cast<uint64_t>(t) % tiles_per_matrix;
    const uint64_t ct = in_matrix / row_tiles;
    const uint64_t rt = in_matrix % row_tiles;
    const uint64_t offset = b * rows * cols;
    const uint64_t r0 = rt * kTile, c0 = ct * kTile;
    TransposeTile(in + offset, out + offset, rows, cols, r0,
                  std::min(r0 + kTile, rows), c0, std::min(c0 + kTile, cols));
  }
}

}  // namespace

int CpuThreads(int max_threads) {
  if (max_threads > 0) return max_threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

absl::Status TransposeOnCpu(const TransposeArgs& args, int max_threads) {
  if (absl::Status status = CheckArgs(args); !status.ok()) return status;
  const int threads =
      args.bytes() < kParallelMinBytes ? 1 : CpuThreads(max_threads);
  switch (args.element_size) {
    case 1:
      TransposeTyped<uint8_t>(args, threads);
      break;
    case 2:
      TransposeTyped<uint16_t>(args, threads);
      break;
    case 4:
      TransposeTyped<uint32_t>(args, threads);
      break;
    case 8:
      TransposeTyped<uint64_t>(args, threads);
      break;
    case 16:
      TransposeTyped<Element16>(args, threads);
      break;
  }
  return absl::OkStatus();
}

void ParallelMemcpy(void* dst, const void* src, size_t bytes, int max_threads) {
  const int threads = bytes < kParallelMinBytes ? 1 : CpuThreads(max_threads);
  const size_t chunk = (bytes + threads - 1) / threads;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int i = 0; i < threads; ++i) {
    const size_t begin = std::min(bytes, i * chunk);
    const size_t end = std::min(bytes, begin + chunk);
    std::memcpy(static_cast<char*>(dst) + begin,
                static_cast<const char*>(src) + begin, end - begin);
  }
}

}  // namespace transpose::kernels
