// Closed-loop load from one process: `concurrency` threads, each sending the
// next request when the last one returns, for a duration or a count. What
// `transpose bench` runs.
#ifndef TRANSPOSE_CLIENT_BENCH_H_
#define TRANSPOSE_CLIENT_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/client.h"

namespace transpose {

struct BenchOptions {
  int concurrency = 1;
  // Runs for `duration`, unless `count` > 0: then exactly `count` requests.
  absl::Duration duration = absl::Seconds(10);
  uint64_t count = 0;
  DataType dtype = DataType::kFloat32;
  MatrixShape shape{1, 1024, 1024};
  // Every request's options. Once call.canceller is cancelled, the run ends:
  // no request starts, those in flight end CANCELLED and are counted apart.
  CallOptions call;
  // Checks every result against the CPU transpose.
  bool verify = false;
};

struct BenchReport {
  uint64_t requests = 0;  // Succeeded.
  uint64_t errors = 0;
  // Ended early by call.canceller, and the requests it cut short (in flight,
  // or ended as they began).
  bool stopped = false;
  uint64_t cancelled = 0;
  absl::Status first_error;
  double seconds = 0;
  uint64_t matrix_bytes = 0;
  double requests_per_second = 0;
  // (bytes sent + bytes received) / seconds.
  double bytes_per_second = 0;
  double p50_seconds = 0, p90_seconds = 0, p99_seconds = 0, max_seconds = 0;
  // Mean server-reported kernel bandwidth and fraction of peak.
  double kernel_bandwidth_bytes_per_second = 0;
  double kernel_peak_fraction = 0;
  std::string backend;
  std::string algorithm;
};

inline constexpr int kMaxBenchConcurrency = 1024;

// INVALID_ARGUMENT, naming the option as the CLI's flag does, for options
// that cannot run: concurrency outside 1 to kMaxBenchConcurrency, no count and
// a duration that is not positive, a shape with a zero or overflowing
// dimension.
absl::Status CheckBenchOptions(const BenchOptions& options);

// Whether this machine has the memory for the bench, asked before anything is
// allocated: RESOURCE_EXHAUSTED when its buffers (the input, the expected
// result, one result per request in flight), its workers' stacks and
// `call_bytes` for gRPC's calls exceed the memory this process may still take.
// Once the client has called, gRPC has mapped part of CallMemoryBytes, which
// the caller leaves out of `call_bytes`. CheckBenchOptions first.
absl::Status CheckBenchMemory(const BenchOptions& options,
                              uint64_t call_bytes = CallMemoryBytes());

// Whether the bench can run against this server, asked before anything is
// allocated or timed: RESOURCE_EXHAUSTED for a matrix over the server's limit,
// or GetServerInfo's error, which waits `info_timeout` at most.
absl::Status CheckBenchFits(Client& client, const BenchOptions& options,
                            absl::Duration info_timeout = absl::Seconds(5));

// The nearest-rank percentile (0 < p <= 1) of `sorted` values: the smallest
// value with at least p of them at or below it. 0 for none.
double NearestRankPercentile(const std::vector<double>& sorted, double p);

// Runs the bench; CheckBenchOptions first (CheckBenchMemory and CheckBenchFits
// are the caller's). RESOURCE_EXHAUSTED where its buffers cannot be allocated.
absl::StatusOr<BenchReport> RunBench(Client& client,
                                     const BenchOptions& options);

// Human-readable summary, several lines.
std::string FormatBenchReport(const BenchOptions& options,
                              const BenchReport& report);

}  // namespace transpose

#endif  // TRANSPOSE_CLIENT_BENCH_H_
