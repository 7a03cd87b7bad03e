// service_bench: the client library against the real transpose_server, next to
// echo_server (the same API and client code with the transpose taken out)
// measured in the same run on the same machine. Prints a Markdown table; --json
// writes the figures too. Its last row is each server process's CPU per call
// while callers run concurrently: on a host client and servers share, that
// bounds the concurrent rate.
//
//   service_bench [--backend=cpu|cuda] [--reps=9] [--sizes=4096,16384]
//   [--small_calls=3000]
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/bench.h"
#include "client/client.h"
#include "server/core/process.h"
#include "tests/server_process.h"

ABSL_FLAG(std::string, server_binary, "",
          "transpose_server (default: beside this binary, or the build tree).");
ABSL_FLAG(std::string, echo_binary, "",
          "echo_server (default: beside this binary).");
ABSL_FLAG(std::string, backend, "cpu", "The server's --backend.");
ABSL_FLAG(
    std::string, sizes, "4096",
    "Square float32 matrix edges for the throughput rows (4096 = 64 MiB).");
ABSL_FLAG(int, reps, 9,
          "Timed repetitions per large case and server (median reported).");
ABSL_FLAG(int, small_calls, 3000,
          "Unary 64x64 calls per server for the latency row.");
ABSL_FLAG(int, concurrency, 64,
          "Callers for the small-request throughput row.");
ABSL_FLAG(absl::Duration, concurrent_duration, absl::Seconds(3),
          "Length of the concurrent run.");
ABSL_FLAG(bool, verbose, false, "Print every repetition's figures to stderr.");
ABSL_FLAG(std::string, json, "", "Also write the figures here as JSON.");

namespace transpose {
namespace {

using testing::ServerProcess;

std::string Beside(const std::string& name, const std::string& build_relative) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return name;
  std::string dir(self, n);
  dir = dir.substr(0, dir.rfind('/'));
  const std::string beside = absl::StrCat(dir, "/", name);
  if (access(beside.c_str(), X_OK) == 0) return beside;
  return absl::StrCat(dir, "/", build_relative);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return NearestRankPercentile(v, p);
}

struct Endpoint {
  std::string name;
  std::unique_ptr<ServerProcess> process;
  std::unique_ptr<Client> client;
};

Endpoint Launch(const std::string& name, const std::string& binary,
                const std::vector<std::string>& args) {
  Endpoint endpoint;
  endpoint.name = name;
  absl::StatusOr<std::unique_ptr<ServerProcess>> process =
      ServerProcess::Start(binary, args);
  if (!process.ok()) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(),
                 process.status().ToString().c_str());
    std::exit(1);
  }
  endpoint.process = *std::move(process);
  ClientOptions options;
  options.target = endpoint.process->address();
  options.max_attempts = 1;  // A refusal is a finding here, not to be hidden.
  endpoint.client = *Client::Create(options);
  return endpoint;
}

// Seconds for one transpose of `input` through `endpoint`; the server's stats
// of it go to `stats_out` if given.
double TimeOne(Endpoint& endpoint, const MatrixView& input,
               std::vector<uint8_t>& output,
               TransposeStats* stats_out = nullptr) {
  const absl::Time start = absl::Now();
  absl::StatusOr<TransposeStats> stats =
      endpoint.client->TransposeInto(input, absl::MakeSpan(output));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!stats.ok()) {
    std::fprintf(stderr, "%s: %s\n", endpoint.name.c_str(),
                 stats.status().ToString().c_str());
    std::exit(1);
  }
  if (stats_out != nullptr) *stats_out = *stats;
  return seconds;
}

// CPU seconds `pid` has used so far, its finished threads' included: utime
// and stime of /proc/PID/stat. Nullopt where unreadable.
std::optional<double> ProcessCpuSeconds(pid_t pid) {
  std::ifstream file(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(file)),
                   std::istreambuf_iterator<char>());
  // The command name, in parentheses, may hold spaces; the fields after it
  // start with the state (field 3), so utime and stime (14, 15) are the 12th
  // and 13th.
  const size_t name_end = stat.rfind(')');
  if (name_end == std::string::npos) return std::nullopt;
  const std::vector<absl::string_view> fields = absl::StrSplit(
      absl::string_view(stat).substr(name_end + 1), ' ', absl::SkipEmpty());
  uint64_t utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[11], &utime) ||
      !absl::SimpleAtoi(fields[12], &stime)) {
    return std::nullopt;
  }
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

struct ConcurrentRun {
  double calls_per_second = 0;  // Of the calls that succeeded.
  uint64_t failed = 0;
  // The server process's CPU time over the run per call it answered (nullopt
  // where unreadable, or with no call answered): with client and server on
  // one host, the server's share of the CPU bounds the rate. Failed calls'
  // CPU counts too, so failures make it read high.
  std::optional<double> server_cpu_seconds_per_call;
};

// `callers` threads calling for `duration`.
ConcurrentRun RunConcurrently(Endpoint& endpoint, const MatrixView& input,
                              int callers, absl::Duration duration) {
  std::atomic<uint64_t> calls{0}, failed{0};
  const std::optional<double> cpu_before =
      ProcessCpuSeconds(endpoint.process->pid());
  const absl::Time end = absl::Now() + duration;
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int i = 0; i < callers; ++i) {
    threads.emplace_back([&] {
      std::vector<uint8_t> output(input.data.size());
      while (absl::Now() < end) {
        if (endpoint.client->TransposeInto(input, absl::MakeSpan(output))
                .ok()) {
          ++calls;
        } else {
          ++failed;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const std::optional<double> cpu_after =
      ProcessCpuSeconds(endpoint.process->pid());
  ConcurrentRun run;
  run.calls_per_second = calls / seconds;
  run.failed = failed;
  if (cpu_before.has_value() && cpu_after.has_value() && calls > 0) {
    run.server_cpu_seconds_per_call = (*cpu_after - *cpu_before) / calls;
  }
  return run;
}

// A figure in microseconds for the table and the JSON, or "n/a" and "null".
std::string Micros(std::optional<double> seconds, bool json) {
  if (!seconds.has_value()) return json ? "null" : "n/a";
  return json ? absl::StrFormat("%.2f", *seconds * 1e6)
              : absl::StrFormat("%.1f", *seconds * 1e6);
}

int Run() {
  std::string server_binary = absl::GetFlag(FLAGS_server_binary);
  if (server_binary.empty())
    server_binary = Beside("transpose_server", "../server/transpose_server");
  std::string echo_binary = absl::GetFlag(FLAGS_echo_binary);
  if (echo_binary.empty()) echo_binary = Beside("echo_server", "echo_server");

  Endpoint service =
      Launch("transpose_server", server_binary,
             {absl::StrCat("--backend=", absl::GetFlag(FLAGS_backend)),
              "--log_level=error", "--max_message_bytes=1073741824"});
  Endpoint echo = Launch("echo_server", echo_binary, {"--metrics_address="});
  Endpoint pipelined = Launch("echo_server --pipelined", echo_binary,
                              {"--metrics_address=", "--pipelined"});
  absl::StatusOr<v1::ServerInfo> info = service.client->GetServerInfo();
  const std::string device =
      info.ok() && info->backends_size() > 0
          ? absl::StrCat(info->backends(0).name(), " (",
                         info->backends(0).device_name(), ")")
          : "?";
  std::printf(
      "service_bench: transpose_server --backend=%s on %s; host has %u "
      "cores\n\n",
      absl::GetFlag(FLAGS_backend).c_str(), device.c_str(),
      std::thread::hardware_concurrency());
  std::printf(
      "| case | transpose_server | echo_server | ratio | echo_server "
      "--pipelined |\n"
      "|---|---|---|---|---|\n");
  std::string json = "{\n";
  int exit_code = 0;

  std::mt19937 rng(7);
  for (absl::string_view edge_text :
       absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    uint64_t edge = 0;
    if (!absl::SimpleAtoi(edge_text, &edge)) return 2;
    const MatrixShape shape{1, edge, edge};
    std::vector<uint8_t> data(shape.elements() * 4);
    for (size_t i = 0; i < data.size(); i += 4096)
      data[i] = static_cast<uint8_t>(rng());
    std::vector<uint8_t> output(data.size());
    const MatrixView input{DataType::kFloat32, shape, data};
    TimeOne(service, input,
            output);  // Warm-up: buffers, connections, page faults.
    TimeOne(echo, input, output);
    TimeOne(pipelined, input, output);
    std::vector<double> service_s, echo_s, pipelined_s;
    for (int i = 0; i < absl::GetFlag(FLAGS_reps);
         ++i) {  // Interleaved, so drift hits all.
      service_s.push_back(TimeOne(service, input, output));
      echo_s.push_back(TimeOne(echo, input, output));
      pipelined_s.push_back(TimeOne(pipelined, input, output));
    }
    const double moved = 2.0 * data.size();
    if (absl::GetFlag(FLAGS_verbose)) {
      for (int i = 0; i < absl::GetFlag(FLAGS_reps); ++i) {
        std::fprintf(stderr,
                     "rep %d: service %.3f echo %.3f pipelined %.3f GB/s\n", i,
                     moved / service_s[i] / 1e9, moved / echo_s[i] / 1e9,
                     moved / pipelined_s[i] / 1e9);
      }
    }
    const double service_rate = moved / Median(service_s);
    const double echo_rate = moved / Median(echo_s);
    const double pipelined_rate = moved / Median(pipelined_s);
    // Each service run against the echo run right after it: slow drifts of a
    // shared machine cancel within the pair.
    std::vector<double> paired;
    for (size_t i = 0; i < service_s.size(); ++i)
      paired.push_back(echo_s[i] / service_s[i]);
    std::printf(
        "| float32 %llux%llu (%.0f MiB), streamed: GB/s in+out, median of %d | "
        "%.3f | %.3f | "
        "%.1f%% (paired %.1f%%) | %.3f |\n",
        static_cast<unsigned long long>(edge),
        static_cast<unsigned long long>(edge), data.size() / 1048576.0,
        absl::GetFlag(FLAGS_reps), service_rate / 1e9, echo_rate / 1e9,
        100 * service_rate / echo_rate, 100 * Median(paired),
        pipelined_rate / 1e9);
    std::fflush(stdout);
    absl::StrAppend(
        &json, absl::StrFormat("  \"float32_%d_gbps\": {\"service\": %.4f, "
                               "\"echo\": %.4f, \"echo_pipelined\": %.4f, "
                               "\"paired_ratio\": %.4f},\n",
                               edge, service_rate / 1e9, echo_rate / 1e9,
                               pipelined_rate / 1e9, Median(paired)));
  }

  // Small unary requests: latency, alternating blocks.
  {
    const MatrixShape shape{1, 64, 64};
    std::vector<uint8_t> data(shape.elements() * 4, 1);
    std::vector<uint8_t> output(data.size());
    const MatrixView input{DataType::kFloat32, shape, data};
    std::vector<double> service_s, echo_s;
    // Where a service call's time goes, as the server reports it.
    std::vector<double> engine_s, queue_s, device_s;
    for (int i = 0; i < 200; ++i) {
      TimeOne(service, input, output);
      TimeOne(echo, input, output);
    }
    const int calls = absl::GetFlag(FLAGS_small_calls);
    for (int block = 0; block < calls / 100; ++block) {
      for (int i = 0; i < 100; ++i) {
        TransposeStats stats;
        service_s.push_back(TimeOne(service, input, output, &stats));
        engine_s.push_back(stats.total_seconds);
        queue_s.push_back(stats.queue_seconds);
        device_s.push_back(stats.copy_in_seconds + stats.kernel_seconds +
                           stats.copy_out_seconds);
      }
      for (int i = 0; i < 100; ++i)
        echo_s.push_back(TimeOne(echo, input, output));
    }
    for (double p : {0.5, 0.9, 0.99}) {
      const double a = Percentile(service_s, p), b = Percentile(echo_s, p);
      std::printf(
          "| float32 64x64 unary, p%.0f latency (µs), %zu calls | %.1f | %.1f "
          "| %.2fx | |\n",
          100 * p, service_s.size(), a * 1e6, b * 1e6, a / b);
      absl::StrAppend(&json,
                      absl::StrFormat("  \"small_unary_p%.0f_us\": "
                                      "{\"service\": %.2f, \"echo\": %.2f},\n",
                                      100 * p, a * 1e6, b * 1e6));
    }
    std::printf(
        "| float32 64x64 unary, p50 in the server's job (µs): all / queued / "
        "copies and kernel | %.1f / %.1f / %.1f | | | |\n",
        Percentile(engine_s, 0.5) * 1e6, Percentile(queue_s, 0.5) * 1e6,
        Percentile(device_s, 0.5) * 1e6);
    const int callers = absl::GetFlag(FLAGS_concurrency);
    const absl::Duration duration = absl::GetFlag(FLAGS_concurrent_duration);
    const ConcurrentRun service_run =
        RunConcurrently(service, input, callers, duration);
    const ConcurrentRun echo_run =
        RunConcurrently(echo, input, callers, duration);
    const auto failures = [](const ConcurrentRun& run) {
      return run.failed == 0 ? std::string()
                             : absl::StrFormat(" (%d failed)", run.failed);
    };
    absl::PrintF(
        "| float32 64x64 unary, %d concurrent callers: calls/s | %.0f%s | "
        "%.0f%s | %.1f%% | |\n",
        callers, service_run.calls_per_second, failures(service_run),
        echo_run.calls_per_second, failures(echo_run),
        100 * service_run.calls_per_second / echo_run.calls_per_second);
    const std::optional<double> service_cpu =
        service_run.server_cpu_seconds_per_call;
    const std::optional<double> echo_cpu = echo_run.server_cpu_seconds_per_call;
    absl::PrintF(
        "| float32 64x64 unary, %d concurrent callers: server process CPU per "
        "call (µs) | %s | %s | %s | |\n",
        callers, Micros(service_cpu, false), Micros(echo_cpu, false),
        service_cpu.has_value() && echo_cpu.has_value() && *echo_cpu > 0
            ? absl::StrFormat("%.2fx", *service_cpu / *echo_cpu)
            : "n/a");
    absl::StrAppend(
        &json,
        absl::StrFormat("  \"small_unary_concurrent_calls_per_s\": "
                        "{\"service\": %.1f, \"echo\": %.1f},\n"
                        "  \"small_unary_concurrent_failed_calls\": "
                        "{\"service\": %d, \"echo\": %d},\n"
                        "  \"small_unary_concurrent_server_cpu_us_per_call\": "
                        "{\"service\": %s, \"echo\": %s}\n",
                        service_run.calls_per_second, echo_run.calls_per_second,
                        service_run.failed, echo_run.failed,
                        Micros(service_cpu, true), Micros(echo_cpu, true)));
    // The figures are out; a run that lost calls or could not read the
    // servers' CPU still says so in its exit code.
    if (service_run.failed + echo_run.failed > 0) {
      absl::FPrintF(stderr, "service_bench: %d concurrent calls failed\n",
                    service_run.failed + echo_run.failed);
      exit_code = 1;
    }
    if (!service_cpu.has_value() || !echo_cpu.has_value()) {
      std::fprintf(stderr,
                   "service_bench: could not read a server's CPU time\n");
      exit_code = 1;
    }
  }
  json += "}\n";
  if (!absl::GetFlag(FLAGS_json).empty())
    std::ofstream(absl::GetFlag(FLAGS_json)) << json;
  return exit_code;
}

}  // namespace
}  // namespace transpose

int main(int argc, char** argv) {
  transpose::SetUpProcess();
  absl::ParseCommandLine(argc, argv);
  return transpose::Run();
}
