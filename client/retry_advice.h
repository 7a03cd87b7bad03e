// Whether a failed attempt of a call is worth another, from what the attempt
// learned: its status, the server's trailing metadata and how far it got.
// Apart from the transport, so that the policy is tested case by case.
#ifndef TRANSPOSE_CLIENT_RETRY_ADVICE_H_
#define TRANSPOSE_CLIENT_RETRY_ADVICE_H_

#include <grpcpp/support/string_ref.h>

#include <map>
#include <optional>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace transpose {

// What a failed attempt says about another: the server's trailing metadata
// (gRFC A6: nothing, do not (a negative pushback), or wait at least so long),
// whether part of the result had arrived (and been written into the output),
// and whether the attempt may have reached the server (false when its
// connection was never made: an attempt out of time says so).
struct RetryAdvice {
  bool never = false;
  std::optional<absl::Duration> pushback;
  bool result_arrived = false;
  // Whether each message carried no more data than every server takes, so
  // that a reset by the server's transport quota was another call's doing.
  bool messages_within_every_limit = false;
  bool may_have_reached_server = true;
};

// The pushback of a failed call's trailing metadata: none, a wait in
// milliseconds, or never for a value that is negative or not a whole number
// (gRFC A6 says not to retry).
RetryAdvice ReadRetryAdvice(
    const std::multimap<grpc::string_ref, grpc::string_ref>& trailers);

// Whether the server's resource quota (--max_transport_bytes) reset the call's
// stream. It frees memory by resetting a stream (RST_STREAM
// ENHANCE_YOUR_CALM) of whichever connection its reclaimer reaches first, not
// necessarily the one that used the memory (a message over the server's size
// limit, read until the quota runs out, meets it too). gRPC 1.51 tells it from
// a size refusal, which comes with a status, only in its text.
bool ResetByTransportQuota(const absl::Status& status);

// Whether another attempt may go another way. UNAVAILABLE: the call did not
// get through, or the server is draining (another may take it), unless the
// server said otherwise. CANCELLED, which the caller's own cancel never
// reaches here as, before any of the result arrived: a server shutting down
// cancels the calls that arrive as its transport closes (later, it is the
// server giving up on a reader, which a repeat would not help).
// RESOURCE_EXHAUSTED only when the service said to retry (it was busy), or
// when the server's transport quota reset a stream whose messages every server
// takes: the same code also comes from limits that a repeat meets again, such
// as a message over gRPC's size limit or a matrix over the server's, and
// repeating an oversized upload would only load the server. Never a failure
// of this process's own (IsInThisProcess).
bool Retriable(const absl::Status& status, const RetryAdvice& advice);

}  // namespace transpose

#endif  // TRANSPOSE_CLIENT_RETRY_ADVICE_H_
