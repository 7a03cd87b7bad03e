#include "proto/convert.h"

#include <string>

#include "gtest/gtest.h"

namespace transpose::api {
namespace {

TEST(ConvertTest, RequestIdsArePrintableWithoutSpacesAndBounded) {
  for (const std::string id :
       {std::string("a"), std::string("3f2a9c0b5d7e1f46"),
        std::string("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        std::string(kMaxRequestIdBytes, '~')}) {
    EXPECT_TRUE(CheckRequestId(id).ok()) << id;
  }
  EXPECT_EQ(CheckRequestId(""),
            absl::InvalidArgumentError(
                "request id of 0 characters: expected 1 to 128"));
  EXPECT_EQ(CheckRequestId(std::string(kMaxRequestIdBytes + 1, 'a')),
            absl::InvalidArgumentError(
                "request id of 129 characters: expected 1 to 128"));
  // A line break would forge a log line; a space would split its field.
  EXPECT_EQ(CheckRequestId("a\nWARNING forged"),
            absl::InvalidArgumentError(
                "request id \"a\\nWARNING forged\": expected printable ASCII "
                "characters without spaces"));
  for (const std::string id :
       {std::string("a b"), std::string("a\tb"), std::string("\x7f"),
        std::string("caf\xc3\xa9"), std::string("a\0b", 3)}) {
    EXPECT_EQ(CheckRequestId(id).code(), absl::StatusCode::kInvalidArgument)
        << id;
  }
}

}  // namespace
}  // namespace transpose::api
