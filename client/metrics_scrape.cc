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
  // Says more than curl_easy_strerror: an HTTP error's status code, say,
  // where that gives only "HTTP response code said error". It must outlive
  // the handle.
  char error[CURL_ERROR_SIZE] = "";
  std::unique_ptr<CURL, void (*)(CURL*)> curl(curl_easy_init(),
                                              curl_easy_cleanup);
  if (curl == nullptr) return absl::InternalError("curl_easy_init failed");
  std::string body;
  curl_easy_setopt(curl.get(), CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl.get(), CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(curl.get(), CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(curl.get(), CURLOPT_TIMEOUT, 10L);
  curl_easy_setopt(curl.get(), CURLOPT_FAILONERROR, 1L);
  curl_easy_setopt(curl.get(), CURLOPT_ERRORBUFFER, error);
  const CURLcode code = curl_easy_perform(curl.get());
  if (code != CURLE_OK) {
    return absl::UnavailableError(
        absl::StrCat("fetching ", url, ": ",
                     error[0] != '\0' ? error : curl_easy_strerror(code)));
  }
  return body;
}

absl::StatusOr<MetricSamples> ParseMetricsText(absl::string_view text) {
  MetricSamples samples;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    // The series: its name, and its labels up to the brace that closes them
    // (quoted values may hold braces, spaces and escaped quotes).
    size_t end = line.find_first_of("{ \t");
    if (end != absl::string_view::npos && line[end] == '{') {
      bool quoted = false;
      for (++end; end < line.size(); ++end) {
        if (quoted && line[end] == '\\') {
          ++end;
        } else if (line[end] == '"') {
          quoted = !quoted;
        } else if (!quoted && line[end] == '}') {
          break;
        }
      }
      if (end >= line.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("metrics line with unterminated labels: ", line));
      }
      ++end;
    }
    if (end == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics line without value: ", line));
    }
    // Then the value, an optional timestamp, and an optional exemplar
    // (OpenMetrics: "# {labels} value"), separated by spaces or tabs.
    const std::vector<absl::string_view> fields = absl::StrSplit(
        line.substr(end), absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (fields.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics line without value: ", line));
    }
    double value, timestamp;
    if (!absl::SimpleAtod(fields[0], &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("metrics value does not parse: ", line));
    }
    const size_t exemplar =
        fields.size() > 1 && !absl::SimpleAtod(fields[1], &timestamp) ? 1 : 2;
    if (fields.size() > exemplar && fields[exemplar] != "#") {
      return absl::InvalidArgumentError(absl::StrCat(
          "metrics line has more than a value and a timestamp: ", line));
    }
    samples[std::string(line.substr(0, end))] = value;
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
    // A counter only falls when its server restarted between the scrapes.
    absl::StrAppend(&out, series,
                    delta > 0 ? absl::StrFormat(" +%.15g", delta)
                              : absl::StrFormat(" %.15g (fell: the server "
                                                "restarted between the "
                                                "scrapes)",
                                                delta),
                    "\n");
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
