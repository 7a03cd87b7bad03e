#include "server/metrics.h"

#include <iterator>
#include <memory>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace transpose {
namespace {

using prometheus::Histogram;

// 1, 2.5 and 5 x 10^k, for 10^`low_exponent` <= x <= 10^`high_exponent`.
// Each is the double nearest its decimal text, so that its `le` label reads
// "1e-05", which a query can name, and not "9.999999999999999e-06" (where
// repeated multiplication by 10 lands).
Histogram::BucketBoundaries Decades(int low_exponent, int high_exponent) {
  Histogram::BucketBoundaries bounds;
  constexpr const char* kSteps[] = {"1", "2.5", "5"};
  for (int exponent = low_exponent; exponent <= high_exponent; ++exponent) {
    // The top decade takes its 1 only.
    const int steps = exponent == high_exponent ? 1 : std::size(kSteps);
    for (int i = 0; i < steps; ++i) {
      // SimpleAtod rounds correctly whatever the process's locale.
      double bound = 0;
      absl::SimpleAtod(absl::StrCat(kSteps[i], "e", exponent), &bound);
      bounds.push_back(bound);
    }
  }
  return bounds;
}

// Up to an hour: a matrix of a few GiB over a slow or shared link takes
// minutes each way.
const Histogram::BucketBoundaries& RequestBuckets() {
  static const auto* bounds = [] {
    auto* bounds = new Histogram::BucketBoundaries(Decades(-4, 3));
    bounds->insert(bounds->end(), {1800, 3600});
    return bounds;
  }();
  return *bounds;
}
const Histogram::BucketBoundaries& KernelDurationBuckets() {
  static const auto* bounds = new Histogram::BucketBoundaries(Decades(-6, 1));
  return *bounds;
}
const Histogram::BucketBoundaries& BandwidthBuckets() {
  static const auto* bounds = new Histogram::BucketBoundaries(Decades(7, 13));
  return *bounds;
}
// Past 1 too: a matrix that fits a cache the calibration's copy did not
// transposes faster than that copy.
const Histogram::BucketBoundaries& PeakFractionBuckets() {
  static const auto* bounds = new Histogram::BucketBoundaries{
      0.01, 0.02, 0.05, 0.1, 0.2,  0.3, 0.4,  0.5, 0.6, 0.7, 0.8,
      0.85, 0.9,  0.95, 1.0, 1.05, 1.1, 1.25, 1.5, 2.0, 4.0};
  return *bounds;
}

}  // namespace

absl::string_view RpcMethodName(RpcMethod method) {
  switch (method) {
    case RpcMethod::kTranspose:
      return "Transpose";
    case RpcMethod::kTransposeStream:
      return "TransposeStream";
    case RpcMethod::kGetServerInfo:
      return "GetServerInfo";
  }
  return "unknown";
}

Metrics::Metrics(prometheus::Registry& registry, absl::string_view version)
    : requests_total_(
          prometheus::BuildCounter()
              .Name("transpose_requests_total")
              .Help("RPCs finished, by method and gRPC status code.")
              .Register(registry)),
      request_duration_(
          prometheus::BuildHistogram()
              .Name("transpose_request_duration_seconds")
              .Help("RPC duration, by method: from when the service takes "
                    "the call (Transpose: once its request has arrived) until "
                    "its status is sent (Transpose: until gRPC is done with "
                    "the reply).")
              .Register(registry)),
      kernel_duration_(prometheus::BuildHistogram()
                           .Name("transpose_kernel_duration_seconds")
                           .Help("Transpose kernel time per request.")
                           .Register(registry)),
      kernel_bandwidth_(prometheus::BuildHistogram()
                            .Name("transpose_kernel_bandwidth_bytes_per_second")
                            .Help("Achieved kernel bandwidth per request: "
                                  "(bytes read + written) / kernel time.")
                            .Register(registry)),
      kernel_peak_fraction_(prometheus::BuildHistogram()
                                .Name("transpose_kernel_peak_fraction")
                                .Help("Achieved kernel bandwidth over the "
                                      "device's calibrated copy bandwidth.")
                                .Register(registry)),
      kernel_bytes_(
          prometheus::BuildCounter()
              .Name("transpose_kernel_bytes_total")
              .Help("Bytes read plus bytes written by transpose kernels.")
              .Register(registry)),
      device_peak_bandwidth_(
          prometheus::BuildGauge()
              .Name("transpose_device_peak_bandwidth_bytes_per_second")
              .Help("Copy bandwidth (read + written) calibrated at start-up.")
              .Register(registry)),
      busy_streams_(prometheus::BuildGauge()
                        .Name("transpose_stream_pool_busy_streams")
                        .Help("Streams (or CPU workers) running a request.")
                        .Register(registry)),
      device_memory_used_(
          prometheus::BuildGauge()
              .Name("transpose_device_memory_used_bytes")
              .Help("Memory held by the backend's buffer pools: device "
                    "memory for cuda:N, host memory for cpu.")
              .Register(registry)),
      host_memory_used_(
          prometheus::BuildGauge()
              .Name("transpose_host_memory_used_bytes")
              .Help("Host memory held by the backend's buffer pools, in use "
                    "and idle: page-locked (pinned) memory for cuda:N, which "
                    "the kernel cannot swap out; for cpu, the same buffers "
                    "as transpose_device_memory_used_bytes.")
              .Register(registry)),
      backend_healthy_(
          prometheus::BuildGauge()
              .Name("transpose_backend_healthy")
              .Help("1 while the backend takes jobs; 0 once a fault (a sticky "
                    "CUDA error, or a job past --gpu_hang_seconds) took it out "
                    "of service until the server restarts.")
              .Register(registry)),
      inflight_requests_(&prometheus::BuildGauge()
                              .Name("transpose_inflight_requests")
                              .Help("RPCs started and not yet finished.")
                              .Register(registry)
                              .Add({})) {
  prometheus::BuildGauge()
      .Name("transpose_build_info")
      .Help("Always 1; labels describe the build.")
      .Register(registry)
      .Add({{"version", std::string(version)}})
      .Set(1);
  for (int m = 0; m < kMethods; ++m) {
    const std::string method(RpcMethodName(static_cast<RpcMethod>(m)));
    durations_[m] =
        &request_duration_.Add({{"method", method}}, RequestBuckets());
    for (int c = 0; c < kCodes; ++c) {
      requests_[m][c] = &requests_total_.Add(
          {{"method", method},
           {"code",
            absl::StatusCodeToString(static_cast<absl::StatusCode>(c))}});
    }
  }
}

Metrics::BackendSeries* Metrics::AddBackend(
    absl::string_view backend, absl::Span<const std::string> kernel_names) {
  auto series = std::make_unique<BackendSeries>();
  const std::string name(backend);
  series->name = name;
  series->kernel_bytes = &kernel_bytes_.Add({{"backend", name}});
  series->peak_bandwidth = &device_peak_bandwidth_.Add({{"backend", name}});
  series->busy_streams = &busy_streams_.Add({{"backend", name}});
  series->device_memory_used_bytes =
      &device_memory_used_.Add({{"backend", name}});
  series->host_memory_used_bytes = &host_memory_used_.Add({{"backend", name}});
  series->healthy = &backend_healthy_.Add({{"backend", name}});
  series->healthy->Set(1);
  for (const std::string& kernel : kernel_names) {
    const prometheus::Labels labels = {{"backend", name},
                                       {"algorithm", kernel}};
    series->kernels[kernel] = {
        &kernel_duration_.Add(labels, KernelDurationBuckets()),
        &kernel_bandwidth_.Add(labels, BandwidthBuckets()),
        &kernel_peak_fraction_.Add(labels, PeakFractionBuckets())};
  }
  BackendSeries* result = series.get();
  backends_[name] = std::move(series);
  return result;
}

void Metrics::RecordKernel(BackendSeries& backend, const TransposeStats& stats,
                           uint64_t bytes) {
  backend.kernel_bytes->Increment(2.0 * static_cast<double>(bytes));
  auto it = backend.kernels.find(stats.algorithm);
  if (it == backend.kernels.end()) return;
  it->second.duration_seconds->Observe(stats.kernel_seconds);
  it->second.bandwidth_bytes_per_second->Observe(
      stats.bandwidth_bytes_per_second);
  it->second.peak_fraction->Observe(stats.peak_fraction);
}

void Metrics::RecordRequest(RpcMethod method, absl::StatusCode code,
                            double seconds) {
  RecordRefusal(method, code);
  durations_[static_cast<int>(method)]->Observe(seconds);
}

void Metrics::RecordRefusal(RpcMethod method, absl::StatusCode code) {
  int c = static_cast<int>(code);
  if (c < 0 || c >= kCodes) c = static_cast<int>(absl::StatusCode::kUnknown);
  requests_[static_cast<int>(method)][c]->Increment();
}

void CallbackGauges::Add(std::string name, std::string help,
                         std::function<double()> read) {
  gauges_.push_back({std::move(name), std::move(help), std::move(read)});
}

std::vector<prometheus::MetricFamily> CallbackGauges::Collect() const {
  std::vector<prometheus::MetricFamily> families;
  for (const Gauge& gauge : gauges_) {
    prometheus::ClientMetric metric;
    metric.gauge.value = gauge.read();
    families.push_back(
        {gauge.name, gauge.help, prometheus::MetricType::Gauge, {metric}});
  }
  return families;
}

}  // namespace transpose
