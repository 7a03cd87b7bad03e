#include "server/access_control.h"

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

TEST(AccessControlTest, BearerSchemeInAnyCaseWithAnyOfTheTokens) {
  const std::vector<std::string> tokens = {"old-token", "new-token"};
  for (const char* value : {"Bearer old-token", "Bearer new-token",
                            "bearer new-token", "BEARER old-token"}) {
    EXPECT_TRUE(CheckBearer(value, tokens).ok()) << value;
  }
  for (const char* value :
       {"", "Bearer", "Bearer ", "Bearer  old-token", "Bearer old-token ",
        "Basic old-token", "old-token", "Bearer old", "Bearer old-token-2"}) {
    EXPECT_EQ(CheckBearer(value, tokens),
              absl::UnauthenticatedError("invalid bearer token"))
        << value;
  }
}

TEST(AccessControlTest, ReplacesTokensOnlyWithUsableOnes) {
  AccessControl access(AccessPolicy{{"old-token"}, false});
  EXPECT_EQ(access.ReplaceTokens("old-token\nnew-token\n").value(), 2);
  EXPECT_EQ(access.ReplaceTokens("new-token").value(), 1);
  EXPECT_EQ(access.ReplaceTokens("").status(),
            absl::InvalidArgumentError("holds no token"));
  EXPECT_TRUE(access.enabled());
  // A server started without tokens takes none later.
  AccessControl open(AccessPolicy{});
  EXPECT_EQ(open.ReplaceTokens("token").status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(open.enabled());
}

}  // namespace
}  // namespace transpose
