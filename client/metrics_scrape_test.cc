#include "client/metrics_scrape.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/refused_port.h"

namespace transpose {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(MetricsScrapeTest, ParsesTheTextFormat) {
  absl::StatusOr<MetricSamples> samples = ParseMetricsText(
      "# HELP transpose_requests_total RPCs.\n"
      "# TYPE transpose_requests_total counter\n"
      "transpose_requests_total{code=\"OK\",method=\"Transpose\"} 12\n"
      "transpose_inflight_requests 0\n"
      "weird{label=\"with space } inside\"} 1.5e3 1700000000000\n");
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_EQ(
      samples->at("transpose_requests_total{code=\"OK\",method=\"Transpose\"}"),
      12);
  EXPECT_EQ(samples->at("transpose_inflight_requests"), 0);
  EXPECT_EQ(samples->size(), 3u);
}

TEST(MetricsScrapeTest, RejectsLinesWithoutValues) {
  EXPECT_FALSE(ParseMetricsText("transpose_requests_total\n").ok());
  EXPECT_FALSE(ParseMetricsText("transpose_requests_total abc\n").ok());
  EXPECT_FALSE(ParseMetricsText("x{a=\"1\"}\n").ok());
  EXPECT_FALSE(ParseMetricsText("x{a=\"unterminated} 1\n").ok());
  EXPECT_FALSE(ParseMetricsText("x 1 2 3\n").ok());
  EXPECT_FALSE(ParseMetricsText("x 1 abc\n").ok());
}

// Tabs separate as spaces do; an OpenMetrics exemplar after the value is not
// part of the series (it used to be read as one, ending at its brace).
TEST(MetricsScrapeTest, ReadsTabsEscapesAndExemplars) {
  absl::StatusOr<MetricSamples> samples = ParseMetricsText(
      "tabbed\t5\n"
      "x_total{a=\"q\\\"}\"} 7 # {trace_id=\"abc\"} 1\n"
      "y_total 3 1700000000 # {trace_id=\"d\"} 1\n"
      "inf +Inf\n");
  ASSERT_TRUE(samples.ok()) << samples.status();
  EXPECT_EQ(samples->at("tabbed"), 5);
  EXPECT_EQ(samples->at("x_total{a=\"q\\\"}\"}"), 7);
  EXPECT_EQ(samples->at("y_total"), 3);
  EXPECT_TRUE(std::isinf(samples->at("inf")));
  EXPECT_EQ(samples->size(), 4u);
}

TEST(MetricsScrapeTest, DeltaShowsChangedCountersAndMeanBandwidth) {
  const MetricSamples before = {
      {"transpose_requests_total{code=\"OK\"}", 10},
      {"transpose_requests_total{code=\"INTERNAL\"}", 1},
      {"transpose_kernel_bandwidth_bytes_per_second_sum{backend=\"cpu\"}",
       100e9},
      {"transpose_kernel_bandwidth_bytes_per_second_count{backend=\"cpu\"}",
       10},
      {"transpose_kernel_duration_seconds_bucket{le=\"1\"}", 3},
      {"transpose_inflight_requests", 2},
  };
  MetricSamples after = before;
  after["transpose_requests_total{code=\"OK\"}"] = 15;
  after["transpose_kernel_bandwidth_bytes_per_second_sum{backend=\"cpu\"}"] =
      160e9;
  after["transpose_kernel_bandwidth_bytes_per_second_count{backend=\"cpu\"}"] =
      15;
  after["transpose_kernel_duration_seconds_bucket{le=\"1\"}"] = 8;
  after["transpose_inflight_requests"] = 5;
  const std::string delta = FormatMetricsDelta(before, after);
  EXPECT_THAT(delta, HasSubstr("transpose_requests_total{code=\"OK\"} +5\n"));
  EXPECT_THAT(delta, Not(HasSubstr("INTERNAL")));
  EXPECT_THAT(delta, Not(HasSubstr("_bucket")));
  EXPECT_THAT(delta, Not(HasSubstr("inflight")));
  EXPECT_THAT(delta,
              HasSubstr("mean kernel bandwidth{backend=\"cpu\"} 12.00 GB/s"));
}

TEST(MetricsScrapeTest, ACounterThatFellSaysTheServerRestarted) {
  const MetricSamples before = {{"transpose_requests_total{code=\"OK\"}", 10}};
  const MetricSamples after = {{"transpose_requests_total{code=\"OK\"}", 3}};
  const std::string delta = FormatMetricsDelta(before, after);
  EXPECT_EQ(delta,
            "transpose_requests_total{code=\"OK\"} -7 (fell: the server "
            "restarted between the scrapes)\n");
}

TEST(MetricsScrapeTest, OkRequestsCountedAddsEveryMethodsOkCalls) {
  const MetricSamples before = {
      {"transpose_requests_total{code=\"OK\",method=\"Transpose\"}", 10},
      {"transpose_request_duration_seconds_count{method=\"Transpose\"}", 10},
  };
  MetricSamples after = before;
  after["transpose_requests_total{code=\"OK\",method=\"Transpose\"}"] = 14;
  after["transpose_requests_total{code=\"INTERNAL\",method=\"Transpose\"}"] = 2;
  after["transpose_request_duration_seconds_count{method=\"Transpose\"}"] = 16;
  after["transpose_requests_total{code=\"OK\",method=\"TransposeStream\"}"] = 3;
  EXPECT_EQ(OkRequestsCounted(before, after), 7);
  EXPECT_EQ(OkRequestsCounted(after, after), 0);
}

TEST(MetricsScrapeTest, FetchFailsClearly) {
  const testing::RefusedPort refused;
  absl::StatusOr<std::string> body =
      FetchUrl("http://" + refused.address() + "/metrics");
  EXPECT_EQ(body.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace transpose
