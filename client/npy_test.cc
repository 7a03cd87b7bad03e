#include "client/npy.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace transpose {
namespace {

using ::testing::HasSubstr;

std::string File(absl::string_view dict, size_t data_bytes) {
  std::string header(dict);
  header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
  header.push_back('\n');
  std::string file("\x93NUMPY\x01\x00", 8);
  file.push_back(static_cast<char>(header.size() & 0xff));
  file.push_back(static_cast<char>(header.size() >> 8));
  return file + header + std::string(data_bytes, '\x01');
}

TEST(NpyTest, HeaderRoundTripsForEveryDtype) {
  for (DataType dtype : AllDataTypes()) {
    for (bool batched : {false, true}) {
      const MatrixShape shape{batched ? 3u : 1u, 5, 7};
      std::string file = FormatNpyHeader(dtype, shape, batched);
      EXPECT_EQ(file.size() % 64, 0u);
      const size_t offset = file.size();
      file.append(shape.elements() * ElementSize(dtype), '\x07');
      absl::StatusOr<NpyHeader> header = ParseNpyHeader(file);
      ASSERT_TRUE(header.ok()) << header.status();
      EXPECT_EQ(header->dtype, dtype);
      EXPECT_EQ(header->shape, shape);
      EXPECT_EQ(header->batched, batched);
      EXPECT_EQ(header->data_offset, offset);
    }
  }
}

TEST(NpyTest, ReadsWhatNumpyWrites) {
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(
      File("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", 48));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->dtype, DataType::kFloat32);
  EXPECT_EQ(header->shape, (MatrixShape{1, 3, 4}));
  EXPECT_EQ(header->data_offset, 128u);
  // One-byte types, native order and bfloat16 as void.
  EXPECT_EQ(
      ParseNpyHeader(
          File("{'descr': '|u1', 'fortran_order': False, 'shape': (2, 2), }",
               4))
          ->dtype,
      DataType::kUInt8);
  EXPECT_EQ(
      ParseNpyHeader(
          File("{'descr': '=i2', 'fortran_order': False, 'shape': (2, 2), }",
               8))
          ->dtype,
      DataType::kInt16);
  EXPECT_EQ(
      ParseNpyHeader(
          File("{'descr': '|V2', 'fortran_order': False, 'shape': (2, 2), }",
               8))
          ->dtype,
      DataType::kBFloat16);
}

// NumPy writes empty arrays; they parse, with no data.
TEST(NpyTest, ReadsEmptyArrays) {
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(
      File("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 0), }", 0));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->shape, (MatrixShape{1, 3, 0}));
  header = ParseNpyHeader(File(
      "{'descr': '<i2', 'fortran_order': False, 'shape': (0, 4, 5), }", 0));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->shape, (MatrixShape{0, 4, 5}));
  EXPECT_TRUE(header->batched);
}

TEST(NpyTest, OverrideReinterpretsSameSizedElements) {
  const std::string file =
      File("{'descr': '<u2', 'fortran_order': False, 'shape': (2, 2), }", 8);
  EXPECT_EQ(ParseNpyHeader(file, DataType::kBFloat16)->dtype,
            DataType::kBFloat16);
  absl::Status status = ParseNpyHeader(file, DataType::kFloat32).status();
  EXPECT_THAT(status.message(), HasSubstr("4-byte"));
}

TEST(NpyTest, RejectsWhatItCannotTranspose) {
  struct Case {
    std::string file;
    std::string message;
  };
  const Case cases[] = {
      {"not numpy at all", "magic"},
      {File("{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), }", 48),
       "Fortran"},
      {File("{'descr': '>f4', 'fortran_order': False, 'shape': (3, 4), }", 48),
       "big-endian"},
      {File("{'descr': '|b1', 'fortran_order': False, 'shape': (3, 4), }", 12),
       "not supported"},
      {File("{'descr': '>b1', 'fortran_order': False, 'shape': (3, 4), }", 12),
       "'>b1' is not supported"},
      {File("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3, "
            "4), }",
            48),
       "structured dtypes"},
      {File("{'descr': '<f4', 'fortran_order': False, 'shape': (12,), }", 48),
       "1 dimensions"},
      {File("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", 47),
       "holds 47"},
      {File("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 0), }", 4),
       "declares 0 data bytes, the file holds 4"},
      {File("{'descr': '<f4', 'fortran_order': False, 'shape': (3, x), }", 0),
       "does not parse"},
      {File("{'fortran_order': False, 'shape': (3, 4), }", 48), "no descr"},
  };
  for (const Case& c : cases) {
    absl::Status status = ParseNpyHeader(c.file).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace transpose
