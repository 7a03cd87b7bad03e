#include "proto/convert.h"

#include <string>

#include "absl/random/distributions.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/core/thread_random.h"

namespace transpose::api {

DataType FromProto(v1::DataType dtype) { return static_cast<DataType>(dtype); }
v1::DataType ToProto(DataType dtype) {
  return static_cast<v1::DataType>(dtype);
}

kernels::Algorithm FromProto(v1::Algorithm algorithm) {
  return static_cast<kernels::Algorithm>(algorithm);
}
v1::Algorithm ToProto(kernels::Algorithm algorithm) {
  return static_cast<v1::Algorithm>(algorithm);
}

MatrixShape FromProto(const v1::MatrixShape& shape) {
  return {shape.batch() == 0 ? 1 : shape.batch(), shape.rows(), shape.cols()};
}

void ToProto(const MatrixShape& shape, v1::MatrixShape& proto) {
  proto.set_batch(shape.batch);
  proto.set_rows(shape.rows);
  proto.set_cols(shape.cols);
}

TransposeStats FromProto(const v1::TransposeStats& stats) {
  TransposeStats result;
  result.backend = stats.backend();
  result.algorithm = stats.algorithm();
  result.kernel_seconds = stats.kernel_seconds();
  result.bandwidth_bytes_per_second = stats.bandwidth_bytes_per_second();
  result.peak_fraction = stats.peak_fraction();
  result.queue_seconds = stats.queue_seconds();
  result.copy_in_seconds = stats.copy_in_seconds();
  result.copy_out_seconds = stats.copy_out_seconds();
  result.total_seconds = stats.total_seconds();
  return result;
}

void ToProto(const TransposeStats& stats, v1::TransposeStats& proto) {
  proto.set_backend(stats.backend);
  proto.set_algorithm(stats.algorithm);
  proto.set_kernel_seconds(stats.kernel_seconds);
  proto.set_bandwidth_bytes_per_second(stats.bandwidth_bytes_per_second);
  proto.set_peak_fraction(stats.peak_fraction);
  proto.set_queue_seconds(stats.queue_seconds);
  proto.set_copy_in_seconds(stats.copy_in_seconds);
  proto.set_copy_out_seconds(stats.copy_out_seconds);
  proto.set_total_seconds(stats.total_seconds);
}

absl::Status CheckRequestId(absl::string_view id) {
  if (id.empty() || id.size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("request id of ", id.size(), " characters: expected 1 to ",
                     kMaxRequestIdBytes));
  }
  for (const char c : id) {
    if (c <= ' ' || c > '~') {
      return absl::InvalidArgumentError(absl::StrCat(
          "request id \"", absl::CHexEscape(id),
          "\": expected printable ASCII characters without spaces"));
    }
  }
  return absl::OkStatus();
}

std::string NewRequestId() {
  return absl::StrFormat("%016x", absl::Uniform<uint64_t>(ThreadRandom()));
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace transpose::api
