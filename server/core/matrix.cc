#include "server/core/matrix.h"

#include <array>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace transpose {
namespace {

struct DataTypeInfo {
  DataType dtype;
  size_t size;
  absl::string_view name;
};

constexpr std::array<DataTypeInfo, 14> kDataTypes = {{
    {DataType::kFloat32, 4, "float32"},
    {DataType::kFloat64, 8, "float64"},
    {DataType::kFloat16, 2, "float16"},
    {DataType::kBFloat16, 2, "bfloat16"},
    {DataType::kInt8, 1, "int8"},
    {DataType::kUInt8, 1, "uint8"},
    {DataType::kInt16, 2, "int16"},
    {DataType::kUInt16, 2, "uint16"},
    {DataType::kInt32, 4, "int32"},
    {DataType::kUInt32, 4, "uint32"},
    {DataType::kInt64, 8, "int64"},
    {DataType::kUInt64, 8, "uint64"},
    {DataType::kComplex64, 8, "complex64"},
    {DataType::kComplex128, 16, "complex128"},
}};

const DataTypeInfo* Find(DataType dtype) {
  for (const DataTypeInfo& info : kDataTypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

constexpr std::array<DataType, 14> MakeAllDataTypes() {
  std::array<DataType, 14> all{};
  for (size_t i = 0; i < kDataTypes.size(); ++i) all[i] = kDataTypes[i].dtype;
  return all;
}
constexpr std::array<DataType, 14> kAllDataTypes = MakeAllDataTypes();

}  // namespace

absl::Span<const DataType> AllDataTypes() { return kAllDataTypes; }

size_t ElementSize(DataType dtype) {
  const DataTypeInfo* info = Find(dtype);
  return info == nullptr ? 0 : info->size;
}

absl::string_view DataTypeName(DataType dtype) {
  if (dtype == DataType::kUnspecified) return "unspecified";
  const DataTypeInfo* info = Find(dtype);
  return info == nullptr ? "unknown" : info->name;
}

std::optional<DataType> DataTypeFromName(absl::string_view name) {
  for (const DataTypeInfo& info : kDataTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

std::string ShapeToString(const MatrixShape& shape) {
  if (shape.batch == 1) return absl::StrCat(shape.rows, "x", shape.cols);
  return absl::StrCat(shape.batch, "x", shape.rows, "x", shape.cols);
}

absl::StatusOr<uint64_t> MatrixBytes(DataType dtype, const MatrixShape& shape) {
  if (dtype == DataType::kUnspecified) {
    return absl::InvalidArgumentError("dtype is unspecified");
  }
  const size_t element_size = ElementSize(dtype);
  if (element_size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", static_cast<int>(dtype), " is unknown"));
  }
  if (shape.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("shape has a zero dimension: batch=%d rows=%d cols=%d",
                        shape.batch, shape.rows, shape.cols));
  }
  uint64_t bytes = element_size;
  for (uint64_t dim : {shape.batch, shape.rows, shape.cols}) {
    if (__builtin_mul_overflow(bytes, dim, &bytes)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "shape batch=%d rows=%d cols=%d of %s overflows 64 bits of bytes",
          shape.batch, shape.rows, shape.cols, DataTypeName(dtype)));
    }
  }
  return bytes;
}

}  // namespace transpose
