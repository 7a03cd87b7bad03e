#include "client/npy.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
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
      std::string file = FormatNpyHeader(NpyDescr(dtype), shape, batched);
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

// The start of a pipe not yet read to its end: the header alone, with no
// size to check the data against, but a declared size that fits in 64 bits.
TEST(NpyTest, AHeaderParsesWithoutTheFileSize) {
  const std::string start = File(
      "{'descr': '<f8', 'fortran_order': False, 'shape': (65536, 65536), }",
      1000);
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(start, std::nullopt);
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->shape, (MatrixShape{1, 65536, 65536}));
  EXPECT_EQ(header->data_offset, 128u);
  EXPECT_THAT(ParseNpyHeader(start).status().message(),
              HasSubstr("header declares 34359738368 data bytes"));
  // 2^64 - 64 data bytes: the data alone fit, but not after the header.
  EXPECT_THAT(
      ParseNpyHeader(File("{'descr': '|u1', 'fortran_order': False, 'shape': "
                          "(1, 18446744073709551552), }",
                          0),
                     std::nullopt)
          .status()
          .message(),
      HasSubstr("overflows"));
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

// Plain elements of other kinds parse with their size, for the caller to
// send as a type of their size; they have no type of the API.
TEST(NpyTest, ReadsOtherPlainTypesAsSizedElements) {
  const std::pair<std::string, size_t> cases[] = {
      {"|b1", 1}, {">b1", 1},   {"<M8[s]", 8}, {"<m8[ns]", 8}, {"|V4", 4},
      {"|S3", 3}, {"<V16", 16}, {"<U2", 8},    {">f4", 4},     {">i8", 8},
      {">c8", 8}, {">c16", 16}, {">u2", 2},    {">M8[s]", 8}};
  for (const auto& [descr, size] : cases) {
    absl::StatusOr<NpyHeader> header = ParseNpyHeader(
        File(absl::StrCat("{'descr': '", descr,
                          "', 'fortran_order': False, 'shape': (2, 3), }"),
             6 * size));
    ASSERT_TRUE(header.ok()) << descr << ": " << header.status();
    EXPECT_EQ(header->dtype, DataType::kUnspecified) << descr;
    EXPECT_EQ(header->element_size, size) << descr;
    EXPECT_EQ(header->descr, descr);
  }
  EXPECT_EQ(ParseNpyHeader(File("{'descr': '<f4', 'fortran_order': False, "
                                "'shape': (2, 3), }",
                                24))
                ->element_size,
            4u);
}

// What other writers put in a header, which NumPy reads: double quotes, and
// Python 2's long integers.
TEST(NpyTest, ReadsOtherSpellingsOfTheDict) {
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(File(
      "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (3, 4)}", 48));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->dtype, DataType::kFloat32);
  EXPECT_EQ(header->shape, (MatrixShape{1, 3, 4}));
  header = ParseNpyHeader(File(
      "{'descr': '<i2', 'fortran_order': False, 'shape': (2L, 3L, 4L), }", 48));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->shape, (MatrixShape{2, 3, 4}));
  // A tuple's trailing comma.
  header = ParseNpyHeader(
      File("{'descr': '<i2', 'fortran_order': False, 'shape': (3, 4,), }", 24));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->shape, (MatrixShape{1, 3, 4}));
}

// A .npy output keeps its input's descr, whatever type the elements went as.
TEST(NpyTest, FormatsAnyDescr) {
  const std::pair<std::string, size_t> cases[] = {
      {">f4", 4}, {"|b1", 1}, {"<M8[s]", 8}};
  for (const auto& [descr, size] : cases) {
    std::string file = FormatNpyHeader(descr, {1, 2, 3}, false);
    file.append(6 * size, '\0');
    absl::StatusOr<NpyHeader> header = ParseNpyHeader(file);
    ASSERT_TRUE(header.ok()) << descr << ": " << header.status();
    EXPECT_EQ(header->descr, descr);
    EXPECT_EQ(header->element_size, size);
  }
}

TEST(NpyTest, ReadsFortranOrder) {
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(
      File("{'descr': '<f4', 'fortran_order': True, 'shape': (3, 4), }", 48));
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_TRUE(header->fortran_order);
  EXPECT_EQ(header->shape, (MatrixShape{1, 3, 4}));
  EXPECT_FALSE(
      ParseNpyHeader(
          File("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }",
               48))
          ->fortran_order);
}

// A large file's header is parsed from its first bytes, against its size.
TEST(NpyTest, ParsesTheHeaderFromTheStartOfTheFile) {
  const std::string file =
      File("{'descr': '<f8', 'fortran_order': False, 'shape': (1000, 1000), }",
           8000000);
  absl::StatusOr<NpyHeader> header =
      ParseNpyHeader(absl::string_view(file).substr(0, 4096), file.size());
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->shape, (MatrixShape{1, 1000, 1000}));
  EXPECT_THAT(
      ParseNpyHeader(absl::string_view(file).substr(0, 4096), file.size() - 8)
          .status()
          .message(),
      HasSubstr("the file holds 7999992"));
  // Too little of the file read for its header, or a file that ends inside
  // it.
  EXPECT_THAT(ParseNpyHeader(absl::string_view(file).substr(0, 50), file.size())
                  .status()
                  .message(),
              HasSubstr("is longer than the first 50 bytes read"));
  EXPECT_THAT(
      ParseNpyHeader(absl::string_view(file).substr(0, 50)).status().message(),
      HasSubstr("truncated header"));
}

TEST(NpyTest, RejectsWhatItCannotTranspose) {
  struct Case {
    std::string file;
    std::string message;
  };
  const Case cases[] = {
      {"not numpy at all", "magic"},
      {File("{'descr': '<f4', 'fortran_order': 1, 'shape': (3, 4), }", 48),
       "fortran_order 1 does not parse"},
      {File("{'descr': '|O', 'fortran_order': False, 'shape': (3, 4), }", 96),
       "'|O' is not supported"},
      {File("{'descr': '<U0', 'fortran_order': False, 'shape': (3, 4), }", 0),
       "'<U0' is not supported"},
      // Only a datetime's unit may follow the size: the descr goes into the
      // output's header as it stands.
      {File("{'descr': '<f4[s]', 'fortran_order': False, 'shape': (3, 4), }",
            48),
       "'<f4[s]' is not supported"},
      {File("{'descr': \"<M8[s']\", 'fortran_order': False, 'shape': (3, 4), "
            "}",
            96),
       "is not supported"},
      {File("{'descr': '<i4x', 'fortran_order': False, 'shape': (3, 4), }", 48),
       "'<i4x' is not supported"},
      {File("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, "
            "4294967296), }",
            0),
       "overflows"},
      // A zero dimension anywhere: no data, however large the others.
      {File("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, "
            "1099511627776, 0), }",
            4),
       "declares 0 data bytes, the file holds 4"},
      {File("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3, "
            "4), }",
            48),
       "structured dtypes"},
      {File("{'descr': '<f4', 'fortran_order': False, 'shape': (12,), }", 48),
       "1 dimension;"},
      {File("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }", 47),
       "holds 47"},
      {File("{'descr': '<f4', 'fortran_order': False, 'shape': (3, 0), }", 4),
       "declares 0 data bytes, the file holds 4"},
      {File("{'descr': '<f4', 'fortran_order': False, 'shape': (3, x), }", 0),
       "does not parse"},
      {File("{'fortran_order': False, 'shape': (3, 4), }", 48), "no descr"},
      // Descrs NumPy refuses, which would be copied into the output's header
      // (a quote in one would end its string there).
      {File("{'descr': 'xi1', 'fortran_order': False, 'shape': (3, 4), }", 12),
       "dtype 'xi1' does not start with a byte order"},
      {File("{'descr': \"'i1\", 'fortran_order': False, 'shape': (3, 4), }",
            12),
       "dtype ''i1' does not start with a byte order"},
      {File("{'descr': 'Sb1', 'fortran_order': False, 'shape': (3, 4), }", 12),
       "does not start with a byte order"},
      // Tuples Python does not read.
      {File("{'descr': '<f4', 'fortran_order': False, 'shape': (3,,4), }", 48),
       "shape (3,,4) does not parse"},
      {File("{'descr': '<f4', 'fortran_order': False, 'shape': (,3,4), }", 48),
       "does not parse"},
      {File("{'descr': '<f4', 'fortran_order': False, 'shape': (,), }", 0),
       "does not parse"},
      {File("{'descr': '<f4', 'fortran_order': False, 'shape': (+3, 4), }", 48),
       "does not parse"},
      {File("'descr': '<f4', 'fortran_order': False, 'shape': (3, 4)", 48),
       "not a dict literal"},
      {File("{'descr': '<f4', 'fortran_order': False, 'shape': (12), }", 48),
       "shape (12) is not a tuple"},
      {File("{'descr': '<f4', 'fortran_order': False, 'shape': 12, }", 48),
       "shape 12 is not a tuple"},
  };
  for (const Case& c : cases) {
    absl::Status status = ParseNpyHeader(c.file).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(status.message(), HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace transpose
