// The host transpose: the server's CPU backend and the reference the GPU tests
// compare against.
#ifndef TRANSPOSE_KERNELS_CPU_TRANSPOSE_H_
#define TRANSPOSE_KERNELS_CPU_TRANSPOSE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "kernels/transpose_args.h"

namespace transpose::kernels {

// Cache-blocked, multithreaded out-of-place transpose of host memory. Runs on
// up to `max_threads` threads (0: one per core); small matrices run on the
// calling thread alone. Returns the CheckArgs error for bad args, else OK.
absl::Status TransposeOnCpu(const TransposeArgs& args, int max_threads = 0);

// Row ranges handed to TransposeRowsOnCpu start and end on multiples of this
// many rows (or at the end of a matrix).
inline constexpr uint64_t kCpuRowGranule = 64;

// Input rows [first, last) counted across the batch: row r of matrix b is b *
// rows + r.
struct RowRange {
  uint64_t first = 0;
  uint64_t last = 0;
};

// Transposes only the input rows in `range` (into the matching output columns):
// what a caller does while the rest of the input is still arriving. Runs on up
// to `max_threads` threads (0: one per core), by default on the calling thread
// alone. Disjoint ranges may run concurrently. INVALID_ARGUMENT for bad args or
// a range off the granule.
absl::Status TransposeRowsOnCpu(const TransposeArgs& args,
                                const RowRange& range, int max_threads = 1);

// Input bytes [offset, offset + size) of a matrix (or batch), held at `data`
// rather than in one buffer with the rest: how a transport delivers a message.
struct InputPiece {
  uint64_t offset = 0;
  const void* data = nullptr;
  uint64_t size = 0;
};

// Whether TransposeRowsFromPiecesOnCpu takes this shape: rows and columns are
// multiples of a cache line's worth of elements (64 bytes), so the transpose
// has no edge blocks and reads every input line whole.
bool CanTransposeFromPieces(const TransposeArgs& args);

// As TransposeRowsOnCpu, but the input comes from `pieces` (sorted by offset,
// without gaps, covering at least the range's bytes) and args.input is
// ignored: the transpose reads the data where the transport left it instead of
// after a copy into one buffer. Runs on up to `max_threads` threads (0: one per
// core), as TransposeOnCpu does; by default on the calling thread alone.
// INVALID_ARGUMENT for a shape it does not take, a range off the granule or
// pieces that do not cover it.
absl::Status TransposeRowsFromPiecesOnCpu(const TransposeArgs& args,
                                          const RowRange& range,
                                          absl::Span<const InputPiece> pieces,
                                          int max_threads = 1);

// Host memcpy of `bytes` split over the same threads TransposeOnCpu would use:
// the CPU backend's ceiling, measured at start-up like a GPU's device-to-device
// copy.
void ParallelMemcpy(void* dst, const void* src, size_t bytes,
                    int max_threads = 0);

// Threads TransposeOnCpu and ParallelMemcpy use for `max_threads` (resolving
// 0 to UsableCores()).
int CpuThreads(int max_threads);

// The cores this process may run on: those of its CPU affinity (taskset, a
// container's cpuset), no more than its cgroup's CPU quota (cgroup v2 or v1,
// server/core/cgroup.h), at least 1. A container
// limited to 4 CPUs on a 64-core node counts 4, where
// std::thread::hardware_concurrency() counts 64.
int UsableCores();

namespace internal {
// UsableCores() without its cache: reads the affinity and cgroup files now.
int CountUsableCores();
}  // namespace internal

}  // namespace transpose::kernels

#endif  // TRANSPOSE_KERNELS_CPU_TRANSPOSE_H_
