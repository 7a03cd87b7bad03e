#include "client/bench.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <mutex>
#include <new>
#include <random>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "kernels/cpu_transpose.h"
#include "server/core/process.h"
#include "server/core/status_macros.h"

namespace transpose {
double NearestRankPercentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double rank = std::ceil(p * static_cast<double>(sorted.size()));
  return sorted[std::clamp<size_t>(static_cast<size_t>(rank), 1,
                                   sorted.size()) -
                1];
}

absl::Status CheckBenchOptions(const BenchOptions& options) {
  // A thread each: past thousands, one fails to start and ends the process.
  if (options.concurrency < 1 || options.concurrency > kMaxBenchConcurrency) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--concurrency=%d: expected 1 to %d",
                        options.concurrency, kMaxBenchConcurrency));
  }
  if (options.count == 0 && options.duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--duration=", absl::FormatDuration(options.duration),
                     ": expected a positive duration (or --count)"));
  }
  absl::StatusOr<uint64_t> bytes = MatrixBytes(options.dtype, options.shape);
  if (!bytes.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--shape=", ShapeToString(options.shape), ": ",
                     bytes.status().message()));
  }
  return absl::OkStatus();
}

absl::Status CheckBenchMemory(const BenchOptions& options,
                              uint64_t call_bytes) {
  TRANSPOSE_RETURN_IF_ERROR(CheckBenchOptions(options));
  const uint64_t bytes = *MatrixBytes(options.dtype, options.shape);
  const uint64_t buffers =
      1 + (options.verify ? 1 : 0) + static_cast<uint64_t>(options.concurrency);
  // Each worker thread's stack counts against ulimit -v: 32 workers of 64x64
  // under 300 MiB ended in std::system_error when only buffers counted.
  const uint64_t stacks = options.concurrency * ThreadStackBytes();
  const uint64_t memory = MemoryLeftBytes();
  if (memory < call_bytes + stacks ||
      bytes > (memory - call_bytes - stacks) / buffers) {
    return InThisProcess(absl::ResourceExhaustedError(absl::StrFormat(
        "%d buffers of %d bytes (the input, %sone result per request in "
        "flight), %d worker threads' stacks of %d bytes and the %d bytes the "
        "calls need exceed the %d bytes of memory this process may still take "
        "(%s)",
        buffers, bytes, options.verify ? "the expected result, " : "",
        options.concurrency, ThreadStackBytes(), call_bytes, memory,
        kMemoryLeftSource)));
  }
  return absl::OkStatus();
}

absl::Status CheckBenchFits(Client& client, const BenchOptions& options,
                            absl::Duration info_timeout) {
  TRANSPOSE_RETURN_IF_ERROR(CheckBenchOptions(options));
  TRANSPOSE_ASSIGN_OR_RETURN(const v1::ServerInfo info,
                             client.GetServerInfo(info_timeout));
  return CheckMatrixUnderLimit(info.limits(), options.dtype, options.shape);
}

absl::StatusOr<BenchReport> RunBench(Client& client,
                                     const BenchOptions& options) {
  TRANSPOSE_RETURN_IF_ERROR(CheckBenchOptions(options));
  const uint64_t bytes = *MatrixBytes(options.dtype, options.shape);
  if (options.call.cancelled()) {  // Before allocating and filling gigabytes.
    BenchReport report;
    report.matrix_bytes = bytes;
    report.stopped = true;
    return report;
  }
  std::vector<uint8_t> input;
  std::vector<uint8_t> expected;
  std::vector<std::vector<uint8_t>> outputs;
  try {
    input.resize(bytes);
    expected.resize(options.verify ? bytes : 0);
    outputs.assign(options.concurrency, std::vector<uint8_t>(bytes));
  } catch (const std::bad_alloc&) {
    return InThisProcess(absl::ResourceExhaustedError(absl::StrFormat(
        "out of memory for the bench's buffers of %d bytes (the machine's, its "
        "cgroup's or its ulimit -v)",
        bytes)));
  }
  std::mt19937 rng(42);
  for (uint8_t& b : input) b = static_cast<uint8_t>(rng());
  if (options.verify) {
    kernels::TransposeArgs args{
        ElementSize(options.dtype), options.shape.batch, options.shape.rows,
        options.shape.cols,         input.data(),        expected.data()};
    TRANSPOSE_RETURN_IF_ERROR(kernels::TransposeOnCpu(args));
  }
  const MatrixView view{options.dtype, options.shape, input};

  std::mutex mutex;
  BenchReport report;
  report.matrix_bytes = bytes;
  std::vector<double> latencies;
  double bandwidth_sum = 0, fraction_sum = 0;
  std::atomic<uint64_t> issued{0};
  // Set once every worker has started, or the run is off: until then no
  // worker calls, so that an abandoned run has no call in flight to wait out.
  absl::Notification all_started;
  absl::Time start, end;  // Written before all_started is notified.

  // Set by a worker that the canceller ended, not one that ran out of count
  // or time (a signal can come just after the last).
  std::atomic<bool> cut_short{false};
  // Set when not every worker could start: the run is off.
  std::atomic<bool> abandoned{false};
  auto worker = [&](std::vector<uint8_t>& output) {
    all_started.WaitForNotification();
    // A failing server (stopped, refusing every call) is not hammered in a
    // loop: each failure in a row doubles the wait before the next call, from
    // 10 ms to 1 s; a success clears it.
    absl::Duration backoff = absl::ZeroDuration();
    while (true) {
      // A timed run ends at `end`, waits included; a counted one waits out
      // every backoff.
      const absl::Duration wait =
          options.count > 0 ? backoff : std::min(backoff, end - absl::Now());
      if (wait > absl::ZeroDuration()) options.call.SleepUnlessCancelled(wait);
      // A run that is over is not cut short by a signal that comes after.
      if (abandoned || (options.count > 0 ? issued.load() >= options.count
                                          : absl::Now() >= end)) {
        break;
      }
      if (options.call.cancelled()) {
        cut_short = true;
        break;
      }
      if (options.count > 0 && issued.fetch_add(1) >= options.count) break;
      const absl::Time t0 = absl::Now();
      absl::StatusOr<TransposeStats> stats =
          client.TransposeInto(view, absl::MakeSpan(output), options.call);
      const double seconds = absl::ToDoubleSeconds(absl::Now() - t0);
      absl::Status status = stats.status();
      if (status.ok() && options.verify && output != expected) {
        status = absl::DataLossError("result differs from the CPU transpose");
      }
      backoff = status.ok() ? absl::ZeroDuration()
                            : std::clamp(2 * backoff, absl::Milliseconds(10),
                                         absl::Seconds(1));
      std::lock_guard<std::mutex> lock(mutex);
      if (status.code() == absl::StatusCode::kCancelled &&
          options.call.cancelled()) {
        cut_short = true;
        ++report.cancelled;
        continue;
      }
      if (!status.ok()) {
        if (report.errors++ == 0) report.first_error = status;
        continue;
      }
      ++report.requests;
      latencies.push_back(seconds);
      bandwidth_sum += stats->bandwidth_bytes_per_second;
      fraction_sum += stats->peak_fraction;
      report.backend = stats->backend;
      report.algorithm = stats->algorithm;
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(outputs.size());
  const auto abandon = [&](const char* why) {
    // Past CheckBenchMemory's count (another process's memory, a thread
    // limit): the workers that started stop before their first call.
    abandoned = true;
    all_started.Notify();
    for (std::thread& thread : threads) thread.join();
    return InThisProcess(absl::ResourceExhaustedError(absl::StrFormat(
        "could start only %d of the bench's %d worker threads: %s (the "
        "machine's memory, its cgroup's, its ulimit -v or its ulimit -u)",
        threads.size(), outputs.size(), why)));
  };
  try {
    for (std::vector<uint8_t>& output : outputs) {
      threads.emplace_back(worker, std::ref(output));
    }
  } catch (const std::system_error& error) {
    return abandon(error.what());
  } catch (const std::bad_alloc& error) {
    return abandon(error.what());
  }
  start = absl::Now();
  end = start + options.duration;
  all_started.Notify();
  for (std::thread& thread : threads) thread.join();

  report.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  report.stopped = cut_short;
  std::sort(latencies.begin(), latencies.end());
  report.p50_seconds = NearestRankPercentile(latencies, 0.50);
  report.p90_seconds = NearestRankPercentile(latencies, 0.90);
  report.p99_seconds = NearestRankPercentile(latencies, 0.99);
  report.max_seconds = latencies.empty() ? 0 : latencies.back();
  report.requests_per_second = report.requests / report.seconds;
  report.bytes_per_second = 2.0 * bytes * report.requests / report.seconds;
  if (report.requests > 0) {
    report.kernel_bandwidth_bytes_per_second = bandwidth_sum / report.requests;
    report.kernel_peak_fraction = fraction_sum / report.requests;
  }
  return report;
}

std::string FormatBenchReport(const BenchOptions& options,
                              const BenchReport& report) {
  std::string text = absl::StrFormat(
      "%s %s, concurrency %d: %d ok, %d errors in %.2f s%s\n",
      DataTypeName(options.dtype), ShapeToString(options.shape),
      options.concurrency, report.requests, report.errors, report.seconds,
      report.stopped
          ? absl::StrFormat(", stopped early (%d cut short)", report.cancelled)
          : "");
  if (report.requests == 0) {
    absl::StrAppend(&text, "no request succeeded: no timings\n");
  } else {
    absl::StrAppendFormat(
        &text,
        "throughput  %.1f req/s, %.3f GB/s (sent + received)\n"
        "latency     p50 %.3f ms, p90 %.3f ms, p99 %.3f ms, max %.3f ms\n"
        "kernel      %s on %s: %.2f GB/s mean, %.1f%% of the device's copy "
        "bandwidth\n",
        report.requests_per_second, report.bytes_per_second / 1e9,
        report.p50_seconds * 1e3, report.p90_seconds * 1e3,
        report.p99_seconds * 1e3, report.max_seconds * 1e3, report.algorithm,
        report.backend, report.kernel_bandwidth_bytes_per_second / 1e9,
        100 * report.kernel_peak_fraction);
  }
  if (report.errors > 0) {
    absl::StrAppend(&text, "first error: ", StatusText(report.first_error),
                    "\n");
  }
  return text;
}

}  // namespace transpose
