#include "server/metrics.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iomanip>
#include <limits>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/registry.h"

namespace transpose {
namespace {

// Where one observation of `value` in `family` landed: the upper bound of the
// first bucket that counts it, and whether the bucket below it is empty (so
// the value is told apart from smaller ones).
struct Landing {
  double upper_bound = std::numeric_limits<double>::quiet_NaN();
  bool bucket_below_empty = false;
};

Landing Find(const prometheus::Registry& registry, const std::string& family) {
  for (const prometheus::MetricFamily& found : registry.Collect()) {
    if (found.name != family) continue;
    for (const prometheus::ClientMetric& metric : found.metric) {
      if (metric.histogram.sample_count != 1) continue;
      const auto& buckets = metric.histogram.bucket;
      for (size_t i = 0; i < buckets.size(); ++i) {
        if (buckets[i].cumulative_count == 1) {
          return {buckets[i].upper_bound,
                  i > 0 && buckets[i - 1].cumulative_count == 0};
        }
      }
    }
  }
  return {};
}

// Each value, one per fresh registry, must land in a finite bucket with an
// empty one below: neither in +Inf nor lumped in with everything smaller.
class MetricsBucketTest : public ::testing::Test {
 protected:
  Landing Request(double seconds) {
    prometheus::Registry registry;
    Metrics metrics(registry, "test");
    metrics.RecordRequest(RpcMethod::kTransposeStream, absl::StatusCode::kOk,
                          seconds);
    return Find(registry, "transpose_request_duration_seconds");
  }
  Landing Kernel(const std::string& family, double seconds, double bandwidth,
                 double fraction) {
    prometheus::Registry registry;
    Metrics metrics(registry, "test");
    Metrics::BackendSeries* series =
        metrics.AddBackend("cuda:0", {std::string("padded_64x8")});
    TransposeStats stats;
    stats.algorithm = "padded_64x8";
    stats.kernel_seconds = seconds;
    stats.bandwidth_bytes_per_second = bandwidth;
    stats.peak_fraction = fraction;
    metrics.RecordKernel(*series, stats, 1 << 20);
    return Find(registry, family);
  }
};

void ExpectResolved(const Landing& landing, double value) {
  EXPECT_TRUE(std::isfinite(landing.upper_bound))
      << value << " landed in +Inf (or nowhere)";
  EXPECT_GE(landing.upper_bound, value);
  EXPECT_TRUE(landing.bucket_below_empty)
      << value << " shares the lowest bucket with every smaller value";
}

// A few GiB over a slow link takes minutes each way.
TEST_F(MetricsBucketTest, RequestDurationsFromAMillisecondToAnHour) {
  for (double seconds : {1e-3, 150.0, 1500.0, 3000.0}) {
    ExpectResolved(Request(seconds), seconds);
  }
}

TEST_F(MetricsBucketTest, KernelFiguresOverTheirRealRange) {
  for (double seconds : {5e-6, 2.0}) {
    ExpectResolved(
        Kernel("transpose_kernel_duration_seconds", seconds, 1e12, 0.5),
        seconds);
  }
  // A small job on a slow host, up to an H200's copy rate.
  for (double bandwidth : {5e7, 5e8, 4.5e12}) {
    ExpectResolved(Kernel("transpose_kernel_bandwidth_bytes_per_second", 1e-3,
                          bandwidth, 0.5),
                   bandwidth);
  }
  // Past 1: a matrix that fits a cache the calibration's copy did not.
  for (double fraction : {0.015, 0.97, 1.3, 1.8}) {
    ExpectResolved(
        Kernel("transpose_kernel_peak_fraction", 1e-3, 1e12, fraction),
        fraction);
  }
}

// Every bucket bound is the double nearest its short decimal text, so that a
// query's le="1e-05" names it.
TEST(MetricsBucketBoundsTest, AreTheNumbersTheirLabelsSay) {
  prometheus::Registry registry;
  Metrics metrics(registry, "test");
  metrics.RecordRequest(RpcMethod::kTranspose, absl::StatusCode::kOk, 1.0);
  Metrics::BackendSeries* series =
      metrics.AddBackend("cuda:0", {std::string("padded_64x8")});
  TransposeStats stats;
  stats.algorithm = "padded_64x8";
  metrics.RecordKernel(*series, stats, 1 << 20);
  int histograms = 0;
  for (const prometheus::MetricFamily& family : registry.Collect()) {
    if (family.type != prometheus::MetricType::Histogram) continue;
    ++histograms;
    for (const prometheus::ClientMetric& metric : family.metric) {
      for (const auto& bucket : metric.histogram.bucket) {
        if (std::isinf(bucket.upper_bound)) continue;
        char text[32];
        std::snprintf(text, sizeof(text), "%.3g", bucket.upper_bound);
        EXPECT_EQ(std::strtod(text, nullptr), bucket.upper_bound)
            << family.name << " bound " << text << " is "
            << std::setprecision(17) << bucket.upper_bound;
      }
    }
  }
  EXPECT_EQ(histograms, 4);
}

}  // namespace
}  // namespace transpose
