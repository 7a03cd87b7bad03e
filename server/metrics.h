// The service's Prometheus metrics (names are a contract: dashboards and alert
// rules use them). Built once at start-up and injected; every label child is
// created here and kept, because prometheus-cpp locks and hashes on each
// Family::Add.
#ifndef TRANSPOSE_SERVER_METRICS_H_
#define TRANSPOSE_SERVER_METRICS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/core/stats.h"

namespace transpose {

// The RPCs, as the `method` label names them.
enum class RpcMethod { kTranspose, kTransposeStream, kGetServerInfo };
absl::string_view RpcMethodName(RpcMethod method);

class Metrics {
 public:
  // One compute backend's series ("cuda:0", "cpu"), handed to the backend that
  // owns them.
  struct BackendSeries {
    struct KernelSeries {
      prometheus::Histogram* duration_seconds;
      prometheus::Histogram* bandwidth_bytes_per_second;
      prometheus::Histogram* peak_fraction;
    };
    std::string name;
    prometheus::Counter* kernel_bytes;
    prometheus::Gauge* peak_bandwidth;
    prometheus::Gauge* busy_streams;
    prometheus::Gauge* device_memory_used_bytes;
    prometheus::Gauge* host_memory_used_bytes;
    // 1 while the backend takes jobs, 0 once a fault took it out of service
    // (set by the backend, which alone knows).
    prometheus::Gauge* healthy;
    absl::flat_hash_map<std::string, KernelSeries> kernels;
  };

  // Registers every family in `registry`, which must outlive this object.
  // `version` labels transpose_build_info.
  Metrics(prometheus::Registry& registry, absl::string_view version);

  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Creates the series of a backend that runs the kernels named `kernel_names`.
  // Call once per backend, at start-up; the result lives as long as this
  // object.
  BackendSeries* AddBackend(absl::string_view backend,
                            absl::Span<const std::string> kernel_names);

  // Records one finished kernel: `bytes` is the matrix size (read once and
  // written once).
  void RecordKernel(BackendSeries& backend, const TransposeStats& stats,
                    uint64_t bytes);

  // Records one finished RPC.
  void RecordRequest(RpcMethod method, absl::StatusCode code, double seconds);
  // Counts a call refused before it ran (at its headers): no duration.
  void RecordRefusal(RpcMethod method, absl::StatusCode code);

  prometheus::Gauge& inflight_requests() { return *inflight_requests_; }

 private:
  static constexpr int kCodes = 17;
  static constexpr int kMethods = 3;

  prometheus::Family<prometheus::Counter>& requests_total_;
  prometheus::Family<prometheus::Histogram>& request_duration_;
  prometheus::Family<prometheus::Histogram>& kernel_duration_;
  prometheus::Family<prometheus::Histogram>& kernel_bandwidth_;
  prometheus::Family<prometheus::Histogram>& kernel_peak_fraction_;
  prometheus::Family<prometheus::Counter>& kernel_bytes_;
  prometheus::Family<prometheus::Gauge>& device_peak_bandwidth_;
  prometheus::Family<prometheus::Gauge>& busy_streams_;
  prometheus::Family<prometheus::Gauge>& device_memory_used_;
  prometheus::Family<prometheus::Gauge>& host_memory_used_;
  prometheus::Family<prometheus::Gauge>& backend_healthy_;
  prometheus::Gauge* inflight_requests_;

  std::array<std::array<prometheus::Counter*, kCodes>, kMethods> requests_{};
  std::array<prometheus::Histogram*, kMethods> durations_{};
  absl::flat_hash_map<std::string, std::unique_ptr<BackendSeries>> backends_;
};

// Gauges read at scrape time through callbacks: values something already keeps
// (the engine's admission counts), exported without an update on the hot path.
class CallbackGauges final : public prometheus::Collectable {
 public:
  // `read` must stay callable while this object is registered with an exposer.
  void Add(std::string name, std::string help, std::function<double()> read);
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  struct Gauge {
    std::string name, help;
    std::function<double()> read;
  };
  std::vector<Gauge> gauges_;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_METRICS_H_
