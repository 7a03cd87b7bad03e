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
  EXPECT_TRUE(AccessControl(AccessPolicy{"t", false}).enabled());
  EXPECT_TRUE(AccessControl(AccessPolicy{"", true}).enabled());
}

}  // namespace
}  // namespace transpose
