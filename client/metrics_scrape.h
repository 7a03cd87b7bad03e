// Reading a server's Prometheus /metrics from the client side: what `transpose
// bench
// --metrics_url` uses to print the server's view of its run.
#ifndef TRANSPOSE_CLIENT_METRICS_SCRAPE_H_
#define TRANSPOSE_CLIENT_METRICS_SCRAPE_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace transpose {

// Series name with its labels, as exposed
// ("transpose_requests_total{code=\"OK\",...}"), to value.
using MetricSamples = std::map<std::string, double>;

// GETs `url` (http:// or https://). UNAVAILABLE when it cannot be fetched.
absl::StatusOr<std::string> FetchUrl(const std::string& url);

// Parses the Prometheus text exposition format: comments skipped, timestamps
// and OpenMetrics exemplars ignored. INVALID_ARGUMENT for a line that is not
// "series value [timestamp] [# exemplar]".
absl::StatusOr<MetricSamples> ParseMetricsText(absl::string_view text);

// The counters and histogram counts/sums of the transpose_ metrics that changed
// between the two scrapes, one "series +delta" per line ("series -N (fell:
// ...)" for one that fell, its server restarted), plus each kernel series'
// mean bandwidth over the interval.
std::string FormatMetricsDelta(const MetricSamples& before,
                               const MetricSamples& after);

// How many more calls transpose_requests_total counts as OK in `after` than in
// `before`, over every method.
double OkRequestsCounted(const MetricSamples& before,
                         const MetricSamples& after);

}  // namespace transpose

#endif  // TRANSPOSE_CLIENT_METRICS_SCRAPE_H_
