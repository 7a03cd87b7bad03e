// The host transpose: the server's CPU backend and the reference the GPU tests
// compare against.
#ifndef TRANSPOSE_KERNELS_CPU_TRANSPOSE_H_
#define TRANSPOSE_KERNELS_CPU_TRANSPOSE_H_

#include "absl/status/status.h"
#include "kernels/transpose_args.h"

namespace transpose::kernels {

// Cache-blocked, multithreaded out-of-place transpose of host memory. Runs on
// up to `max_threads` threads (0: one per core); small matrices run on the
// calling thread alone. Returns the CheckArgs error for bad args, else OK.
absl::Status TransposeOnCpu(const TransposeArgs& args, int max_threads = 0);

// Host memcpy of `bytes` split over the same threads TransposeOnCpu would use:
// the CPU backend's ceiling, measured at start-up like a GPU's device-to-device
// copy.
void ParallelMemcpy(void* dst, const void* src, size_t bytes,
                    int max_threads = 0);

// Threads TransposeOnCpu and ParallelMemcpy use for `max_threads` (resolving
// 0).
int CpuThreads(int max_threads);

}  // namespace transpose::kernels

#endif  // TRANSPOSE_KERNELS_CPU_TRANSPOSE_H_
