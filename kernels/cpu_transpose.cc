#include "kernels/cpu_transpose.h"

#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "kernels/cpu_transpose_tiles.h"
#include "server/core/cgroup.h"

namespace transpose::kernels {
namespace {

// Below this many bytes, waking other threads costs more than it saves.
constexpr uint64_t kParallelMinBytes = 1 << 20;

}  // namespace

namespace internal {
void TransposePortable(const TransposeArgs& args, const RowRange& range,
                       int threads, absl::Span<const InputPiece> pieces) {
  TransposeBySize<ScalarMicro>(args, range, threads, pieces);
}
}  // namespace internal

int CpuThreads(int max_threads) {
  if (max_threads > 0) return max_threads;
  return UsableCores();
}

namespace internal {

int CountUsableCores() {
  int cores =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu_set_t affinity;
  if (sched_getaffinity(0, sizeof(affinity), &affinity) == 0) {
    cores = std::max(1, CPU_COUNT(&affinity));
  }
  if (const std::optional<int> limit = CurrentCgroupLimits().cpu_cores) {
    cores = std::min(cores, std::max(1, *limit));
  }
  return cores;
}

}  // namespace internal

int UsableCores() {
  // Once: the files are read at start-up, not on every transpose.
  static const int cores = internal::CountUsableCores();
  return cores;
}

namespace {

void Dispatch(const TransposeArgs& args, const RowRange& range, int threads,
              absl::Span<const InputPiece> pieces = {}) {
  static const bool avx2 = internal::HaveAvx2();
  static const bool avx512 = internal::HaveAvx512();
  if (avx512 && internal::Avx512Takes(args)) {
    internal::TransposeAvx512(args, range, threads, pieces);
  } else if (avx2) {
    internal::TransposeAvx2(args, range, threads, pieces);
  } else {
    internal::TransposePortable(args, range, threads, pieces);
  }
}

absl::Status CheckRowRange(const TransposeArgs& args, const RowRange& range) {
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
  return absl::OkStatus();
}

// Whether a shape that passed CheckShape splits into whole 64-byte blocks, as
// reading from pieces needs.
bool HasNoEdgeBlocks(const TransposeArgs& args) {
  const uint64_t line_elements = 64 / args.element_size;
  return args.rows % line_elements == 0 && args.cols % line_elements == 0;
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
                                const RowRange& range, int max_threads) {
  if (absl::Status status = CheckArgs(args); !status.ok()) return status;
  if (absl::Status status = CheckRowRange(args, range); !status.ok()) {
    return status;
  }
  const uint64_t bytes =
      (range.last - range.first) * args.cols * args.element_size;
  Dispatch(args, range,
           bytes < kParallelMinBytes ? 1 : CpuThreads(max_threads));
  return absl::OkStatus();
}

bool CanTransposeFromPieces(const TransposeArgs& args) {
  return CheckShape(args).ok() && HasNoEdgeBlocks(args);
}

absl::Status TransposeRowsFromPiecesOnCpu(const TransposeArgs& args,
                                          const RowRange& range,
                                          absl::Span<const InputPiece> pieces,
                                          int max_threads) {
  if (absl::Status status = CheckShape(args); !status.ok()) return status;
  if (!HasNoEdgeBlocks(args)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a %dx%d matrix of %d-byte elements has edge blocks: transpose it "
        "from one buffer",
        args.rows, args.cols, args.element_size));
  }
  if (args.output == nullptr) {
    return absl::InvalidArgumentError("null output buffer");
  }
  if (absl::Status status =
          CheckAligned("output", args.output, args.element_size);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckRowRange(args, range); !status.ok()) {
    return status;
  }
  const uint64_t row_bytes = args.cols * args.element_size;
  const uint64_t begin = range.first * row_bytes;
  const uint64_t end = range.last * row_bytes;
  bool covered = !pieces.empty() && pieces.front().offset <= begin;
  for (size_t i = 0; covered && i < pieces.size(); ++i) {
    covered = (pieces[i].size == 0 || pieces[i].data != nullptr) &&
              (i == 0 ||
               pieces[i].offset == pieces[i - 1].offset + pieces[i - 1].size);
  }
  if (!covered || pieces.back().offset + pieces.back().size < end) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the input pieces do not cover bytes [%d, %d) without gaps", begin,
        end));
  }
  const int threads =
      end - begin < kParallelMinBytes ? 1 : CpuThreads(max_threads);
  Dispatch(args, range, threads, pieces);
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
