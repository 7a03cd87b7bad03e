// Client-side load balancing over several real servers: an ipv4: target list
// with round_robin spreads requests over every server, as each server's own
// metrics show.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/server_process.h"

namespace transpose {
namespace {

using testing::ServerProcess;

double RequestsServed(const ServerProcess& server, absl::string_view method) {
  return server
      .Metric(absl::StrCat("transpose_requests_total{code=\"OK\",method=\"",
                           method, "\"}"))
      .value_or(0);
}

TEST(LoadBalancingTest, RoundRobinSpreadsRequestsOverEveryServer) {
  std::vector<std::unique_ptr<ServerProcess>> servers;
  std::vector<std::string> addresses;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::StartFromEnvironment({});
    ASSERT_TRUE(server.ok()) << server.status();
    addresses.push_back((*server)->address());
    servers.push_back(*std::move(server));
  }
  ClientOptions options;
  options.target = absl::StrCat("ipv4:", absl::StrJoin(addresses, ","));
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  ASSERT_TRUE(client.ok()) << client.status();

  const std::vector<uint8_t> data(16 * 24 * 4, 7);
  const MatrixView input{DataType::kFloat32, {1, 16, 24}, data};
  for (int i = 0; i < 60; ++i) ASSERT_TRUE((*client)->Transpose(input).ok());
  CallOptions stream;
  stream.force_stream = true;
  for (int i = 0; i < 30; ++i)
    ASSERT_TRUE((*client)->Transpose(input, stream).ok());

  double unary_total = 0, stream_total = 0;
  for (const auto& server : servers) {
    const double unary = RequestsServed(*server, "Transpose");
    const double streamed = RequestsServed(*server, "TransposeStream");
    EXPECT_GE(unary, 10) << server->address();
    EXPECT_GE(streamed, 5) << server->address();
    unary_total += unary;
    stream_total += streamed;
  }
  EXPECT_EQ(unary_total, 60);
  EXPECT_EQ(stream_total, 30);
}

TEST(LoadBalancingTest, DnsTargetsResolve) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::StartFromEnvironment({});
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions options;
  options.target = absl::StrCat("dns:///localhost:", (*server)->port());
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->CheckHealth().value_or(false), true);
}

}  // namespace
}  // namespace transpose
