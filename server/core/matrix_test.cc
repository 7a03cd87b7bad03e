#include "server/core/matrix.h"

#include <cstdint>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace transpose {
namespace {

using ::testing::HasSubstr;

TEST(MatrixTest, EveryDataTypeHasASizeAndARoundTrippingName) {
  EXPECT_EQ(AllDataTypes().size(), 14u);
  for (DataType dtype : AllDataTypes()) {
    EXPECT_GT(ElementSize(dtype), 0u) << DataTypeName(dtype);
    EXPECT_EQ(DataTypeFromName(DataTypeName(dtype)), dtype);
  }
  EXPECT_EQ(ElementSize(DataType::kBFloat16), 2u);
  EXPECT_EQ(ElementSize(DataType::kComplex128), 16u);
  EXPECT_EQ(ElementSize(DataType::kUnspecified), 0u);
  EXPECT_EQ(ElementSize(static_cast<DataType>(99)), 0u);
  EXPECT_EQ(DataTypeFromName("float33"), std::nullopt);
}

TEST(MatrixTest, BytesOfAValidMatrix) {
  EXPECT_EQ(*MatrixBytes(DataType::kFloat32, {3, 5, 7}), 3u * 5 * 7 * 4);
  EXPECT_EQ(*MatrixBytes(DataType::kUInt8, {1, 1, 1}), 1u);
}

TEST(MatrixTest, RejectsUnspecifiedAndUnknownTypes) {
  EXPECT_THAT(MatrixBytes(DataType::kUnspecified, {1, 2, 2}).status().message(),
              HasSubstr("unspecified"));
  absl::Status unknown =
      MatrixBytes(static_cast<DataType>(99), {1, 2, 2}).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(), HasSubstr("99"));
}

TEST(MatrixTest, RejectsZeroDimensions) {
  for (MatrixShape shape :
       {MatrixShape{0, 2, 2}, MatrixShape{1, 0, 2}, MatrixShape{1, 2, 0}}) {
    absl::Status status = MatrixBytes(DataType::kFloat32, shape).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("zero"));
  }
}

TEST(MatrixTest, RejectsSizesPast64Bits) {
  const uint64_t big = uint64_t{1} << 32;
  absl::Status status = MatrixBytes(DataType::kFloat32, {1, big, big}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("overflows"));
  // 2^62 elements of one byte fit; of 4 bytes they do not.
  EXPECT_TRUE(
      MatrixBytes(DataType::kUInt8, {1, uint64_t{1} << 31, uint64_t{1} << 31})
          .ok());
  EXPECT_FALSE(
      MatrixBytes(DataType::kFloat32, {4, uint64_t{1} << 31, uint64_t{1} << 31})
          .ok());
}

TEST(MatrixTest, ShapeHelpers) {
  EXPECT_EQ((MatrixShape{3, 5, 7}.Transposed()), (MatrixShape{3, 7, 5}));
  EXPECT_EQ(ShapeToString({1, 5, 7}), "5x7");
  EXPECT_EQ(ShapeToString({3, 5, 7}), "3x5x7");
  EXPECT_EQ(MatrixShape::Matrix(5, 7), (MatrixShape{1, 5, 7}));
  EXPECT_EQ(MatrixShape::Batch(3, 5, 7), (MatrixShape{3, 5, 7}));
}

}  // namespace
}  // namespace transpose
