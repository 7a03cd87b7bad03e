// Zero-copy framing of the API's two data-carrying messages, TransposeRequest
// and TransposeResponse, for the streaming paths: the large `data` field
// (number 3 in both) stays in the transport's slices on receipt and goes out as
// a slice of the sender's own memory, while every other field goes through the
// generated protobuf code. The bytes on the wire are exactly the message's
// protobuf encoding.
#ifndef TRANSPOSE_PROTO_WIRE_H_
#define TRANSPOSE_PROTO_WIRE_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "transpose/v1/transpose.pb.h"

namespace transpose::wire {

// A received message: every field but `data` parsed into `header`; `data` as
// views into the message's slices, in order, which `slices` keeps alive.
template <typename Message>
struct MessageView {
  Message header;
  std::vector<absl::string_view> data;
  std::vector<grpc::Slice> slices;

  uint64_t data_size() const {
    uint64_t n = 0;
    for (absl::string_view piece : data) n += piece.size();
    return n;
  }
};

using RequestView = MessageView<v1::TransposeRequest>;
using ResponseView = MessageView<v1::TransposeResponse>;

// Parses `buffer`. INVALID_ARGUMENT when it is not a valid encoding of the
// message. As protobuf does, the last `data` field wins when it appears more
// than once.
absl::Status Parse(const grpc::ByteBuffer& buffer, RequestView& view);
absl::Status Parse(const grpc::ByteBuffer& buffer, ResponseView& view);

// Encodes `header` (whose own data field must be empty) with `data` as its data
// field. The data is not copied: the buffer refers to it, and `owner` (may be
// null, when the caller keeps `data` alive until gRPC is done with the buffer)
// is held until the last reference to it is dropped.
grpc::ByteBuffer Encode(const v1::TransposeRequest& header,
                        absl::Span<const uint8_t> data,
                        std::shared_ptr<const void> owner);
grpc::ByteBuffer Encode(const v1::TransposeResponse& header,
                        absl::Span<const uint8_t> data,
                        std::shared_ptr<const void> owner);

}  // namespace transpose::wire

#endif  // TRANSPOSE_PROTO_WIRE_H_
