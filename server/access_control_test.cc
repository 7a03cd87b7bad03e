#include "server/access_control.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

TEST(AccessControlTest, ClientNamesAskForACertificate) {
  AccessPolicy policy;
  policy.client_names = {"batch"};
  const AccessControl access(policy);
  EXPECT_TRUE(access.enabled());
  // Without TLS there is no certificate to name anyone.
  EXPECT_EQ(
      access.Check(nullptr, {}),
      absl::UnauthenticatedError("a verified client certificate is required"));
}

TEST(AccessControlTest, AnyNameOfTheCertificateMustBeAllowedExactly) {
  const std::vector<std::string> allowed = {"batch.example",
                                            "spiffe://example.org/batch"};
  EXPECT_TRUE(CheckClientName({"batch", "batch.example"}, allowed).ok());
  EXPECT_TRUE(
      CheckClientName({"x", "y", "spiffe://example.org/batch"}, allowed).ok());
  EXPECT_EQ(CheckClientName({"batch", "Batch.example", "batch.example.org",
                             "spiffe://example.org/batch/x"},
                            allowed),
            absl::PermissionDeniedError(
                "the client certificate (\"batch\", \"Batch.example\", "
                "\"batch.example.org\", \"spiffe://example.org/batch/x\") "
                "names none of the clients this server serves"));
  EXPECT_EQ(CheckClientName({}, allowed),
            absl::PermissionDeniedError(
                "the client certificate (no names) names none of the clients "
                "this server serves"));
  // Names are escaped and cut: a CA may sign any bytes there.
  EXPECT_EQ(CheckClientName({"a\nWARNING forged \"x\"", std::string(200, 'n')},
                            allowed),
            absl::PermissionDeniedError(absl::StrCat(
                "the client certificate (\"a\\nWARNING forged \\\"x\\\"\", \"",
                std::string(128, 'n'),
                "...\") names none of the clients this server serves")));
  // A certificate with many names is not echoed whole.
  std::vector<std::string> many;
  for (int i = 0; i < 20; ++i) many.push_back(absl::StrCat("n", i));
  const absl::Status refused = CheckClientName(many, allowed);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(absl::StrContains(refused.message(), "\"n7\" and 12 more"))
      << refused;
  EXPECT_FALSE(absl::StrContains(refused.message(), "n8")) << refused;
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
