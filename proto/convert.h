// The one mapping between the API's messages and status codes and the core
// types, shared by the server's gRPC layer and the client library. The engine
// never sees the API's types.
#ifndef TRANSPOSE_PROTO_CONVERT_H_
#define TRANSPOSE_PROTO_CONVERT_H_

#include <grpcpp/support/status.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/transpose_args.h"
#include "server/core/matrix.h"
#include "server/core/stats.h"
#include "transpose/v1/transpose.pb.h"

namespace transpose::api {

// Unknown enum values map to core values outside the core enums, which
// validation rejects with a message that names the number.
DataType FromProto(v1::DataType dtype);
v1::DataType ToProto(DataType dtype);
kernels::Algorithm FromProto(v1::Algorithm algorithm);
v1::Algorithm ToProto(kernels::Algorithm algorithm);

// batch 0 means 1.
MatrixShape FromProto(const v1::MatrixShape& shape);
void ToProto(const MatrixShape& shape, v1::MatrixShape& proto);

TransposeStats FromProto(const v1::TransposeStats& stats);
void ToProto(const TransposeStats& stats, v1::TransposeStats& proto);

// Trailing metadata by which a server tells clients whether, and after how
// many milliseconds, to retry a failed call (gRFC A6); negative: do not.
inline constexpr char kRetryPushbackKey[] = "grpc-retry-pushback-ms";

// Metadata that names a call in the logs of both sides: the client library
// sends one with every call (the caller's own, or a random one, the same for
// each attempt), and the server's log lines for the call carry it.
inline constexpr char kRequestIdKey[] = "x-request-id";
inline constexpr size_t kMaxRequestIdBytes = 128;
// OK for 1 to kMaxRequestIdBytes printable ASCII characters without spaces (a
// UUID, a W3C traceparent); INVALID_ARGUMENT saying why otherwise.
absl::Status CheckRequestId(absl::string_view id);
// A new request id: 16 random hex digits, unique enough to find one call in a
// server's log.
std::string NewRequestId();

// The most data one message may carry: gRPC's message sizes are 32-bit, and
// the header fields and framing need room on top.
inline constexpr uint64_t kMaxMessageDataBytes = INT32_MAX - (1 << 20);
// The data every server takes in one message (its --max_message_bytes is at
// least this): a client sending no more per message is never refused for size.
inline constexpr uint64_t kMinMessageDataBytes = 1 << 20;

// Status codes are numbered alike in Abseil and gRPC.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace transpose::api

#endif  // TRANSPOSE_PROTO_CONVERT_H_
