#include "kernels/cpu_transpose.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "kernels/cpu_transpose_tiles.h"

namespace transpose::kernels {
namespace {

// Below this many bytes, waking other threads costs more than it saves.
constexpr uint64_t kParallelMinBytes = 1 << 20;

}  // namespace

namespace internal {
void TransposePortable(const TransposeArgs& args, const RowRange& range,
                       int threads) {
  TransposeBySize<ScalarMicro>(args, range, threads);
}
}  // namespace internal

int CpuThreads(int max_threads) {
  if (max_threads > 0) return max_threads;
  return std::max(1u, std::thread::hardware_concurrency());
}

namespace {

void Dispatch(const TransposeArgs& args, const RowRange& range, int threads) {
  static const bool avx2 = internal::HaveAvx2();
  if (avx2) {
    internal::TransposeAvx2(args, range, threads);
  } else {
    internal::TransposePortable(args, range, threads);
  }
}

}  // namespace

absl::Status TransposeOnCpu(const TransposeArgs& args, int max_threads) {
  if (absl::Status status = CheckArgs(args); !status.ok()) return status;
  const int threads =
      args.bytes() < kParallelMinBytes ? 1 : CpuThreads(max_threads);
  Dispatch(args, {0, args.batch * args.rows}, threads);
  return absl::OkStatus();
}

absl::Status TransposeRowsOnCpu(const TransposeArgs& args,
                                const RowRange& range) {
  if (absl::Status status = CheckArgs(args); !status.ok()) return status;
  const uint64_t total = args.batch * args.rows;
  auto on_granule = [&](uint64_t row) {
    return row == total || row % args.rows == 0 ||
           row % args.rows % kCpuRowGranule == 0;
  };
  if (range.first >= range.last || range.last > total ||
      !on_granule(range.first) || !on_granule(range.last)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "row range [%d, %d) of %d rows is empty or off the %d-row granule",
        range.first, range.last, total, kCpuRowGranule));
  }
  Dispatch(args, range, 1);
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
