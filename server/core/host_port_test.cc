#include "server/core/host_port.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace transpose {
namespace {

using ::testing::HasSubstr;

TEST(ParseHostPortTest, SplitsNamesAndAddresses) {
  struct Case {
    const char* address;
    const char* host;
    int port;
  };
  for (const Case& c :
       {Case{"0.0.0.0:50051", "0.0.0.0", 50051},
        Case{"localhost:0", "localhost", 0},
        Case{"[::1]:65535", "[::1]", 65535}, Case{"[::]:00080", "[::]", 80},
        Case{"my-host.example_1:80", "my-host.example_1", 80},
        Case{"[fe80::1%eth0]:1", "[fe80::1%eth0]", 1},
        Case{"[fe80::1%br-lan]:1", "[fe80::1%br-lan]", 1}}) {
    absl::StatusOr<HostPort> parsed = ParseHostPort(c.address);
    ASSERT_TRUE(parsed.ok()) << c.address << ": " << parsed.status();
    EXPECT_EQ(parsed->host, c.host);
    EXPECT_EQ(parsed->port, c.port);
  }
}

TEST(ParseHostPortTest, RefusesWhatTheOsWouldReadDifferently) {
  struct Case {
    const char* address;
    const char* message;
  };
  for (const Case& c :
       {Case{"50051", "not HOST:PORT"}, Case{":50051", "no host"},
        Case{"[]:1", "no host"}, Case{"::1:50051", "brackets"},
        Case{"host:65536", "0 to 65535"}, Case{"host:99999", "0 to 65535"},
        Case{"host:123456", "0 to 65535"}, Case{"host:", "0 to 65535"},
        Case{"host:-1", "0 to 65535"}, Case{"host:8o", "0 to 65535"},
        Case{"9000,127.0.0.1:9464", "holds ','"}, Case{"a host:1", "holds ' '"},
        Case{"[::1,]:1", "holds ','"}, Case{"h/x:1", "holds '/'"},
        Case{"[a,:1", "holds '['"}}) {
    absl::StatusOr<HostPort> parsed = ParseHostPort(c.address);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << c.address;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.message)) << c.address;
  }
}

TEST(PeerHostTest, DropsThePortOfIpPeersOnly) {
  EXPECT_EQ(PeerHost("ipv4:10.0.0.1:40000"), "ipv4:10.0.0.1");
  EXPECT_EQ(PeerHost("ipv6:[::1]:40000"), "ipv6:[::1]");
  EXPECT_EQ(PeerHost("ipv6:%5B::1%5D:35862"), "ipv6:%5B::1%5D");
  EXPECT_EQ(PeerHost("ipv6:[fe80::1%eth0]:1"), "ipv6:[fe80::1%eth0]");
  EXPECT_EQ(PeerHost("unix:/tmp/socket"), "unix:/tmp/socket");
  EXPECT_EQ(PeerHost("ipv4:10.0.0.1"), "ipv4:10.0.0.1");
  EXPECT_EQ(PeerHost("ipv6:[::1]"), "ipv6:[::1]");
  EXPECT_EQ(PeerHost("ipv6:%5B::1%5D"), "ipv6:%5B::1%5D");
  EXPECT_EQ(PeerHost(""), "");
}

}  // namespace
}  // namespace transpose
