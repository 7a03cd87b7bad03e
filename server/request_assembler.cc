#include "server/request_assembler.h"

#include <utility>

#include "absl/strings/str_format.h"
#include "server/core/status_macros.h"

namespace transpose {

std::string SpecToString(const TransposeSpec& spec) {
  return absl::StrFormat("%s %s (algorithm %s)", DataTypeName(spec.dtype),
                         ShapeToString(spec.shape),
                         kernels::AlgorithmName(spec.algorithm));
}

namespace {

absl::Status LongerThanDeclared(const TransposeSpec& spec, uint64_t received,
                                uint64_t expected) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "data is longer than declared: at least %d bytes arrived, %s needs %d",
      received, SpecToString(spec), expected));
}

absl::Status ShorterThanDeclared(const TransposeSpec& spec, uint64_t received,
                                 uint64_t expected) {
  return absl::InvalidArgumentError(
      absl::StrFormat("data is shorter than declared: %d bytes arrived, %s "
                      "needs %d",
                      received, SpecToString(spec), expected));
}

}  // namespace

RequestAssembler::RequestAssembler(JobFactory create_job)
    : create_job_(std::move(create_job)) {}

absl::Status RequestAssembler::Add(const RequestPart& part) {
  if (!has_header_) {
    if (!part.has_header) {
      return absl::InvalidArgumentError(
          part.data_size() == 0
              ? "the first message carries no header: set dtype and shape"
              : "data arrived before the header: the first message must set "
                "dtype and shape");
    }
    TRANSPOSE_ASSIGN_OR_RETURN(job_, create_job_(part.header));
    has_header_ = true;
    spec_ = part.header;
    TRANSPOSE_ASSIGN_OR_RETURN(expected_,
                               MatrixBytes(spec_.dtype, spec_.shape));
  } else if (part.has_header && !(part.header == spec_)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("header repeated with other values: first %s, now %s",
                        SpecToString(spec_), SpecToString(part.header)));
  }

  const uint64_t size = part.data_size();
  if (size > expected_ - received_) {
    return LongerThanDeclared(spec_, received_ + size, expected_);
  }
  if (size == 0) return absl::OkStatus();
  job_->AppendInput(part.data, part.owner);
  received_ += size;
  return absl::OkStatus();
}

absl::Status RequestAssembler::Finish() const {
  if (!has_header_) {
    return absl::InvalidArgumentError(
        "the request carries no header: set dtype and shape");
  }
  if (received_ != expected_) {
    return ShorterThanDeclared(spec_, received_, expected_);
  }
  return absl::OkStatus();
}

absl::Status RequestAssembler::AddWhole(const RequestPart& part) {
  if (part.has_header && !has_header_) {
    // A spec that does not give a size is left to the factory to name.
    absl::StatusOr<uint64_t> declared =
        MatrixBytes(part.header.dtype, part.header.shape);
    if (declared.ok() && part.data_size() > *declared) {
      return LongerThanDeclared(part.header, part.data_size(), *declared);
    }
    if (declared.ok() && part.data_size() < *declared) {
      return ShorterThanDeclared(part.header, part.data_size(), *declared);
    }
  }
  TRANSPOSE_RETURN_IF_ERROR(Add(part));
  return Finish();
}

}  // namespace transpose
