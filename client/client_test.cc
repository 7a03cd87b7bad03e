#include "client/client.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace transpose {
namespace {

using ::testing::HasSubstr;

TEST(CheckTargetTest, TakesWhatGrpcResolves) {
  for (const char* target :
       {"localhost:50051", "localhost", "10.0.0.1:1", "[::1]:50051", "[::1]",
        "::1", "dns:///svc:50051", "dns:svc", "dns://8.8.8.8/svc:50051",
        "ipv4:10.0.0.1:50051,10.0.0.2:50051", "ipv6:[::1]:1,[::2]:2",
        "unix:/run/transpose.sock", "unix-abstract:transpose", "vsock:3:50051",
        "xds:///transpose", "passthrough:///anything:at:all"}) {
    EXPECT_TRUE(CheckTarget(target).ok())
        << target << ": " << CheckTarget(target);
  }
}

// What gRPC would take and then fail every call on, or quietly reach another
// port with.
TEST(CheckTargetTest, RefusesTargetsGrpcCannotUse) {
  const std::pair<const char*, const char*> cases[] = {
      {"", "no target given"},
      {"dns:///", "names no address"},
      {"dns://8.8.8.8/", "names no address"},
      {"ipv4:", "names no address"},
      {"unix:", "names no address"},
      {":50051", ":50051 names no host"},
      {"[]:50051", "names no host"},
      {"localhost:", "port '' is not a number"},
      {"localhost:abc", "port 'abc' is not a number"},
      {"[::1]:x", "port 'x' is not a number"},
      {"[::1", "has no closing ]"},
      {"[::1]50051", "does not parse as [HOST]:PORT"},
      {"localhost:107951", "port 107951 is past 65535"},
      {"ipv4:10.0.0.1:1,10.0.0.2:65536", "port 65536 is past 65535"},
      {"dns:///svc:9999999999", "port 9999999999 is past 65535"},
  };
  for (const auto& [target, message] : cases) {
    const absl::Status status = CheckTarget(target);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << target;
    EXPECT_THAT(status.message(), HasSubstr(message)) << target;
    EXPECT_THAT(status.message(), HasSubstr(std::string("target ") + target))
        << target;
  }
}

}  // namespace
}  // namespace transpose
