// The CPU transpose next to memcpy of the same bytes, in one run (Google
// Benchmark). Each row times the transpose and, just before it, a memcpy of the
// same bytes on the same threads, and reports both bandwidths and their ratio.
// Bandwidth counts bytes read plus bytes written.
//
// BM_TransposeBandsFromPieces is the CPU backend's streamed path: the input
// arrives in 64 KiB pieces, each band of rows is copied into its pieces (as a
// socket read leaves it, in cache) and then transposed from them on one
// thread; it reports the transpose next to that copy of the same bytes.
//
//   cpu_transpose_benchmark [--benchmark_filter=...] [--benchmark_min_time=1]
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu_transpose.h"

namespace transpose::kernels {
namespace {

using Clock = std::chrono::steady_clock;

// Whole pages from mmap, as the server's buffer pools allocate; with
// `huge_pages`, advised onto transparent huge pages, as the pools do for
// buffers of 8 MiB and more.
struct Buffer {
  Buffer(size_t bytes, uint8_t fill, bool huge_pages)
      : size((bytes + 4095) / 4096 * 4096),
        data(static_cast<uint8_t*>(mmap(nullptr, size, PROT_READ | PROT_WRITE,
                                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))) {
    if (data == MAP_FAILED) {
      std::perror("mmap");
      std::exit(1);
    }
    // Either way explicitly, so the comparison holds where THP is "always".
    madvise(data, size, huge_pages ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    for (size_t i = 0; i < bytes; i += 64)
      data[i] = static_cast<uint8_t>(fill + (i >> 6));
  }
  ~Buffer() { munmap(data, size); }
  size_t size;
  uint8_t* data;
};

// Median of 7 timed ParallelMemcpy runs, after one warm-up, in seconds.
double MemcpySeconds(uint8_t* dst, const uint8_t* src, size_t bytes) {
  ParallelMemcpy(dst, src, bytes);
  std::vector<double> seconds;
  for (int i = 0; i < 7; ++i) {
    const auto start = Clock::now();
    ParallelMemcpy(dst, src, bytes);
    seconds.push_back(
        std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

// Reports the transpose's bandwidth (from the iteration times) next to the
// reference's, measured in the same run: GBps, <reference>_GBps and
// of_<reference>.
void ReportAgainst(benchmark::State& state, uint64_t bytes,
                   const std::string& reference, double reference_gbps) {
  const double gigabytes = 2.0 * bytes * state.iterations() / 1e9;
  state.counters["GBps"] =
      benchmark::Counter(gigabytes, benchmark::Counter::kIsRate);
  state.counters[reference + "_GBps"] = reference_gbps;
  state.counters["of_" + reference] = benchmark::Counter(
      gigabytes / reference_gbps, benchmark::Counter::kIsRate);
}

void BM_Transpose(benchmark::State& state) {
  const uint64_t size = state.range(0), rows = state.range(1),
                 cols = state.range(2);
  const bool huge_pages = state.range(3) != 0;
  const uint64_t bytes = size * rows * cols;
  Buffer src(bytes, 0, huge_pages), dst(bytes, 1, huge_pages);
  const double memcpy_seconds = MemcpySeconds(dst.data, src.data, bytes);
  const TransposeArgs args{size, 1, rows, cols, src.data, dst.data};
  if (!TransposeOnCpu(args).ok()) state.SkipWithError("bad args");  // Warm-up.
  for (auto _ : state) {
    const auto start = Clock::now();
    if (!TransposeOnCpu(args).ok()) state.SkipWithError("bad args");
    benchmark::ClobberMemory();
    state.SetIterationTime(
        std::chrono::duration<double>(Clock::now() - start).count());
  }
  ReportAgainst(state, bytes, "memcpy", 2.0 * bytes / memcpy_seconds / 1e9);
}

void BM_TransposeBandsFromPieces(benchmark::State& state) {
  const uint64_t size = state.range(0), rows = state.range(1),
                 cols = state.range(2);
  const uint64_t bytes = size * rows * cols;
  // gRPC's read size and the CPU backend's default band.
  constexpr uint64_t kPieceBytes = 64 << 10;
  constexpr uint64_t kBandBytes = 2 << 20;
  Buffer source(bytes, 0, /*huge_pages=*/true);
  Buffer dst(bytes, 1, /*huge_pages=*/true);
  std::vector<std::unique_ptr<uint8_t[]>> storage;
  std::vector<InputPiece> pieces;
  for (uint64_t offset = 0; offset < bytes; offset += kPieceBytes) {
    const uint64_t n = std::min(kPieceBytes, bytes - offset);
    storage.emplace_back(new uint8_t[n]);
    pieces.push_back({offset, storage.back().get(), n});
  }
  const TransposeArgs args{size, 1, rows, cols, nullptr, dst.data};
  if (!CanTransposeFromPieces(args)) {
    state.SkipWithError("shape has edge blocks");
    return;
  }
  const uint64_t row_bytes = cols * size;
  const uint64_t band_rows = std::max(
      kCpuRowGranule, kBandBytes / row_bytes / kCpuRowGranule * kCpuRowGranule);
  double copy_seconds = 0;
  auto run = [&]() {
    double transpose_seconds = 0;
    for (uint64_t first = 0; first < rows; first += band_rows) {
      const RowRange range{first, std::min(rows, first + band_rows)};
      const uint64_t begin = range.first * row_bytes / kPieceBytes;
      const uint64_t end =
          (range.last * row_bytes + kPieceBytes - 1) / kPieceBytes;
      const auto arrived = Clock::now();
      for (uint64_t i = begin; i < end; ++i) {
        std::memcpy(const_cast<void*>(pieces[i].data),
                    source.data + pieces[i].offset, pieces[i].size);
      }
      const auto start = Clock::now();
      const absl::Span<const InputPiece> band(pieces.data() + begin,
                                              end - begin);
      if (!TransposeRowsFromPiecesOnCpu(args, range, band).ok()) return -1.0;
      const auto stop = Clock::now();
      copy_seconds += std::chrono::duration<double>(start - arrived).count();
      transpose_seconds += std::chrono::duration<double>(stop - start).count();
    }
    return transpose_seconds;
  };
  if (run() < 0) state.SkipWithError("transpose failed");  // Warm-up.
  copy_seconds = 0;
  for (auto _ : state) {
    const double seconds = run();
    if (seconds < 0) state.SkipWithError("transpose failed");
    benchmark::ClobberMemory();
    state.SetIterationTime(seconds);
  }
  ReportAgainst(state, bytes, "copy_in",
                2.0 * bytes * state.iterations() / copy_seconds / 1e9);
}

// {element size, rows, cols}: a 64 MiB float32 request, and the other element
// sizes at 64 MiB.
BENCHMARK(BM_TransposeBandsFromPieces)
    ->Args({4, 4096, 4096})
    ->Args({1, 8192, 8192})
    ->Args({2, 4096, 8192})
    ->Args({8, 2048, 4096})
    ->Args({16, 2048, 2048})
    ->ArgNames({"size", "rows", "cols"})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

// {element size, rows, cols, huge pages}; the rows without huge pages show
// what they are worth.
BENCHMARK(BM_Transpose)
    ->Args({4, 8192, 8192, 1})
    ->Args({4, 8192, 8192, 0})
    ->Args({4, 4096, 4096, 1})
    ->Args({4, 4096, 4096, 0})
    ->Args({1, 16384, 16384, 1})
    ->Args({2, 8192, 8192, 1})
    ->Args({8, 4096, 4096, 1})
    ->Args({16, 2048, 2048, 1})
    ->Args({4, 12345, 6789, 1})
    ->Args({4, 8, 8 << 20, 1})  // Short and wide: one strip of rows.
    ->ArgNames({"size", "rows", "cols", "huge"})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

}  // namespace
}  // namespace transpose::kernels

BENCHMARK_MAIN();
