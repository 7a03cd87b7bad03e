// Reassembles a transpose request from the messages that carry it, validating
// as it goes: the state machine behind both RPCs (a unary request is a stream
// of one message). Transport-free, so the fuzzer and unit tests drive it
// directly.
#ifndef TRANSPOSE_SERVER_REQUEST_ASSEMBLER_H_
#define TRANSPOSE_SERVER_REQUEST_ASSEMBLER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "server/backend.h"

namespace transpose {

// One received message.
struct RequestPart {
  // Whether the message carries a header: any of dtype, shape or algorithm set.
  bool has_header = false;
  TransposeSpec header;
  // The message's data, in pieces as the transport delivered them.
  absl::Span<const absl::string_view> data;
  // Keeps the pieces alive (TransposeJob::AppendInput); null when the caller
  // keeps them alive until the job is destroyed.
  std::shared_ptr<const void> owner;

  uint64_t data_size() const {
    uint64_t n = 0;
    for (absl::string_view piece : data) n += piece.size();
    return n;
  }
};

// "float32 3x4 (algorithm auto)".
std::string SpecToString(const TransposeSpec& spec);

class RequestAssembler {
 public:
  // Makes the job the data goes to; called once, with the first header.
  using JobFactory =
      absl::AnyInvocable<absl::StatusOr<std::unique_ptr<TransposeJob>>(
          const TransposeSpec&)>;

  explicit RequestAssembler(JobFactory create_job);

  // Takes the next message. INVALID_ARGUMENT for data before the header, a
  // header repeated with other values, or more data than the header declared;
  // the factory's error when the job cannot be made. After an error, the
  // request is dead: call nothing else.
  absl::Status Add(const RequestPart& part);

  // Says the sender has sent everything: INVALID_ARGUMENT unless the request is
  // complete.
  absl::Status Finish() const;
  // Add and Finish for a request in one message (unary), whose data is checked
  // against the declared size before the job is made: a few bytes declaring
  // gigabytes take no admission and no buffers. So a unary request of the
  // wrong size is INVALID_ARGUMENT even where its declared size is also over
  // the server's limits (RESOURCE_EXHAUSTED from the factory otherwise).
  absl::Status AddWhole(const RequestPart& part);

  // All declared bytes have arrived.
  bool complete() const { return has_header_ && received_ == expected_; }

  // The job, once the header has arrived, until ReleaseJob.
  const std::shared_ptr<TransposeJob>& job() const { return job_; }
  // Drops the assembler's hold on the job (its result is out), while Add still
  // refuses data past the declared size.
  void ReleaseJob() { job_.reset(); }
  const TransposeSpec& spec() const { return spec_; }
  uint64_t received_bytes() const { return received_; }
  uint64_t expected_bytes() const { return expected_; }

 private:
  JobFactory create_job_;
  bool has_header_ = false;
  TransposeSpec spec_;
  std::shared_ptr<TransposeJob> job_;
  uint64_t expected_ = 0;
  uint64_t received_ = 0;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_REQUEST_ASSEMBLER_H_
