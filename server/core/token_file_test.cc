#include "server/core/token_file.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace transpose {
namespace {

TEST(TokenFileTest, HoldsOneTokenPerLine) {
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

TEST(TokenFileTest, SendableTokens) {
  EXPECT_TRUE(IsSendableToken("abc+/=~!"));
  for (const char* token : {"", "a b", "a\n", "\x7f", "caf\xc3\xa9"}) {
    EXPECT_FALSE(IsSendableToken(token)) << token;
  }
}

}  // namespace
}  // namespace transpose
