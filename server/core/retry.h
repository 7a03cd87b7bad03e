// Marks refusals worth retrying: a busy server is worth another try a little
// later. The gRPC layer turns the mark into gRPC's standard retry pushback
// (gRFC A6), which clients need, since the same code (RESOURCE_EXHAUSTED) also
// comes from limits a repeat meets again, such as a matrix over the server's
// limit.
#ifndef TRANSPOSE_SERVER_CORE_RETRY_H_
#define TRANSPOSE_SERVER_CORE_RETRY_H_

#include "absl/status/status.h"
#include "absl/strings/cord.h"

namespace transpose {

inline constexpr char kRetryLaterPayload[] =
    "type.googleapis.com/transpose.RetryLater";

inline absl::Status RetryLater(absl::Status status) {
  status.SetPayload(kRetryLaterPayload, absl::Cord());
  return status;
}

inline bool IsRetryLater(const absl::Status& status) {
  return status.GetPayload(kRetryLaterPayload).has_value();
}

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_RETRY_H_
