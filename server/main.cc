// transpose_server: the gRPC matrix-transpose service. Flags live here only;
// everything below takes an options struct.
#include <pthread.h>
#include <signal.h>
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/cleanup/cleanup.h"
#include "absl/flags/flag.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/cpu_transpose.h"
#include "prometheus/exposer.h"
#include "prometheus/registry.h"
#include "proto/convert.h"
#include "server/buffer_pool.h"
#include "server/core/command_line.h"
#include "server/core/files.h"
#include "server/core/host_port.h"
#include "server/core/log.h"
#include "server/core/notification.h"
#include "server/core/process.h"
#include "server/core/status_macros.h"
#include "server/core/tls_files.h"
#include "server/core/token_file.h"
#include "server/cpu_backend.h"
#include "server/cuda_backend.h"
#include "server/engine.h"
#include "server/gpu_presence.h"
#include "server/grpc_server.h"
#include "server/host_memory_plan.h"
#include "server/metrics.h"
#include "server/nvml_collector.h"
#include "server/transpose_service.h"

#ifndef TRANSPOSE_VERSION
#define TRANSPOSE_VERSION "dev"
#endif

ABSL_FLAG(std::string, address, "0.0.0.0:50051",
          "gRPC listening address, host:port; port 0 picks a free port.");
ABSL_FLAG(
    std::string, metrics_address, "0.0.0.0:9464",
    "Prometheus /metrics listening address, host:port; empty disables it.");
ABSL_FLAG(std::string, backend, "auto",
          "auto (every GPU if there is one, else the CPU), cuda or cpu.");
ABSL_FLAG(int, streams_per_device, 4,
          "CUDA streams (concurrent requests) per GPU (0 counts as 1); CPU "
          "workers for the cpu backend (0: one per usable core: the CPU "
          "affinity's, within the cgroup's CPU limit).");
ABSL_FLAG(double, gpu_hang_seconds, 60,
          "A GPU job that holds its stream longer than this (a kernel or copy "
          "that does not end) takes its device out of service, as a fault "
          "does: health turns NOT_SERVING once no device is left, for the "
          "liveness probe to restart the process. 0: never, else at least "
          "1.");
ABSL_FLAG(int, cpu_threads, 0,
          "Threads one CPU transpose uses (0: one per usable core).");
ABSL_FLAG(
    uint64_t, max_message_bytes, uint64_t{64} << 20,
    "Largest data in one message, in bytes: a unary Transpose matrix, or one "
    "TransposeStream chunk.");
ABSL_FLAG(uint64_t, max_matrix_bytes, uint64_t{4} << 30,
          "Largest matrix, in bytes (at most --max_inflight_bytes and "
          "--max_inflight_bytes_per_peer, where those are set; a Transpose "
          "call is also bounded by --max_message_bytes).");
ABSL_FLAG(uint64_t, response_chunk_bytes, uint64_t{1} << 20,
          "Data bytes per TransposeStream response message.");
ABSL_FLAG(
    uint64_t, buffer_pool_bytes, uint64_t{4} << 30,
    "Released host buffers (pinned, for GPUs) kept for reuse, per device. "
    "Memory the server keeps between requests, on top of what they hold. "
    "Lowered at start with --max_inflight_bytes.");
ABSL_FLAG(uint64_t, device_pool_bytes, uint64_t{8} << 30,
          "Device memory (a job needs twice its matrix) kept for reuse once "
          "jobs free it, per GPU; past it, freed memory goes back to the GPU.");
ABSL_FLAG(uint64_t, max_inflight_bytes, uint64_t{8} << 30,
          "Bytes of matrices the server holds at once; requests past it get "
          "RESOURCE_EXHAUSTED at once (0: no limit). Lowered at start, with "
          "--max_inflight_bytes_per_peer in proportion, --buffer_pool_bytes "
          "and gRPC's quota, where what these limits let the server hold at "
          "worst does not fit the memory it may take.");
ABSL_FLAG(uint64_t, max_transport_bytes, 0,
          "Roughly the memory gRPC may hold for received messages, all calls "
          "together (gRPC reads a whole message before it checks "
          "--max_message_bytes). 0: --max_inflight_bytes plus the larger of "
          "1 GiB and 4 x --max_message_bytes (no limit when "
          "--max_inflight_bytes is 0). Else at least --max_inflight_bytes + "
          "--max_message_bytes. Lowered at start with --max_inflight_bytes.");
ABSL_FLAG(int, max_inflight_requests, 256,
          "Requests the server holds at once; past it, RESOURCE_EXHAUSTED at "
          "once (0: no limit).");
ABSL_FLAG(uint64_t, max_inflight_bytes_per_peer, 0,
          "Bytes of matrices the server holds at once for one client host "
          "(the address its connections come from), so that one slow or "
          "hostile client cannot hold all of --max_inflight_bytes; past it, "
          "that client gets RESOURCE_EXHAUSTED at once (0: no limit). Clients "
          "behind one proxy or NAT address share it.");
ABSL_FLAG(int, max_inflight_requests_per_peer, 0,
          "Requests the server holds at once for one client host; past it, "
          "RESOURCE_EXHAUSTED at once (0: no limit).");
ABSL_FLAG(double, unready_seconds, 2,
          "On SIGTERM or SIGINT, how long health reports NOT_SERVING while new "
          "calls are still taken, before the drain.");
ABSL_FLAG(std::string, testing_nvidia_device_dir, "/dev",
          "Testing only: where the NVIDIA GPUs this process may use appear as "
          "nvidiaN device files, which --backend=auto warns of when it cannot "
          "use them.");
ABSL_FLAG(int, testing_cuda_hang_after_jobs, 0,
          "Testing only: after this many jobs, each GPU job first runs a "
          "kernel that spins for 30 s, as a hung device would, to exercise "
          "--gpu_hang_seconds.");
ABSL_FLAG(int, testing_cuda_unusable_device, -1,
          "Testing only: GPU N fails to come up at start-up, as a broken one "
          "would, to exercise --backend=auto serving on the others or on the "
          "CPU (-1: none).");
ABSL_FLAG(int, testing_cuda_fault_after_jobs, 0,
          "Testing only: after this many jobs, each GPU runs a kernel that "
          "faults (a sticky CUDA error), to exercise fault handling.");
ABSL_FLAG(double, testing_startup_delay_seconds, 0,
          "Testing only: start-up waits this long, after the backends are "
          "made and before the server listens, as setting up many GPUs can.");
ABSL_FLAG(double, stream_idle_seconds, 120,
          "A TransposeStream call that finishes no message either way for "
          "this long (its client stopped sending mid-upload, stopped reading "
          "the response, or has its result but never half-closed) ends with "
          "DEADLINE_EXCEEDED (or is cancelled, when a response it does not "
          "read is in the way) and gives back its admission; time its own job "
          "takes does not count. A Transpose or GetServerInfo reply not "
          "delivered whole within this long is cancelled, counted "
          "DEADLINE_EXCEEDED. 0: never; else at least 1.");
ABSL_FLAG(double, drain_seconds, 30,
          "On SIGTERM or SIGINT, how long running calls may take to finish.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain: serve gRPC over TLS (with --tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require client certificates that chain to it (mutual "
          "TLS). Health checks stay open to callers without one. Turns server "
          "reflection off.");
ABSL_FLAG(std::vector<std::string>, tls_client_names, {},
          "With --tls_client_ca: serve only clients whose certificate names "
          "one of these (comma-separated, exactly): a subject alternative "
          "name (DNS, URI, email, IP), or the common name of a certificate "
          "without any. Others get PERMISSION_DENIED; health checks stay "
          "open. Empty: any certificate from that CA.");
ABSL_FLAG(int, tls_reload_seconds, 10,
          "Read the --tls_cert, --tls_key and --tls_client_ca files again this "
          "often (at least 1): new connections get what they hold then, so a "
          "certificate can be replaced while the server runs. Replace them "
          "together and whole, as a Kubernetes Secret's update does.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding bearer tokens, one per line (two while one replaces "
          "the other): calls must send 'authorization: Bearer <token>' with "
          "one of them (health checks stay open). Read again each second, so "
          "tokens can be added and removed while the server runs. Turns "
          "server reflection off.");
ABSL_FLAG(double, keepalive_seconds, 60,
          "Ping a connection idle this long; close it, cancelling its calls, "
          "when no answer comes within --keepalive_timeout_seconds (how a "
          "client that vanished without closing its connection is noticed).");
ABSL_FLAG(double, keepalive_timeout_seconds, 20,
          "How long a keepalive ping may go unanswered.");
ABSL_FLAG(int, max_concurrent_streams, 100,
          "Calls one client connection may run at once; the client's further "
          "calls wait on its side until one ends (HTTP/2's "
          "MAX_CONCURRENT_STREAMS). Bounds what one connection of calls that "
          "send nothing can hold. 0: no limit.");
ABSL_FLAG(double, max_connection_age_seconds, 300,
          "Send a connection a GOAWAY once it is this old (+-10%), so that "
          "clients reconnect and spread over the servers that came up since; "
          "its running calls finish first. 0: never; else at least 1.");
ABSL_FLAG(std::string, log_level, "info",
          "debug (a line per request), info (start-up, drain, health "
          "changes), warning (a line per failed request, up to 10 a second) "
          "or error.");

namespace transpose {
namespace {

// /metrics serves scrapes of a few milliseconds, each on a thread of its own
// (CivetWeb's model): a connection that sends no request holds one for the
// read timeout. So N such connections, kept open, delay a scrape by about
// floor(N / threads) x timeout: with 8 threads and 2 s, 48 kept every scrape
// past Prometheus's 10 s; with these, 48 cost nothing and 128 cost 2 s. Idle
// threads cost only their stacks' address space. A request takes one round
// trip, and the timeout also ends a reply write that makes no progress for
// that long, which a ~20 KB reply, within a socket's send buffer, does not
// meet: a second is plenty.
constexpr int kMetricsThreads = 64;
constexpr int kMetricsRequestTimeoutMs = 1000;

// The CPU backend's transpose threads: each worker transposes on a team of
// its own.
int64_t CpuTransposeThreads() {
  const int64_t cores = kernels::UsableCores();
  const int streams = absl::GetFlag(FLAGS_streams_per_device);
  const int cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  return (streams == 0 ? cores : streams) *
         (cpu_threads == 0 ? cores : cpu_threads);
}

// What the process takes of its memory beside the matrices, whatever it
// admits: gRPC's own working memory (64 MiB, as the client counts a call's),
// what it holds already where MemoryLeftBytes does not count it, and, under
// ulimit -v, the stacks of the threads it has yet to start. gRPC runs about
// one a core and a few more (7 on the 2-core machine, 21 on the GPU machine's
// 16-core host), counting the machine's cores (sysconf(_SC_NPROCESSORS_CONF))
// whatever the container's cpuset allows, so hardware_concurrency rather than
// kernels::UsableCores; the CPU backend a team per worker and one more to
// calibrate, each GPU a thread per stream; the server a few more. (/metrics
// runs already: its threads are in what the process holds.)
uint64_t HostMemoryReserveBytes(int devices) {
  const int64_t cores = std::thread::hardware_concurrency();
  const int64_t backend_threads =
      devices > 0
          ? devices * std::max(1, absl::GetFlag(FLAGS_streams_per_device))
          : CpuTransposeThreads() + kernels::UsableCores();
  const int64_t threads = (cores + 6) + backend_threads + 16;
  return (uint64_t{64} << 20) + MemoryHeldBytes() +
         ThreadsAddressSpaceBytes(
             static_cast<int>(std::min<int64_t>(threads, 1 << 20)));
}

// The end of a backend's start-up line: how its kernels are loaded, when it is
// a GPU.
const char* KernelLoadingSuffix(KernelLoading loading) {
  switch (loading) {
    case KernelLoading::kNotAGpu:
      return "";
    case KernelLoading::kUnknown:
      return ", kernel loading unknown";
    case KernelLoading::kAtStart:
      return ", kernels loaded at start";
    case KernelLoading::kOnFirstRun:
      return ", each kernel loaded on its first run";
  }
  return "";
}

// The limits of host memory for `devices` GPUs (0: the CPU), fitted to what
// the process may still take.
absl::StatusOr<HostMemoryPlan> PlanHostMemoryFor(int devices) {
  HostMemoryFlags flags;
  flags.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  flags.buffer_pool_bytes = absl::GetFlag(FLAGS_buffer_pool_bytes);
  flags.max_transport_bytes = absl::GetFlag(FLAGS_max_transport_bytes);
  flags.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  flags.max_inflight_bytes_per_peer =
      absl::GetFlag(FLAGS_max_inflight_bytes_per_peer);
  HostMemoryUse use;
  use.bytes_per_admitted_byte = devices > 0 ? 1.25 : 2.5;
  use.pools = std::max(devices, 1);
  use.reserve_bytes = HostMemoryReserveBytes(devices);
  return PlanHostMemory(flags, use, MemoryLeftBytes());
}

struct Backends {
  std::vector<std::unique_ptr<Backend>> list;
  // Their limits, planned before they started; an error, and no backends,
  // where the memory holds too little to serve.
  absl::StatusOr<HostMemoryPlan> memory;
};

absl::StatusOr<Backends> CreateBackends(const std::string& kind,
                                        Metrics& metrics) {
  Backends backends;
  if (kind == "cuda" || (kind == "auto" && CudaDeviceCount() > 0)) {
    backends.memory = PlanHostMemoryFor(CudaDeviceCount());
    // Calibrating pins a buffer: nothing starts where nothing could serve.
    if (!backends.memory.ok()) return backends;
    CudaBackendOptions options;
    options.streams_per_device = absl::GetFlag(FLAGS_streams_per_device);
    options.max_idle_pinned_bytes = backends.memory->buffer_pool_bytes;
    options.max_idle_device_bytes = absl::GetFlag(FLAGS_device_pool_bytes);
    options.hang_limit = absl::Seconds(absl::GetFlag(FLAGS_gpu_hang_seconds));
    options.testing_fault_after_jobs =
        absl::GetFlag(FLAGS_testing_cuda_fault_after_jobs);
    options.testing_hang_after_jobs =
        absl::GetFlag(FLAGS_testing_cuda_hang_after_jobs);
    options.testing_unusable_device =
        absl::GetFlag(FLAGS_testing_cuda_unusable_device);
    TRANSPOSE_ASSIGN_OR_RETURN(CudaBackends cuda,
                               CreateCudaBackends(options, metrics));
    // Asked for the GPUs, an operator learns at once that one is broken; on
    // auto the server serves on what it has, as it would on a machine with
    // fewer GPUs, and says which are missing and why.
    if (kind == "cuda" && !cuda.failed.empty()) {
      return absl::Status(
          cuda.failed.front().code(),
          absl::StrCat(cuda.failed.front().message(),
                       " (--backend=cuda needs every visible GPU; "
                       "--backend=auto serves on those that come up)"));
    }
    for (const absl::Status& why : cuda.failed) {
      Log(LogLevel::kWarning, "%s: not serving on it", why.message());
    }
    if (!cuda.usable.empty()) {
      backends.list = std::move(cuda.usable);
      return backends;
    }
    Log(LogLevel::kWarning, "no GPU came up: serving on the CPU");
  } else if (kind == "auto") {
    if (const int listed = NvidiaGpuDeviceCount(
            absl::GetFlag(FLAGS_testing_nvidia_device_dir));
        listed > 0) {
      Log(LogLevel::kWarning,
          "this machine has %d NVIDIA GPU%s, but %s: serving on the CPU",
          listed, listed == 1 ? "" : "s", WhyNoCudaDevice());
    }
  }
  backends.memory = PlanHostMemoryFor(0);
  if (!backends.memory.ok()) return backends;
  CpuBackendOptions options;
  options.workers = absl::GetFlag(FLAGS_streams_per_device);
  options.threads_per_job = absl::GetFlag(FLAGS_cpu_threads);
  options.max_idle_buffer_bytes = backends.memory->buffer_pool_bytes;
  backends.list.push_back(std::make_unique<CpuBackend>(options, metrics));
  return backends;
}

// Refuses flag values that cannot work, before anything starts: a zero
// response chunk would send empty messages forever, a negative count or
// duration means nothing, gRPC's message limits are 32-bit, the client
// library sends up to 1 MiB of data per message, and a transport quota that
// admitted uploads can fill resets calls at random.
absl::Status CheckFlags() {
  LogLevel level;
  if (!ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--log_level=%s: expected debug, info, warning or error",
        absl::GetFlag(FLAGS_log_level)));
  }
  constexpr uint64_t kMinMessageBytes = api::kMinMessageDataBytes;
  constexpr uint64_t kMaxMessageBytes = api::kMaxMessageDataBytes;
  const uint64_t message = absl::GetFlag(FLAGS_max_message_bytes);
  const uint64_t chunk = absl::GetFlag(FLAGS_response_chunk_bytes);
  if (message < kMinMessageBytes || message > kMaxMessageBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--max_message_bytes=%d: expected %d to %d (clients send up to 1 MiB "
        "of data per message; gRPC's message limit is 32-bit)",
        message, kMinMessageBytes, kMaxMessageBytes));
  }
  if (chunk == 0 || chunk > kMaxMessageBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--response_chunk_bytes=%d: expected 1 to %d", chunk,
                        kMaxMessageBytes));
  }
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend != "auto" && backend != "cuda" && backend != "cpu") {
    return absl::InvalidArgumentError(
        absl::StrCat("--backend=", backend, ": expected auto, cuda or cpu"));
  }
  const std::string cert = absl::GetFlag(FLAGS_tls_cert);
  const std::string key = absl::GetFlag(FLAGS_tls_key);
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError(
        cert.empty()
            ? absl::StrCat("--tls_key=", key, ": expected --tls_cert with it")
            : absl::StrCat("--tls_cert=", cert,
                           ": expected --tls_key with it"));
  }
  if (!absl::GetFlag(FLAGS_tls_client_ca).empty() && cert.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_client_ca=", absl::GetFlag(FLAGS_tls_client_ca),
                     ": expected --tls_cert and --tls_key with it"));
  }
  const std::vector<std::string> client_names =
      absl::GetFlag(FLAGS_tls_client_names);
  if (!client_names.empty() && absl::GetFlag(FLAGS_tls_client_ca).empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_client_names=", absl::StrJoin(client_names, ","),
                     ": expected --tls_client_ca with it"));
  }
  for (const std::string& name : client_names) {
    // A space after a comma would otherwise make a name no certificate has.
    if (name.empty() ||
        absl::c_any_of(name, [](char c) { return c <= ' ' || c > '~'; })) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tls_client_names=",
          absl::CHexEscape(absl::StrJoin(client_names, ",")),
          ": expected names of printable characters without spaces, one "
          "between each two commas"));
    }
  }
  if (absl::GetFlag(FLAGS_tls_reload_seconds) < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls_reload_seconds=", absl::GetFlag(FLAGS_tls_reload_seconds),
        ": expected at least 1"));
  }
  if (absl::GetFlag(FLAGS_max_matrix_bytes) == 0) {
    return absl::InvalidArgumentError("--max_matrix_bytes=0: expected > 0");
  }
  const uint64_t transport = absl::GetFlag(FLAGS_max_transport_bytes);
  const uint64_t inflight = absl::GetFlag(FLAGS_max_inflight_bytes);
  if (transport > INT64_MAX) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--max_transport_bytes=%d: expected at most %d", transport, INT64_MAX));
  }
  // With no admission budget (0) still room for one message, or no call
  // gets through at all.
  if (transport > 0 && transport < MinTransportQuota(inflight, message)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--max_transport_bytes=%d: expected 0 or at least --max_inflight_bytes "
        "+ --max_message_bytes (%d): admitted uploads may be held in gRPC's "
        "buffers",
        transport, MinTransportQuota(inflight, message)));
  }
  // Each stream or CPU worker is a thread (or more): thousands of them only
  // fail to start.
  constexpr int kMaxThreads = 1024;
  struct Count {
    const char* name;
    int value;
    int max;
  };
  const Count counts[] = {
      {"streams_per_device", absl::GetFlag(FLAGS_streams_per_device),
       kMaxThreads},
      {"cpu_threads", absl::GetFlag(FLAGS_cpu_threads), kMaxThreads},
      {"max_inflight_requests", absl::GetFlag(FLAGS_max_inflight_requests),
       INT_MAX},
      {"max_inflight_requests_per_peer",
       absl::GetFlag(FLAGS_max_inflight_requests_per_peer), INT_MAX},
      {"max_concurrent_streams", absl::GetFlag(FLAGS_max_concurrent_streams),
       INT_MAX},
      {"testing_cuda_fault_after_jobs",
       absl::GetFlag(FLAGS_testing_cuda_fault_after_jobs), INT_MAX},
      {"testing_cuda_hang_after_jobs",
       absl::GetFlag(FLAGS_testing_cuda_hang_after_jobs), INT_MAX}};
  for (const Count& count : counts) {
    if (count.value < 0 || count.value > count.max) {
      return absl::InvalidArgumentError(
          count.max == INT_MAX
              ? absl::StrFormat("--%s=%d: expected 0 or more", count.name,
                                count.value)
              : absl::StrFormat("--%s=%d: expected 0 to %d", count.name,
                                count.value, count.max));
    }
  }
  if (const int device = absl::GetFlag(FLAGS_testing_cuda_unusable_device);
      device < -1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--testing_cuda_unusable_device=%d: expected -1 (none) or a device "
        "number",
        device));
  }
  // Where the CPU backend will run, each of its workers transposes on a team
  // of its own: a product in the millions starts thread after thread until
  // one fails, which ends the process with every call in it. (CUDA counts a
  // stream per device instead.)
  if (backend == "cpu" || (backend == "auto" && CudaDeviceCount() == 0)) {
    constexpr int64_t kMaxCpuThreads = 4096;
    const int64_t threads = CpuTransposeThreads();
    if (threads > kMaxCpuThreads) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--streams_per_device=%d (CPU workers) with --cpu_threads=%d each: "
          "%d transpose threads; expected at most %d together (0 counts one "
          "per usable core, %d here)",
          absl::GetFlag(FLAGS_streams_per_device),
          absl::GetFlag(FLAGS_cpu_threads), threads, kMaxCpuThreads,
          kernels::UsableCores()));
    }
  }
  const std::string address = absl::GetFlag(FLAGS_address);
  if (absl::Status parsed = ParseHostPort(address).status(); !parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--address=", address, ": expected HOST:PORT; ", parsed.message()));
  }
  const std::string metrics_address = absl::GetFlag(FLAGS_metrics_address);
  if (!metrics_address.empty()) {
    absl::StatusOr<HostPort> parsed = ParseHostPort(metrics_address);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_address=", metrics_address,
                       ": expected HOST:PORT, or empty for none; ",
                       parsed.status().message()));
    }
    // Debian's civetweb, which serves /metrics, is built without IPv6.
    if (absl::StartsWith(parsed->host, "[")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--metrics_address=", metrics_address,
          ": expected an IPv4 address or a host name (the metrics listener "
          "has no IPv6)"));
    }
    // Else the second listener fails as "the port is in use", held by the
    // first, which is gone by the time anyone looks.
    const HostPort grpc = *ParseHostPort(address);
    const auto wildcard = [](const std::string& host) {
      return host == "0.0.0.0" || host == "[::]";
    };
    if (parsed->port != 0 && parsed->port == grpc.port &&
        (parsed->host == grpc.host || wildcard(parsed->host) ||
         wildcard(grpc.host))) {
      return absl::InvalidArgumentError(
          absl::StrCat("--metrics_address=", metrics_address,
                       ": expected a port other than --address=", address,
                       "'s (both listeners would take it)"));
    }
  }
  struct Seconds {
    const char* name;
    double value;
    double min;
    // 0 means never; other values start at `min`.
    bool zero_is_never = false;
  };
  // Under a second, idle streams would be calls merely between messages, and
  // connections would be replaced faster than they carry calls.
  const Seconds durations[] = {
      {"unready_seconds", absl::GetFlag(FLAGS_unready_seconds), 0},
      {"drain_seconds", absl::GetFlag(FLAGS_drain_seconds), 0},
      {"testing_startup_delay_seconds",
       absl::GetFlag(FLAGS_testing_startup_delay_seconds), 0},
      {"stream_idle_seconds", absl::GetFlag(FLAGS_stream_idle_seconds), 1,
       true},
      {"gpu_hang_seconds", absl::GetFlag(FLAGS_gpu_hang_seconds), 1, true},
      {"keepalive_seconds", absl::GetFlag(FLAGS_keepalive_seconds), 0.01},
      {"keepalive_timeout_seconds",
       absl::GetFlag(FLAGS_keepalive_timeout_seconds), 0.01},
      {"max_connection_age_seconds",
       absl::GetFlag(FLAGS_max_connection_age_seconds), 1, true}};
  for (const Seconds& duration : durations) {
    if (duration.zero_is_never && duration.value == 0) continue;
    if (!(duration.value >= duration.min && duration.value <= 24 * 3600)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--%s=%g: expected %s%g to 86400 seconds", duration.name,
          duration.value, duration.zero_is_never ? "0 (never) or " : "",
          duration.min));
    }
  }
  return absl::OkStatus();
}

// The server takes flags only: CheckFlags, after a word that is not a flag
// (`--tls_client_names=a, b` passes " b" on its own).
absl::Status CheckArgs(const std::vector<char*>& positional) {
  if (positional.size() > 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("unexpected argument '%s': expected only flags, "
                        "--name=value",
                        positional[1]));
  }
  return CheckFlags();
}

// A flag's file as WatchedFiles read it; the error names the flag.
absl::StatusOr<std::string> FlagFileContents(
    absl::string_view flag, const absl::StatusOr<std::string>& contents) {
  if (!contents.ok()) {
    return absl::Status(
        contents.status().code(),
        absl::StrCat("--", flag, ": ", contents.status().message()));
  }
  return contents;
}

// `status` about the file a flag names, saying which ("--tls_key=k.pem is not
// the key of ...").
absl::Status NameFlagFile(absl::string_view flag, const std::string& path,
                          const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("--", flag, "=", path, " ",
                                                  status.message()));
}

// The files the TLS flags name, in this order: certificate chain, key, and the
// client CA where there is one; none for plaintext.
std::vector<std::string> TlsFlagFiles() {
  if (absl::GetFlag(FLAGS_tls_cert).empty()) return {};
  std::vector<std::string> paths = {absl::GetFlag(FLAGS_tls_cert),
                                    absl::GetFlag(FLAGS_tls_key)};
  if (!absl::GetFlag(FLAGS_tls_client_ca).empty()) {
    paths.push_back(absl::GetFlag(FLAGS_tls_client_ca));
  }
  return paths;
}

// Checks that what the TLS files hold (`files` of TlsFlagFiles()) can work:
// the certificate the server presents, or what is wrong, naming the flag and
// the file.
absl::StatusOr<CertificateFacts> CheckTlsFiles(const WatchedFiles& files) {
  constexpr absl::string_view kFlags[] = {"tls_cert", "tls_key",
                                          "tls_client_ca"};
  std::vector<std::string> pems;
  for (size_t i = 0; i < files.paths().size(); ++i) {
    TRANSPOSE_ASSIGN_OR_RETURN(
        pems.emplace_back(), FlagFileContents(kFlags[i], files.contents()[i]));
  }
  absl::StatusOr<CertificateFacts> facts = ReadFirstCertificate(pems[0]);
  TRANSPOSE_RETURN_IF_ERROR(
      NameFlagFile(kFlags[0], files.paths()[0], facts.status()));
  TRANSPOSE_RETURN_IF_ERROR(
      NameFlagFile(kFlags[1], files.paths()[1],
                   CheckPemKeyMatchesCertificate(pems[1], pems[0])));
  if (pems.size() > 2) {
    TRANSPOSE_RETURN_IF_ERROR(NameFlagFile(kFlags[2], files.paths()[2],
                                           CheckPemCertificates(pems[2])));
  }
  return facts;
}

// The tokens in what `file` holds of --auth_token_file; errors name the flag
// and the file.
absl::StatusOr<std::vector<std::string>> ReadTokenFlagFile(
    const WatchedFiles& file) {
  TRANSPOSE_ASSIGN_OR_RETURN(
      std::string contents,
      FlagFileContents("auth_token_file", file.contents()[0]));
  absl::StatusOr<std::vector<std::string>> tokens = ParseTokenFile(contents);
  TRANSPOSE_RETURN_IF_ERROR(
      NameFlagFile("auth_token_file", file.paths()[0], tokens.status()));
  return tokens;
}

// "O=Example,CN=server, valid until 2026-12-03 10:00:00 UTC", or "...,
// EXPIRED at ...".
std::string DescribeCertificate(const CertificateFacts& facts) {
  // cert-manager leaves the subject empty unless asked for a common name.
  return absl::StrCat(
      facts.subject.empty() ? "a certificate with no subject" : facts.subject,
      facts.not_after < absl::Now() ? ", EXPIRED at " : ", valid until ",
      absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", facts.not_after,
                       absl::UTCTimeZone()));
}

// The TLS files read again each second, for the log and the expiry gauge; gRPC
// reads them itself (GrpcServerOptions::tls_reload_interval) and serves what
// they hold, usable or not.
class TlsFilesReloader {
 public:
  // `files` as the server started with them, the certificate they hold, and
  // how often gRPC reads them (--tls_reload_seconds).
  TlsFilesReloader(WatchedFiles files, const CertificateFacts& facts,
                   int grpc_reload_seconds)
      : files_(std::move(files)),
        grpc_reload_seconds_(grpc_reload_seconds),
        expiry_seconds_(ExpirySeconds(facts)) {}

  void Poll() {
    if (!files_.Poll()) return;
    absl::StatusOr<CertificateFacts> facts = CheckTlsFiles(files_);
    // The gauge first: what reads the log line may read the gauge next.
    expiry_seconds_ = facts.ok() ? ExpirySeconds(*facts) : 0;
    if (facts.ok()) {
      Log(LogLevel::kInfo,
          "TLS files changed: connections made from %ds on get %s",
          grpc_reload_seconds_, DescribeCertificate(*facts));
    } else {
      Log(LogLevel::kError,
          "TLS files changed and cannot be used (%s): from %ds on, new "
          "connections fail their handshake until the files are fixed; "
          "connections made before keep working",
          facts.status().message(), grpc_reload_seconds_);
    }
  }

  // When the certificate in the files expires, in Unix seconds; 0 while they
  // cannot be used.
  double expiry_seconds() const { return expiry_seconds_; }

 private:
  static double ExpirySeconds(const CertificateFacts& facts) {
    return absl::ToDoubleSeconds(facts.not_after - absl::UnixEpoch());
  }

  WatchedFiles files_;
  const int grpc_reload_seconds_;
  std::atomic<double> expiry_seconds_;
};

// The --auth_token_file read again, so that a token added or removed (a
// Kubernetes Secret's update, say) takes effect without a restart. A file that
// cannot be read or holds no usable token is reported once, and the tokens in
// use stay.
class TokenFileReloader {
 public:
  // `file`: the token file as the server started with it, or none.
  TokenFileReloader(WatchedFiles file, AccessControl& access)
      : file_(std::move(file)), access_(access) {}

  void Poll() {
    if (!file_.Poll()) return;
    const absl::StatusOr<std::string>& contents = file_.contents()[0];
    absl::StatusOr<int> count = contents.ok()
                                    ? access_.ReplaceTokens(*contents)
                                    : absl::StatusOr<int>(contents.status());
    if (count.ok()) {
      Log(LogLevel::kInfo, "--auth_token_file=%s changed: %d token%s now",
          file_.paths()[0], *count, *count == 1 ? "" : "s");
    } else {
      Log(LogLevel::kError,
          "--auth_token_file=%s changed and cannot be used (%s); the tokens "
          "read before stay",
          file_.paths()[0], count.status().message());
    }
  }

 private:
  WatchedFiles file_;
  AccessControl& access_;
};

// Ends the process after a drain without running destructors: nothing is
// left that the OS does not clean up, and destroying the gRPC server can block
// for seconds (gRPC 1.51's shutdown joins an executor thread that may sit in a
// 10 s poll; seen in 1 of ~20 drains, which then outlasted their grace).
[[noreturn]] void ExitAfterDrain() {
  std::fflush(nullptr);
#if defined(__SANITIZE_ADDRESS__)
  __lsan_do_leak_check();  // std::_Exit skips the check LeakSanitizer runs.
#endif
  std::_Exit(0);
}

// SIGINT and SIGTERM, taken by one thread from the first moment of Run: a
// signal before the server serves stops the process at once (nothing is served
// yet, and a start-up stuck setting up a GPU must not need SIGKILL); once it
// serves, the first starts the drain and a second stops the process without
// waiting for it. Made once and never destroyed: the thread outlives Run's
// early returns.
class SignalHandler {
 public:
  static SignalHandler& Start() {
    static SignalHandler* const handler = new SignalHandler();
    return *handler;
  }

  // From now on a first signal starts the drain: called before the server
  // says it listens, so that whoever reads that line and signals at once gets
  // a drain. `running_calls` says, for a second signal's log line, what it
  // cuts off.
  void Serving(std::function<int()> running_calls) {
    std::lock_guard<std::mutex> lock(mutex_);
    running_calls_ = std::move(running_calls);
  }

  // Waits for the signal that starts the drain, and returns it.
  int AwaitDrainSignal() {
    drain_.WaitForNotification();
    std::lock_guard<std::mutex> lock(mutex_);
    return first_signal_;
  }

 private:
  SignalHandler() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
    // Signals go to this thread, never to gRPC's or the backends' threads:
    // every thread started from here on inherits the mask.
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
    std::thread([this] { Wait(); }).detach();
  }

  void Wait() {
    int signal = 0;
    sigwait(&signals_, &signal);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (running_calls_ == nullptr) {
        Log(LogLevel::kWarning, "signal %d during start-up: stopping", signal);
        std::fflush(nullptr);
        std::_Exit(1);
      }
      first_signal_ = signal;
    }
    drain_.Notify();
    // A second signal is an operator who will not wait for the drain.
    int again = 0;
    sigwait(&signals_, &again);
    std::lock_guard<std::mutex> lock(mutex_);
    // The calls cut off here are neither counted nor logged one by one.
    Log(LogLevel::kWarning,
        "signal %d again: stopping now, without waiting for the %d running "
        "calls",
        again, running_calls_());
    std::fflush(nullptr);
    std::_Exit(1);
  }

  sigset_t signals_;
  std::mutex mutex_;
  std::function<int()> running_calls_;  // Guarded by mutex_; set once serving.
  int first_signal_ = 0;                // Guarded by mutex_.
  Notification drain_;
};

int Run(const std::vector<char*>& positional) {
  SignalHandler& signals = SignalHandler::Start();

  if (absl::Status status = CheckArgs(positional); !status.ok()) {
    std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
    return 2;
  }
  LogLevel level;
  ParseLogLevel(absl::GetFlag(FLAGS_log_level), &level);  // Checked above.
  SetLogLevel(level);
  RouteGrpcLogs();

  auto registry = std::make_shared<prometheus::Registry>();
  Metrics metrics(*registry, TRANSPOSE_VERSION);

  // /metrics starts before host memory is planned, so that its threads'
  // stacks, whatever size the CivetWeb build gives them (Debian's: 100 KiB),
  // are in the address space the plan finds mapped. Until the service's gauges
  // join, a scrape gets the registry's metrics.
  std::unique_ptr<prometheus::Exposer> exposer;
  const std::string metrics_address = absl::GetFlag(FLAGS_metrics_address);
  if (!metrics_address.empty()) {
    try {
      // CivetWeb's defaults (2 threads, 30 s to read a request) let two
      // connections that never finish their request hold /metrics for good.
      exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
          "listening_ports", metrics_address, "num_threads",
          std::to_string(kMetricsThreads), "request_timeout_ms",
          std::to_string(kMetricsRequestTimeoutMs)});
    } catch (const std::exception& e) {
      // CivetWeb says only "null context when constructing CivetServer".
      Log(LogLevel::kError,
          "cannot serve metrics on %s: the port is in use, or the host is "
          "not this machine's (%s)",
          metrics_address, e.what());
      return 1;
    }
  }
  // CivetWeb takes a handler's path as a prefix pattern, so "/metrics" would
  // also answer /metricsx or /metrics.txt; "$" ends the pattern there, so a
  // mistyped scrape path gets a 404 instead of the metrics.
  const auto expose = [&exposer](std::weak_ptr<prometheus::Collectable> what) {
    if (exposer != nullptr) exposer->RegisterCollectable(what, "/metrics$");
  };
  expose(registry);

  absl::StatusOr<Backends> backends =
      CreateBackends(absl::GetFlag(FLAGS_backend), metrics);
  if (!backends.ok()) {
    Log(LogLevel::kError, "no backend: %s", backends.status().ToString());
    return 1;
  }
  if (!backends->memory.ok()) {
    Log(LogLevel::kError, "host memory: %s",
        backends->memory.status().message());
    return 1;
  }
  const HostMemoryPlan memory = *backends->memory;
  if (memory.lowered) {
    Log(LogLevel::kWarning,
        "host memory: the limits the flags set would let this server hold up "
        "to %d bytes (%d of them for its threads and gRPC), more than the %d "
        "it may take (%s): lowered "
        "--max_inflight_bytes to %d%s, --buffer_pool_bytes to %d and gRPC's "
        "quota for received messages to %d, %d bytes at worst; set them to "
        "fit, or give the server more memory",
        memory.flags_worst_case_bytes, memory.reserve_bytes,
        memory.memory_left_bytes, kMemoryLeftSource, memory.max_inflight_bytes,
        memory.max_inflight_bytes_per_peer == 0
            ? ""
            : absl::StrFormat(" (--max_inflight_bytes_per_peer to %d)",
                              memory.max_inflight_bytes_per_peer),
        memory.buffer_pool_bytes, memory.transport_quota_bytes,
        memory.worst_case_bytes);
  } else if (memory.worst_case_bytes > 0) {
    Log(LogLevel::kInfo,
        "host memory: up to %d bytes at worst under the flags' limits (%d of "
        "them for its threads and gRPC), of %d this server may take",
        memory.worst_case_bytes, memory.reserve_bytes,
        memory.memory_left_bytes);
  }
  std::vector<std::string> names;
  for (const auto& backend : backends->list) {
    const BackendInfo& info = backend->info();
    names.push_back(info.name);
    Log(LogLevel::kInfo,
        "backend %s: %s, %d streams, copy bandwidth %.1f GB/s%s", info.name,
        info.device_name, info.streams,
        info.copy_bandwidth_bytes_per_second / 1e9,
        KernelLoadingSuffix(info.kernel_loading));
    if (info.kernel_loading == KernelLoading::kOnFirstRun) {
      const char* setting = std::getenv("CUDA_MODULE_LOADING");
      Log(LogLevel::kWarning,
          "%s loads each kernel on its first run (CUDA_MODULE_LOADING=%s): "
          "the first request to use each reports up to milliseconds more "
          "kernel time; unset it to load them at start",
          info.name, setting == nullptr ? "" : setting);
    }
  }
  const bool on_gpus = absl::c_any_of(names, [](const std::string& name) {
    return absl::StartsWith(name, "cuda:");
  });
  // Loud, since a flag file or --fromenv could set it where nobody meant to.
  if (const int jobs = absl::GetFlag(FLAGS_testing_cuda_fault_after_jobs);
      jobs > 0 && on_gpus) {
    Log(LogLevel::kWarning,
        "--testing_cuda_fault_after_jobs=%d: a testing flag; every GPU faults "
        "on purpose after %d jobs and leaves service",
        jobs, jobs);
  }

  if (const double delay = absl::GetFlag(FLAGS_testing_startup_delay_seconds);
      delay > 0) {
    Log(LogLevel::kWarning,
        "--testing_startup_delay_seconds=%g: a testing flag; start-up waits",
        delay);
    absl::SleepFor(absl::Seconds(delay));
  }

  EngineOptions engine_options;
  engine_options.max_matrix_bytes = absl::GetFlag(FLAGS_max_matrix_bytes);
  engine_options.max_inflight_bytes = memory.max_inflight_bytes;
  engine_options.max_inflight_requests =
      absl::GetFlag(FLAGS_max_inflight_requests);
  engine_options.max_inflight_bytes_per_caller =
      memory.max_inflight_bytes_per_peer;
  engine_options.max_inflight_requests_per_caller =
      absl::GetFlag(FLAGS_max_inflight_requests_per_peer);
  Engine engine(std::move(backends->list), engine_options);
  // Said, since every larger request is refused for good (a budget meant in
  // KiB, say, would refuse nearly all).
  if (engine.options().max_matrix_bytes < engine_options.max_matrix_bytes) {
    Log(LogLevel::kWarning,
        "matrices are limited to %d bytes, the admission budget "
        "(--max_inflight_bytes or --max_inflight_bytes_per_peer), not "
        "--max_matrix_bytes=%d: larger ones are refused",
        engine.options().max_matrix_bytes, engine_options.max_matrix_bytes);
  }

  // A buffer larger than the pool is pinned (or mapped) and freed again with
  // every request: a 1 GiB request ran at 56.5% of its pooled throughput on
  // the H200 (docs/BENCHMARKS.md).
  const uint64_t largest_matrix = engine.options().max_matrix_bytes;
  const uint64_t pool_bytes = memory.buffer_pool_bytes;
  if (const uint64_t buffer = BufferPool::SizeClass(largest_matrix);
      buffer > pool_bytes) {
    Log(LogLevel::kWarning,
        "--buffer_pool_bytes=%d cannot keep a buffer for the largest matrices "
        "(up to %d bytes, in buffers of %d), so theirs are allocated%s and "
        "freed with every request, which can halve their throughput; raise "
        "--buffer_pool_bytes to %d or more, or lower --max_matrix_bytes",
        pool_bytes, largest_matrix, buffer, on_gpus ? " (pinned)" : "", buffer);
  }

  ServiceOptions service_options;
  service_options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  service_options.response_chunk_bytes =
      absl::GetFlag(FLAGS_response_chunk_bytes);
  service_options.stream_idle_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_stream_idle_seconds));
  service_options.version = TRANSPOSE_VERSION;
  AccessPolicy access_policy;
  access_policy.require_client_certificate =
      !absl::GetFlag(FLAGS_tls_client_ca).empty();
  access_policy.client_names = absl::GetFlag(FLAGS_tls_client_names);
  if (!access_policy.client_names.empty()) {
    Log(LogLevel::kInfo,
        "mutual TLS: serving clients whose certificate names %s",
        absl::StrJoin(access_policy.client_names, ", "));
  }
  GrpcServerOptions server_options;
  WatchedFiles tls_files(TlsFlagFiles());
  std::unique_ptr<TlsFilesReloader> tls_reloader;
  if (!tls_files.paths().empty()) {
    absl::StatusOr<CertificateFacts> certificate = CheckTlsFiles(tls_files);
    if (!certificate.ok()) {
      Log(LogLevel::kError, "%s", certificate.status().ToString());
      return 1;
    }
    Log(certificate->not_after < absl::Now() ? LogLevel::kWarning
                                             : LogLevel::kInfo,
        "TLS: serving %s", DescribeCertificate(*certificate));
    server_options.tls_cert_chain_file = tls_files.paths()[0];
    server_options.tls_private_key_file = tls_files.paths()[1];
    server_options.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
    server_options.tls_reload_interval =
        absl::Seconds(absl::GetFlag(FLAGS_tls_reload_seconds));
    tls_reloader = std::make_unique<TlsFilesReloader>(
        std::move(tls_files), *certificate,
        absl::GetFlag(FLAGS_tls_reload_seconds));
  }
  const std::string token_path = absl::GetFlag(FLAGS_auth_token_file);
  WatchedFiles token_file(token_path.empty()
                              ? std::vector<std::string>{}
                              : std::vector<std::string>{token_path});
  if (!token_path.empty()) {
    absl::StatusOr<std::vector<std::string>> tokens =
        ReadTokenFlagFile(token_file);
    if (!tokens.ok()) {
      Log(LogLevel::kError, "%s", tokens.status().ToString());
      return 1;
    }
    // What an operator checks first when clients get UNAUTHENTICATED, or
    // when tokens should be on and are not.
    Log(LogLevel::kInfo, "bearer tokens: %d from --auth_token_file=%s%s",
        tokens->size(), token_path,
        server_options.tls_cert_chain_file.empty()
            ? " over plaintext: they cross the network unencrypted (use "
              "--tls_cert and --tls_key)"
            : "");
    access_policy.tokens = *std::move(tokens);
  } else {
    // The same check when tokens are off on purpose, or were meant to be on.
    // Health is open to all either way.
    Log(LogLevel::kInfo, "bearer tokens: off (no --auth_token_file)%s",
        absl::GetFlag(FLAGS_tls_client_ca).empty()
            ? "; nor client certificates (no --tls_client_ca): any caller "
              "that reaches the gRPC port is served"
            : absl::StrCat(
                  "; callers need a client certificate from --tls_client_ca",
                  access_policy.client_names.empty()
                      ? ""
                      : " naming one of --tls_client_names"));
  }
  AccessControl access(access_policy);
  TokenFileReloader token_reloader(std::move(token_file), access);
  TransposeService service(engine, metrics, access, service_options);

  // The gauges below read the engine, the service and the TLS reloader:
  // /metrics stops before they go, whichever way Run returns.
  absl::Cleanup stop_metrics = [&exposer] { exposer.reset(); };
  auto admission = std::make_shared<CallbackGauges>();
  admission->Add(
      "transpose_admitted_bytes",
      "Bytes of matrices admitted and not yet finished (against "
      "--max_inflight_bytes).",
      [&engine] { return static_cast<double>(engine.inflight_bytes()); });
  admission->Add("transpose_admitted_requests",
                 "Requests admitted and not yet finished (against "
                 "--max_inflight_requests).",
                 [&engine] { return engine.inflight_requests(); });
  // The limits beside them, so that dashboards and alerts can tell a pod at
  // its limits from a busy one (0: no limit).
  admission->Add(
      "transpose_admission_limit_bytes",
      "--max_inflight_bytes: bytes of matrices admitted at once (0: no limit).",
      [limit = engine_options.max_inflight_bytes] {
        return static_cast<double>(limit);
      });
  admission->Add(
      "transpose_admission_limit_requests",
      "--max_inflight_requests: requests admitted at once (0: no limit).",
      [limit = engine_options.max_inflight_requests] {
        return static_cast<double>(limit);
      });
  admission->Add(
      "transpose_admitted_peers",
      "Client hosts holding admitted requests (counted only under "
      "--max_inflight_bytes_per_peer or --max_inflight_requests_per_peer).",
      [&engine] { return engine.callers(); });
  expose(admission);
  // The exposer holds collectables weakly: this one lives as long as Run.
  auto tls = std::make_shared<CallbackGauges>();
  if (tls_reloader != nullptr) {
    tls->Add("transpose_tls_certificate_expiry_timestamp_seconds",
             "When the certificate in the --tls_cert file expires, in Unix "
             "seconds; 0 while the TLS files cannot be used.",
             [&tls_reloader] { return tls_reloader->expiry_seconds(); });
    expose(tls);
  }
  // GPU utilisation and memory from the driver, where it has NVML.
  std::vector<NvmlCollector::Device> gpus;
  for (const auto& backend : engine.backends()) {
    if (!backend->info().pci_bus_id.empty()) {
      gpus.push_back({backend->info().name, backend->info().pci_bus_id});
    }
  }
  std::shared_ptr<NvmlCollector> nvml =
      gpus.empty() ? nullptr : NvmlCollector::Create(gpus);
  if (nvml != nullptr) expose(nvml);
  if (!gpus.empty()) {
    Log(LogLevel::kInfo, "NVML gauges %s",
        nvml != nullptr ? "on" : "off (no NVML)");
  }

  server_options.address = absl::GetFlag(FLAGS_address);
  if (tls_reloader != nullptr && access.enabled()) {
    server_options.tls_header_check = service.MakeHeaderCheck();
  }
  server_options.reflection = !access.enabled();
  server_options.max_message_bytes = service_options.max_message_bytes;
  server_options.max_transport_bytes = memory.transport_quota_bytes;
  server_options.keepalive_time =
      absl::Seconds(absl::GetFlag(FLAGS_keepalive_seconds));
  server_options.keepalive_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_keepalive_timeout_seconds));
  if (const double age = absl::GetFlag(FLAGS_max_connection_age_seconds);
      age > 0) {
    server_options.max_connection_age = absl::Seconds(age);
  }
  server_options.max_concurrent_streams =
      absl::GetFlag(FLAGS_max_concurrent_streams);
  server_options.health_service_name =
      v1::TransposeService::service_full_name();
  absl::StatusOr<std::unique_ptr<GrpcServer>> server =
      GrpcServer::Start(server_options, service);
  if (!server.ok()) {
    Log(LogLevel::kError, "%s", server.status().ToString());
    return 1;
  }

  signals.Serving([&service] { return service.calls().running(); });
  // Scripts and tests read these two lines to find the ports.
  std::printf("listening on %s:%d\n", (*server)->host().c_str(),
              (*server)->port());
  if (exposer != nullptr) {
    std::printf("metrics on %s:%d\n",
                ParseHostPort(metrics_address)->host.c_str(),
                exposer->GetListeningPorts().front());
  }
  std::fflush(stdout);
  Log(LogLevel::kInfo, "serving %s on %s:%d with %s", TRANSPOSE_VERSION,
      (*server)->host(), (*server)->port(), absl::StrJoin(names, ", "));

  // Each second until the process ends: health follows the engine
  // (NOT_SERVING once no device is healthy) until the drain takes it over, the
  // failed calls' held-back lines are counted in the log, and the token file
  // is read again.
  std::mutex health_mutex;
  bool draining = false;  // Guarded by health_mutex.
  Notification stopped;
  std::thread watch([&] {
    bool serving = true;
    while (!stopped.WaitForNotificationWithTimeout(absl::Seconds(1))) {
      service.LogHeldBackFailures();
      token_reloader.Poll();
      if (tls_reloader != nullptr) tls_reloader->Poll();
      std::lock_guard<std::mutex> lock(health_mutex);
      if (!draining && engine.healthy() != serving) {
        serving = !serving;
        Log(serving ? LogLevel::kInfo : LogLevel::kError, "health: %s",
            serving ? "SERVING" : "NOT_SERVING (no healthy device)");
        (*server)->SetServing(serving);
      }
    }
  });

  const int signal = signals.AwaitDrainSignal();
  const absl::Duration unready =
      absl::Seconds(absl::GetFlag(FLAGS_unready_seconds));
  const absl::Duration drain =
      absl::Seconds(absl::GetFlag(FLAGS_drain_seconds));
  // In the flags' unit: FormatDuration writes a zero as a bare "0".
  Log(LogLevel::kInfo,
      "signal %d: NOT_SERVING for %gs, then draining for up to %gs", signal,
      absl::ToDoubleSeconds(unready), absl::ToDoubleSeconds(drain));
  // Load balancers and health-checking clients move away while calls are
  // still taken; then new calls get UNAVAILABLE and running ones may finish.
  // The service refuses the calls it sees itself. The transport's shutdown
  // starts at once too: it closes the listener and sends every connection a
  // GOAWAY, so clients that keep a connection (to a Service's virtual IP, say)
  // reconnect, and reach another server, while this one's calls finish. A
  // call caught between the two can end CANCELLED; the client library sends
  // it again.
  {
    std::lock_guard<std::mutex> lock(health_mutex);
    draining = true;
    (*server)->SetServing(false);
  }
  absl::SleepFor(unready);
  const absl::Time deadline = absl::Now() + drain;
  service.calls().Close(deadline);
  Notification transport_stopped;
  std::thread transport([&server, deadline, &transport_stopped] {
    (*server)->Shutdown(deadline);
    transport_stopped.Notify();
  });
  const bool calls_done = service.calls().AwaitNoCalls(deadline);
  // The wait's clock is monotonic, the deadline's the system's: a wait that
  // ran out may find the deadline not quite passed.
  const int cut_off = calls_done ? service.calls().CutOff()
                                 : std::max(service.calls().CutOff(),
                                            service.calls().running());
  if (cut_off > 0) {
    Log(LogLevel::kWarning,
        "drain: %d calls still running after %gs are cut off (UNAVAILABLE); "
        "--drain_seconds (and the pod's termination grace period) may be "
        "too short for them",
        cut_off, absl::ToDoubleSeconds(drain));
  }
  // Once the calls are done, gRPC's shutdown waits only for each connection
  // to answer its GOAWAY, and idle clients answer late: a gRPC client polls
  // an idle connection only every 5 s (its backup poller), one connection
  // after another, so one with four connections answers in 20 s. Their calls
  // are answered, and they reconnect on the close as on the GOAWAY, so the
  // wait is short. With calls cut off, gRPC's shutdown can outlast the
  // deadline by up to a keepalive timeout, waiting on a connection that does
  // not answer; the drain's end is the promise (a pod's termination grace is
  // reckoned from it).
  constexpr absl::Duration kShutdownSlack = absl::Seconds(1);
  if (transport_stopped.WaitForNotificationWithTimeout(
          calls_done ? kShutdownSlack
                     : deadline + kShutdownSlack - absl::Now())) {
    transport.join();
  } else if (calls_done) {
    Log(LogLevel::kInfo,
        "drain: every call is done; stopping without waiting for idle "
        "connections to answer the GOAWAY");
    transport.detach();
  } else {
    Log(LogLevel::kWarning,
        "drain: gRPC's shutdown still waits on a connection that does not "
        "answer, %gs after the drain ended; stopping without it",
        absl::ToDoubleSeconds(kShutdownSlack));
    transport.detach();
  }
  stopped.Notify();
  watch.join();
  service.LogHeldBackFailures();
  Log(LogLevel::kInfo, "stopped");
  ExitAfterDrain();
}

}  // namespace
}  // namespace transpose

int main(int argc, char** argv) {
  // CUDA loads a kernel when it first runs, by default: the first request's
  // then took 0.13 to 3.5 ms instead of 0.05 (4096^2 float32 on an H100), and
  // each other kernel's first run about 10 us more, times the server reports
  // and /metrics keeps (docs/BENCHMARKS.md). Loaded as CUDA starts, they cost
  // 18 MB of host memory and no start-up time measurable. Set before any
  // thread starts (setenv is not safe beside getenv). An operator's own
  // setting stands, but not an empty one (a manifest's value left blank),
  // under which CUDA loads lazily too.
  const char* module_loading = std::getenv("CUDA_MODULE_LOADING");
  if (module_loading == nullptr || *module_loading == '\0') {
    setenv("CUDA_MODULE_LOADING", "EAGER", /*overwrite=*/1);
  }
  transpose::SetUpProcess();
  transpose::ProgramUsage usage;
  usage.name = "transpose_server";
  usage.version = TRANSPOSE_VERSION;
  usage.main_source_suffix = "server/main.cc";
  usage.check_args = transpose::CheckArgs;
  usage.usage_message =
      "Serves matrix transposes over gRPC on GPUs (or the CPU).\n"
      "Usage: transpose_server [--address=HOST:PORT] "
      "[--backend=auto|cuda|cpu] ...";
  return transpose::Run(transpose::ParseCommandLine(argc, argv, usage));
}
