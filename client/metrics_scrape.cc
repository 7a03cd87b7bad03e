#include "client/metrics_scrape.h"

#include <curl/curl.h>

#include <cmath>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace transpose {
namespace {

size_t Append(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

bool IsCumulative(absl::string_view series) {
  const absl::string_view name = series.substr(0, series.find('{'));
  return absl::StartsWith(name, "transpose_") &&
         (absl::EndsWith(name, "_total") || absl::EndsWith(name, "_count") ||
          absl::EndsWith(name, "_sum"));
}

}  // namespace

absl::StatusOr<std::string> FetchUrl(const std::string& url) {
  std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(),
                                              curl_easy_cleanup);
  if (curl == nullptr) return absl::InternalError("curl_easy_init failed");
  std::string body;
  curl_easy_setopt(curl.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl.get(), CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(curl.get(), CURLOPT_TIMEOUT, 10L);
  curl_easy_setopt(curl.get(), CURLOPT_FAILONERROR, 1L);
  const CURLcode code = curl_easy_perform(curl.get());
  if (code != CURLE_OK) {
    return absl::UnavailableError(
        absl::StrCat("fetching ", url, ": ", curl_easy_strerror(code)));
  }
  return body;
}

absl::StatusOr<MetricSamples> ParseMetricsText(absl::string_view text) {
  MetricSamples samples;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    // The series ends at the closing brace if there are labels (values may hold
    // spaces).
    const size_t close = line.rfind('}');
    const size_t split =
        line.find(' ', close == absl::string_view::npos ? 0 : close);
    double value;
    if (split == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics line without value: ", line));
    }
    absl::string_view rest =
        absl::StripLeadingAsciiWhitespace(line.substr(split + 1));
    rest = rest.substr(0, rest.find(' '));
    if (!absl::SimpleAtod(rest, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics value does not parse: ", line));
    }
    samples[std::string(line.substr(0, split))] = value;
  }
  return samples;
}

std::string FormatMetricsDelta(const MetricSamples& before,
                               const MetricSamples& after) {
  std::string out;
  for (const auto& [series, value] : after) {
    if (!IsCumulative(series) || absl::StrContains(series, "_bucket")) continue;
    auto it = before.find(series);
    const double delta = value - (it == before.end() ? 0 : it->second);
    if (delta == 0) continue;
    absl::StrAppend(&out, series, " +", absl::StrFormat("%.15g", delta), "\n");
  }
  // Mean kernel bandwidth per series over the interval: delta(sum) /
  // delta(count).
  constexpr absl::string_view kSum =
      "transpose_kernel_bandwidth_bytes_per_second_sum";
  for (const auto& [series, value] : after) {
    if (!absl::StartsWith(series, kSum)) continue;
    const std::string labels = series.substr(kSum.size());
    const std::string count_series = absl::StrCat(
        "transpose_kernel_bandwidth_bytes_per_second_count", labels);
    auto count_after = after.find(count_series);
    if (count_after == after.end()) continue;
    auto sum_before = before.find(series);
    auto count_before = before.find(count_series);
    const double sum =
        value - (sum_before == before.end() ? 0 : sum_before->second);
    const double count =
        count_after->second -
        (count_before == before.end() ? 0 : count_before->second);
    if (count > 0) {
      absl::StrAppend(
          &out, absl::StrFormat("mean kernel bandwidth%s %.2f GB/s\n", labels,
                                sum / count / 1e9));
    }
  }
  return out;
}

double OkRequestsCounted(const MetricSamples& before,
                         const MetricSamples& after) {
  constexpr absl::string_view kRequests = "transpose_requests_total{";
  double counted = 0;
  for (const auto& [series, value] : after) {
    if (!absl::StartsWith(series, kRequests) ||
        !absl::StrContains(series, "code=\"OK\"")) {
      continue;
    }
    auto it = before.find(series);
    counted += value - (it == before.end() ? 0 : it->second);
  }
  return counted;
}

}  // namespace transpose
