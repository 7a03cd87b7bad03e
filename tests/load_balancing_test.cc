// Client-side load balancing over several real servers: an ipv4: target list
// with round_robin spreads requests over every server, as each server's own
// metrics show.
#include <memory>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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
  // Each server's count, once the servers have recorded `calls` of `method`
  // between them (a server records a call just after its client has the
  // status).
  const auto settled_counts = [&servers](absl::string_view method,
                                         double calls) {
    std::vector<double> counts;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    do {
      counts.clear();
      for (const auto& server : servers)
        counts.push_back(RequestsServed(*server, method));
      if (absl::c_accumulate(counts, 0.0) == calls) break;
      absl::SleepFor(absl::Milliseconds(10));
    } while (absl::Now() < deadline);
    return counts;
  };
  // round_robin sends calls only to the servers it has connected to, and a
  // connection can take a moment (longer under the sanitizers, where one
  // server once got none of 60 calls): each server answers one first.
  int warm_up_calls = 0;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (std::vector<double> counts;;) {
    counts = settled_counts("Transpose", warm_up_calls);
    if (absl::c_count(counts, 0.0) == 0) break;
    ASSERT_LT(absl::Now(), deadline)
        << "round_robin never reached every server";
    ASSERT_TRUE((*client)->Transpose(input).ok());
    ++warm_up_calls;
  }
  const std::vector<double> before = settled_counts("Transpose", warm_up_calls);

  for (int i = 0; i < 60; ++i) ASSERT_TRUE((*client)->Transpose(input).ok());
  CallOptions stream;
  stream.force_stream = true;
  for (int i = 0; i < 30; ++i)
    ASSERT_TRUE((*client)->Transpose(input, stream).ok());

  const std::vector<double> unary =
      settled_counts("Transpose", warm_up_calls + 60);
  const std::vector<double> streamed = settled_counts("TransposeStream", 30);
  double unary_total = 0, stream_total = 0;
  for (size_t i = 0; i < servers.size(); ++i) {
    EXPECT_GE(unary[i] - before[i], 10) << servers[i]->address();
    EXPECT_GE(streamed[i], 5) << servers[i]->address();
    unary_total += unary[i] - before[i];
    stream_total += streamed[i];
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
