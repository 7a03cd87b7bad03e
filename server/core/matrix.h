// Core matrix types shared by the engine, the gRPC adapter and the client
// library. No transport or CUDA types appear here.
#ifndef TRANSPOSE_SERVER_CORE_MATRIX_H_
#define TRANSPOSE_SERVER_CORE_MATRIX_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace transpose {

// Element type of a matrix. The numbers equal the API's DataType numbers, so
// conversion between the two is a range check and a cast.
enum class DataType : int {
  kUnspecified = 0,
  kFloat32 = 1,
  kFloat64 = 2,
  kFloat16 = 3,
  kBFloat16 = 4,
  kInt8 = 5,
  kUInt8 = 6,
  kInt16 = 7,
  kUInt16 = 8,
  kInt32 = 9,
  kUInt32 = 10,
  kInt64 = 11,
  kUInt64 = 12,
  kComplex64 = 13,
  kComplex128 = 14,
};

// Every specified data type, in API order.
absl::Span<const DataType> AllDataTypes();

// Bytes per element; 0 for kUnspecified or a value outside the enum.
size_t ElementSize(DataType dtype);

// Short lower-case name, as NumPy spells it where NumPy has the type:
// "float32", "bfloat16", ... "unspecified" for kUnspecified, "unknown" outside
// the enum.
absl::string_view DataTypeName(DataType dtype);

// Inverse of DataTypeName for specified types.
std::optional<DataType> DataTypeFromName(absl::string_view name);

// A batch of equally shaped matrices, row-major, batch-major. Every dimension
// is at least 1 (the API's batch 0, meaning 1, is for the wire only). A brace
// list reads {batch, rows, cols}: Matrix and Batch say which is which.
struct MatrixShape {
  uint64_t batch = 1;
  uint64_t rows = 0;
  uint64_t cols = 0;

  static MatrixShape Matrix(uint64_t rows, uint64_t cols) {
    return {1, rows, cols};
  }
  static MatrixShape Batch(uint64_t batch, uint64_t rows, uint64_t cols) {
    return {batch, rows, cols};
  }

  // The shape of the result: (batch, cols, rows).
  MatrixShape Transposed() const { return {batch, cols, rows}; }
  uint64_t elements() const { return batch * rows * cols; }
  // A zero dimension (not elements() == 0, which a product past 64 bits can
  // also give).
  bool empty() const { return batch == 0 || rows == 0 || cols == 0; }

  friend bool operator==(const MatrixShape& a, const MatrixShape& b) {
    return a.batch == b.batch && a.rows == b.rows && a.cols == b.cols;
  }
  friend bool operator!=(const MatrixShape& a, const MatrixShape& b) {
    return !(a == b);
  }
};

// "3x65x129" (batch first, omitted when 1).
std::string ShapeToString(const MatrixShape& shape);

// Byte size of a matrix of `dtype` and `shape`, or INVALID_ARGUMENT naming what
// is wrong: an unspecified or unknown dtype, a zero dimension, or a size that
// does not fit in 64 bits.
absl::StatusOr<uint64_t> MatrixBytes(DataType dtype, const MatrixShape& shape);

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_MATRIX_H_
