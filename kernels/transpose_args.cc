#include "kernels/transpose_args.h"

#include <array>
#include <cstdint>

#include "absl/strings/str_format.h"

namespace transpose::kernels {
namespace {

constexpr std::array<Algorithm, 5> kAllAlgorithms = {
    Algorithm::kAuto, Algorithm::kNaive, Algorithm::kShared,
    Algorithm::kPadded32, Algorithm::kPadded64};

}  // namespace

absl::Span<const Algorithm> AllAlgorithms() { return kAllAlgorithms; }

absl::string_view AlgorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kNaive:
      return "naive";
    case Algorithm::kShared:
      return "shared";
    case Algorithm::kPadded32:
      return "padded_32";
    case Algorithm::kPadded64:
      return "padded_64";
  }
  return "unknown";
}

absl::Status CheckShape(const TransposeArgs& args) {
  switch (args.element_size) {
    case 1:
    case 2:
    case 4:
    case 8:
    case 16:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrFormat(
          "element size %d is not 1, 2, 4, 8 or 16", args.element_size));
  }
  if (args.batch == 0 || args.rows == 0 || args.cols == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("zero dimension: batch=%d rows=%d cols=%d", args.batch,
                        args.rows, args.cols));
  }
  uint64_t bytes = args.element_size;
  for (uint64_t dim : {args.batch, args.rows, args.cols}) {
    if (__builtin_mul_overflow(bytes, dim, &bytes)) {
      return absl::InvalidArgumentError("matrix size overflows 64 bits");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckArgs(const TransposeArgs& args) {
  if (absl::Status status = CheckShape(args); !status.ok()) return status;
  const uint64_t bytes = args.bytes();
  if (args.input == nullptr || args.output == nullptr) {
    return absl::InvalidArgumentError("null input or output buffer");
  }
  const auto in = reinterpret_cast<uintptr_t>(args.input);
  const auto out = reinterpret_cast<uintptr_t>(args.output);
  if (in < out + bytes && out < in + bytes) {
    return absl::InvalidArgumentError("input and output buffers overlap");
  }
  if (absl::Status status =
          CheckAligned("input", args.input, args.element_size);
      !status.ok()) {
    return status;
  }
  return CheckAligned("output", args.output, args.element_size);
}

absl::Status CheckAligned(absl::string_view what, const void* buffer,
                          uint64_t element_size) {
  if (element_size == 0) {
    return absl::InvalidArgumentError("element size 0");
  }
  if (reinterpret_cast<uintptr_t>(buffer) % element_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the %s buffer at %p is not aligned to its %d-byte "
                        "elements",
                        what, buffer, element_size));
  }
  return absl::OkStatus();
}

}  // namespace transpose::kernels
