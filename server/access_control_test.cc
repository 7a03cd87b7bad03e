#include "server/access_control.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace transpose {
namespace {

TEST(AccessControlTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("token", "token"));
  EXPECT_FALSE(ConstantTimeEquals("token", "tokem"));
  EXPECT_FALSE(ConstantTimeEquals("token", "token2"));
  EXPECT_FALSE(ConstantTimeEquals("token2", "token"));
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_FALSE(
      ConstantTimeEquals(std::string("a\0b", 3), std::string("a\0c", 3)));
}

TEST(AccessControlTest, EnabledOnlyWithAPolicy) {
  EXPECT_FALSE(AccessControl(AccessPolicy{}).enabled());
  EXPECT_TRUE(AccessControl(AccessPolicy{{"t"}, false}).enabled());
  EXPECT_TRUE(AccessControl(AccessPolicy{{}, true}).enabled());
}

TEST(AccessControlTest, TokenFileHoldsOneTokenPerLine) {
  using ::testing::ElementsAre;
  EXPECT_THAT(ParseTokenFile("s3cret\n").value(), ElementsAre("s3cret"));
  EXPECT_THAT(ParseTokenFile("\r\n  old-token \r\n\n\tnew-token").value(),
              ElementsAre("old-token", "new-token"));
  for (const char* contents : {"", "\n", " \n\t\n"}) {
    EXPECT_EQ(ParseTokenFile(contents).status(),
              absl::InvalidArgumentError("holds no token"))
        << contents;
  }
  // A token no client could send after "Bearer ": refused, naming the line and
  // never quoting it.
  for (const char* contents :
       {"two words", "ok\nsecret\x01", "ok\n\nsecr\xc3\xa9t"}) {
    const absl::Status status = ParseTokenFile(contents).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << contents;
    EXPECT_THAT(std::string(status.message()), ::testing::StartsWith("line "));
    EXPECT_THAT(std::string(status.message()),
                ::testing::Not(::testing::HasSubstr("secr")));
  }
  EXPECT_THAT(
      std::string(ParseTokenFile("ok\n\nsecr\xc3\xa9t").status().message()),
      ::testing::StartsWith("line 3 "));
}

}  // namespace
}  // namespace transpose
