// The CPU transpose next to memcpy of the same bytes, in one run (Google
// Benchmark). Each row times the transpose and, just before it, a memcpy of the
// same bytes on the same threads, and reports both bandwidths and their ratio.
// Bandwidth counts bytes read plus bytes written.
//
//   cpu_transpose_benchmark [--benchmark_filter=...] [--benchmark_min_time=1]
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
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
  const double memcpy_gbps = 2.0 * bytes / memcpy_seconds / 1e9;
  state.counters["GBps"] = benchmark::Counter(
      2.0 * bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
  state.counters["memcpy_GBps"] = memcpy_gbps;
  state.counters["of_memcpy"] =
      benchmark::Counter(2.0 * bytes * state.iterations() / 1e9 / memcpy_gbps,
                         benchmark::Counter::kIsRate);
}

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
    ->ArgNames({"size", "rows", "cols", "huge"})
    ->Unit(benchmark::kMillisecond)
    ->UseManualTime();

}  // namespace
}  // namespace transpose::kernels

BENCHMARK_MAIN();
