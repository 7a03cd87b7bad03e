// Marks refusals that a retry cannot change, where the status code alone
// (RESOURCE_EXHAUSTED, UNAVAILABLE) tells clients that a later attempt may
// succeed: a matrix over the server's limit is refused every time, while a
// busy or draining server is worth another try. The gRPC layer turns the mark
// into the standard "do not retry" pushback for clients.
#ifndef TRANSPOSE_SERVER_CORE_RETRY_H_
#define TRANSPOSE_SERVER_CORE_RETRY_H_

#include "absl/status/status.h"
#include "absl/strings/cord.h"

namespace transpose {

inline constexpr char kNeverRetryPayload[] =
    "type.googleapis.com/transpose.NeverRetry";

inline absl::Status NeverRetry(absl::Status status) {
  status.SetPayload(kNeverRetryPayload, absl::Cord());
  return status;
}

inline bool IsNeverRetry(const absl::Status& status) {
  return status.GetPayload(kNeverRetryPayload).has_value();
}

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_RETRY_H_
