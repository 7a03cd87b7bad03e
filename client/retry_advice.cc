#include "client/retry_advice.h"

#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "client/client.h"
#include "proto/convert.h"

namespace transpose {

RetryAdvice ReadRetryAdvice(
    const std::multimap<grpc::string_ref, grpc::string_ref>& trailers) {
  RetryAdvice advice;
  const auto it = trailers.find(api::kRetryPushbackKey);
  if (it == trailers.end()) return advice;
  int64_t ms = 0;
  if (!absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()),
                        &ms) ||
      ms < 0) {
    advice.never = true;
  } else {
    advice.pushback = absl::Milliseconds(ms);
  }
  return advice;
}

bool ResetByTransportQuota(const absl::Status& status) {
  return absl::IsResourceExhausted(status) &&
         absl::StartsWith(status.message(),
                          "Received RST_STREAM with error code 11");
}

bool Retriable(const absl::Status& status, const RetryAdvice& advice) {
  // This process out of memory for a chunk's copy: the server's pushback,
  // should its refusal have arrived meanwhile, is not about that.
  if (advice.never || IsInThisProcess(status)) return false;
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
      return true;
    case absl::StatusCode::kCancelled:
      return !advice.result_arrived;
    case absl::StatusCode::kResourceExhausted:
      return advice.pushback.has_value() ||
             (advice.messages_within_every_limit &&
              ResetByTransportQuota(status));
    default:
      return false;
  }
}

}  // namespace transpose
