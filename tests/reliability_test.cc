// Limits, cancellation, deadlines, disconnects and graceful drain, against the
// real server binary: each shows the server giving back what a request held
// (the admission gauges on /metrics go back to zero) and staying up.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "server/core/notification.h"
#include "tests/reference_transpose.h"
#include "tests/server_process.h"
#include "transpose/v1/transpose.grpc.pb.h"

namespace transpose {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ServerLog;
using testing::ServerProcess;
using Stream =
    grpc::ClientReaderWriter<v1::TransposeRequest, v1::TransposeResponse>;

constexpr uint64_t kMiB = 1 << 20;
// Streams the server ended as timed out (the idle watchdog's count).
constexpr char kDeadlines[] =
    "transpose_requests_total{code=\"DEADLINE_EXCEEDED\","
    "method=\"TransposeStream\"}";

std::unique_ptr<ServerProcess> Start(std::vector<std::string> args,
                                     const std::string& stderr_path = "") {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::StartFromEnvironment(std::move(args), absl::Seconds(60),
                                          stderr_path);
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

double Gauge(const ServerProcess& server, const std::string& name) {
  return server.Metric(name).value_or(-1);
}

double AwaitGauge(const ServerProcess& server, const std::string& name,
                  double value, absl::Duration timeout = absl::Seconds(5)) {
  return server.AwaitMetric(name, value, timeout);
}

v1::TransposeRequest Header(uint64_t rows, uint64_t cols) {
  v1::TransposeRequest header;
  header.set_dtype(v1::DATA_TYPE_FLOAT32);
  header.mutable_shape()->set_rows(rows);
  header.mutable_shape()->set_cols(cols);
  return header;
}

// TransposeStream uploads that stop after their headers: each holds its
// admission until cancelled, at the latest when this goes.
class HeldUploads {
 public:
  explicit HeldUploads(v1::TransposeService::Stub& stub) : stub_(stub) {}
  ~HeldUploads() { CancelAll(); }

  // One more, of a `rows` x `cols` float32 matrix; false when its header could
  // not be written.
  bool Add(uint64_t rows, uint64_t cols) {
    contexts_.push_back(std::make_unique<grpc::ClientContext>());
    streams_.push_back(stub_.TransposeStream(contexts_.back().get()));
    return streams_.back()->Write(Header(rows, cols));
  }
  void Cancel(size_t i) { contexts_[i]->TryCancel(); }
  void CancelAll() {
    for (auto& context : contexts_) context->TryCancel();
  }

 private:
  v1::TransposeService::Stub& stub_;
  // Streams go before their contexts.
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts_;
  std::vector<std::unique_ptr<Stream>> streams_;
};

// A random float32 matrix of `rows` x `cols` through the client library; a
// result other than its transpose is an INTERNAL error.
absl::Status Transpose(Client& client, uint64_t rows, uint64_t cols,
                       const CallOptions& call = {}) {
  static std::atomic<uint32_t> seed{1};
  const std::vector<uint8_t> data =
      testing::RandomBytes(rows * cols * 4, seed++);
  const MatrixShape shape{1, rows, cols};
  absl::StatusOr<TransposeResult> result =
      client.Transpose({DataType::kFloat32, shape, data}, call);
  if (!result.ok()) return result.status();
  if (result->data != testing::ReferenceTranspose(data, 4, shape)) {
    return absl::InternalError(
        absl::StrCat("wrong result for ", ShapeToString(shape)));
  }
  return absl::OkStatus();
}

// A TCP relay to a server port that can freeze: it then stops moving bytes
// but keeps every connection open, as a client host that vanished or a cut
// network leaves them.
class FreezableRelay {
 public:
  explicit FreezableRelay(int server_port) : server_port_(server_port) {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address = Loopback(0);
    socklen_t length = sizeof(address);
    if (bind(listener_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        listen(listener_, 8) != 0 ||
        getsockname(listener_, reinterpret_cast<sockaddr*>(&address),
                    &length) != 0) {
      ADD_FAILURE() << "relay cannot listen";
    }
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] { Run(); });
  }
  ~FreezableRelay() {
    stop_ = true;
    thread_.join();
    for (int fd : open_) close(fd);
    close(listener_);
  }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  // Returns once no bytes move: a pass of Run() under way when it was called
  // could still carry a call's request and, reading the server after, its
  // answer (a call through a frozen relay once succeeded so).
  void Freeze() {
    frozen_ = true;
    const uint64_t pass = passes_;
    while (passes_ == pass && !stop_) absl::SleepFor(absl::Milliseconds(1));
  }
  // Closes each connection from now on as it comes, leaving those open.
  void RefuseNewConnections() { refuse_new_ = true; }
  // Stops moving bytes from the server to the client once `bytes` have gone
  // that way: the rest waits in the server's buffers, as for a client that
  // does not read. UINT64_MAX moves them again.
  void LimitAnswers(uint64_t bytes) { answer_limit_ = bytes; }
  // Moves at most `bytes_per_second` from the server to clients, as a slow
  // link would; 0: as fast as it can.
  void ThrottleAnswers(uint64_t bytes_per_second) {
    answer_rate_ = bytes_per_second;
  }

 private:
  static sockaddr_in Loopback(int port) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return address;
  }

  // Accepts connections and copies bytes both ways until frozen or stopped.
  void Run() {
    std::vector<int> peer;    // peer[j]: where bytes read from open_[j] go.
    std::vector<bool> ended;  // open_[j] has reached its end.
    // Bytes the server may send now, under ThrottleAnswers.
    double credit = 0;
    absl::Time credited = absl::Now();
    while (!stop_) {
      ++passes_;
      const uint64_t rate = answer_rate_;
      const absl::Time now = absl::Now();
      credit = std::min(credit + rate * absl::ToDoubleSeconds(now - credited),
                        64.0 * 1024);
      credited = now;
      std::vector<pollfd> fds = {{listener_, POLLIN, 0}};
      std::vector<size_t> which;  // fds[i + 1] is open_[which[i]].
      for (size_t j = 0; j < open_.size() && !frozen_; ++j) {
        if (ended[j]) continue;
        // open_ holds (client, server) pairs: odd j read the server.
        if (j % 2 == 1 && answered_ >= answer_limit_) continue;
        if (j % 2 == 1 && rate > 0 && credit < 1024) continue;
        fds.push_back({open_[j], POLLIN, 0});
        which.push_back(j);
      }
      if (poll(fds.data(), fds.size(), 20) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        const int client = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
        if (refuse_new_) {
          close(client);
          continue;
        }
        const int upstream = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        const sockaddr_in server = Loopback(server_port_);
        if (connect(upstream, reinterpret_cast<const sockaddr*>(&server),
                    sizeof(server)) != 0) {
          close(client);
          close(upstream);
          continue;
        }
        open_.insert(open_.end(), {client, upstream});
        peer.insert(peer.end(), {upstream, client});
        ended.insert(ended.end(), {false, false});
        continue;
      }
      for (size_t i = 0; i < which.size(); ++i) {
        if (!(fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const size_t j = which[i];
        char buffer[64 << 10];
        const size_t most =
            j % 2 == 1 && rate > 0
                ? std::min(sizeof(buffer), static_cast<size_t>(credit))
                : sizeof(buffer);
        const ssize_t n = read(open_[j], buffer, most);
        if (n <= 0) {
          ended[j] = true;
          shutdown(peer[j], SHUT_WR);
          continue;
        }
        for (ssize_t sent = 0; sent < n;) {
          // A peer gone away must not end the test with SIGPIPE.
          const ssize_t m =
              send(peer[j], buffer + sent, n - sent, MSG_NOSIGNAL);
          if (m <= 0) break;
          sent += m;
        }
        if (j % 2 == 1) {
          answered_ += n;
          credit -= n;
        }
      }
    }
  }

  const int server_port_;
  int listener_ = -1;
  int port_ = 0;
  std::vector<int> open_;
  std::atomic<bool> frozen_{false};
  std::atomic<uint64_t> passes_{0};  // Of Run()'s loop, begun.
  std::atomic<bool> refuse_new_{false};
  std::atomic<uint64_t> answer_limit_{UINT64_MAX};
  std::atomic<uint64_t> answer_rate_{0};
  uint64_t answered_ = 0;  // Bytes from the server to clients.
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class ReliabilityTest : public ::testing::Test {
 protected:
  // These tests look at what the server answers, so the client does not
  // retry (ClientRetriesABusyServerButNotAMatrixOverTheLimit tests that).
  std::unique_ptr<Client> Connect(const ServerProcess& server,
                                  int max_attempts = 1) {
    ClientOptions options;
    options.target = server.address();
    options.default_timeout = absl::Seconds(20);
    options.max_attempts = max_attempts;
    options.max_backoff = absl::Milliseconds(400);
    // One connection, which the test's raw calls (through channel()) share
    // and whose age and stream limit some tests watch.
    options.connections = 1;
    return *Client::Create(options);
  }
};

TEST_F(ReliabilityTest, AdmissionLimitsRefuseAtOnceAndCancellingGivesBack) {
  auto server = Start({absl::StrCat("--max_inflight_bytes=", 8 * kMiB),
                       "--max_inflight_requests=3"});
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  auto stub = v1::TransposeService::NewStub(client->channel());

  // A 6 MiB upload that stops after its header and a chunk holds 6 MiB of
  // the 8.
  grpc::ClientContext held;
  std::unique_ptr<Stream> stream = stub->TransposeStream(&held);
  v1::TransposeRequest first = Header(1536, 1024);
  first.set_data(std::string(kMiB, '\1'));
  ASSERT_TRUE(stream->Write(first));
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_bytes", 6.0 * kMiB),
            6.0 * kMiB);

  const absl::Time asked = absl::Now();
  absl::Status busy = Transpose(*client, 1024, 1024);  // 4 MiB: over the limit.
  EXPECT_EQ(busy.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(busy.message(), HasSubstr("server busy"));
  // Refused at once, not queued until the held upload ends (it does not).
  EXPECT_LT(absl::Now() - asked, absl::Seconds(5));
  EXPECT_TRUE(Transpose(*client, 512, 512).ok());  // 1 MiB fits.

  held.TryCancel();
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_bytes", 0), 0);
  EXPECT_TRUE(Transpose(*client, 1024, 1024).ok());

  // Three uploads stopped after their headers take every request slot. The
  // call above gives its slot back just after its client has the result:
  // until it has, the third upload would be refused instead.
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_requests", 0), 0);
  HeldUploads uploads(*stub);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(uploads.Add(8, 8));
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_requests", 3), 3);
  absl::Status full = Transpose(*client, 8, 8);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("requests in flight"));
  uploads.Cancel(0);
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_requests", 2), 2);
  EXPECT_TRUE(Transpose(*client, 8, 8).ok());
  uploads.CancelAll();
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_requests", 0), 0);
}

// Uploads from one client host that stop after their headers hold only that
// host's share: another host is still served, and the first gets in again once
// its uploads are gone. The two hosts are 127.0.0.1 and ::1.
TEST_F(ReliabilityTest, OneClientHostHoldsOnlyItsShareOfTheAdmissionBudget) {
  auto server = Start({"--address=[::]:0",
                       absl::StrCat("--max_inflight_bytes=", 16 * kMiB),
                       absl::StrCat("--max_inflight_bytes_per_peer=", 6 * kMiB),
                       "--max_inflight_requests_per_peer=3"});
  ASSERT_NE(server, nullptr);
  auto ipv4 = Connect(*server);
  ClientOptions options;
  options.target = absl::StrCat("[::1]:", server->port());
  options.default_timeout = absl::Seconds(20);
  options.max_attempts = 1;
  auto ipv6 = *Client::Create(options);
  if (!ipv6->GetServerInfo(absl::Seconds(5)).ok()) {
    GTEST_SKIP() << "this machine has no IPv6 loopback (::1)";
  }

  auto stub = v1::TransposeService::NewStub(ipv4->channel());
  grpc::ClientContext held;
  std::unique_ptr<Stream> stream = stub->TransposeStream(&held);
  ASSERT_TRUE(stream->Write(Header(1024, 1024)));  // 4 MiB of 127.0.0.1's 6.
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_bytes", 4.0 * kMiB),
            4.0 * kMiB);
  EXPECT_EQ(Gauge(*server, "transpose_admitted_peers"), 1);

  // 4 more MiB from the same host pass its share, with the server's budget
  // half free; from the other host they fit.
  absl::Status busy = Transpose(*ipv4, 1024, 1024);
  EXPECT_EQ(busy.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(busy.message(), HasSubstr("server busy for ipv4:127.0.0.1: "
                                        "4194304 bytes of its matrices"));
  EXPECT_TRUE(Transpose(*ipv6, 1024, 1024).ok());
  EXPECT_TRUE(Transpose(*ipv4, 512, 512).ok());  // 1 MiB fits the share.

  held.TryCancel();
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_bytes", 0), 0);
  EXPECT_TRUE(Transpose(*ipv4, 1024, 1024).ok());

  // The request share: three held uploads, then the host's fourth is refused.
  HeldUploads uploads(*stub);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(uploads.Add(8, 8));
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_requests", 3), 3);
  EXPECT_THAT(Transpose(*ipv4, 8, 8).message(),
              HasSubstr("3 of its requests in flight, the limit per caller"));
  EXPECT_TRUE(Transpose(*ipv6, 8, 8).ok());
  uploads.CancelAll();
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_requests", 0), 0);
  EXPECT_EQ(Gauge(*server, "transpose_admitted_peers"), 0);
}

// A connection runs at most --max_concurrent_streams calls; the client's next
// one waits on its side until one ends, while another connection is served.
TEST_F(ReliabilityTest, AConnectionRunsAtMostItsStreamLimit) {
  auto server = Start({"--max_concurrent_streams=2"});
  ASSERT_NE(server, nullptr);
  // Channels of their own (not gRPC's shared subchannels): one connection
  // each.
  const auto connect = [&server] {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    return v1::TransposeService::NewStub(grpc::CreateCustomChannel(
        server->address(), grpc::InsecureChannelCredentials(), args));
  };
  auto stub = connect();
  constexpr char kInflight[] = "transpose_inflight_requests";
  HeldUploads uploads(*stub);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(uploads.Add(8, 8));
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_requests", 2), 2);
  // The third waits for a stream of the connection: starting it blocks until
  // it has one.
  grpc::ClientContext third_context;
  third_context.set_deadline(std::chrono::system_clock::now() +
                             std::chrono::seconds(60));
  std::unique_ptr<Stream> third_stream;
  std::atomic<bool> third_started{false};
  std::atomic<bool> third_wrote{false};
  std::thread third([&] {
    third_stream = stub->TransposeStream(&third_context);
    third_started = true;
    third_wrote = third_stream->Write(Header(8, 8));
  });
  absl::SleepFor(absl::Milliseconds(500));
  EXPECT_EQ(Gauge(*server, kInflight), 2);
  // Another connection is served meanwhile.
  {
    grpc::ClientContext context;
    v1::TransposeRequest request = Header(8, 8);
    request.set_data(std::string(8 * 8 * 4, '\1'));
    v1::TransposeResponse response;
    EXPECT_TRUE(connect()->Transpose(&context, request, &response).ok());
  }
  EXPECT_FALSE(third_started);
  // The other connection's call gives its admission back only after its
  // reply is out, so it may still be counted for a moment.
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_requests", 2), 2);
  // The first stream ends: the third starts and is admitted.
  uploads.Cancel(0);
  third.join();
  EXPECT_TRUE(third_started);
  EXPECT_TRUE(third_wrote);
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_requests", 2), 2);
  third_context.TryCancel();
  uploads.CancelAll();
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_requests", 0), 0);
}

TEST_F(ReliabilityTest, AnExpiredDeadlineGivesEverythingBack) {
  auto server = Start({absl::StrCat("--max_inflight_bytes=", 8 * kMiB)});
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  auto stub = v1::TransposeService::NewStub(client->channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(300));
  std::unique_ptr<Stream> stream = stub->TransposeStream(&context);
  ASSERT_TRUE(stream->Write(Header(1536, 1024)));
  v1::TransposeResponse response;
  EXPECT_FALSE(stream->Read(&response));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_bytes", 0), 0);
  EXPECT_EQ(AwaitGauge(*server, "transpose_inflight_requests", 0), 0);
  // The server counts it as the client saw it.
  EXPECT_EQ(AwaitGauge(*server,
                       "transpose_requests_total{code=\"DEADLINE_EXCEEDED\","
                       "method=\"TransposeStream\"}",
                       1),
            1);
  EXPECT_TRUE(Transpose(*client, 1536, 1024).ok());
}

// gRPC receives a whole message before it checks --max_message_bytes, so
// without a quota on its buffers one call can make the server hold gigabytes.
// With --max_transport_bytes the call is reset once the quota fills, and the
// server keeps serving ordinary calls under the same quota.
TEST_F(ReliabilityTest, AnOversizedMessageIsCutOffAtTheTransportQuota) {
  auto server = Start({"--max_message_bytes=1048576",
                       absl::StrCat("--max_inflight_bytes=", 32 * kMiB),
                       absl::StrCat("--max_transport_bytes=", 64 * kMiB)});
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  ASSERT_TRUE(Transpose(*client, 8, 8).ok());

  // A 1 GiB message. Without the quota the server's peak memory grows by all
  // of it; with it, by the quota plus what gRPC and the allocator (ASan keeps
  // up to 256 MiB of freed memory) hold on top.
  constexpr uint64_t kHuge = 1024 * kMiB;
  server->ResetPeakResidentBytes();
  const uint64_t resident_before = server->ResidentBytes();
  ASSERT_GT(resident_before, 0u);
  {
    auto stub = v1::TransposeService::NewStub(client->channel());
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(60));
    v1::TransposeRequest request = Header(16384, 16384);
    request.mutable_data()->resize(kHuge, '\1');
    v1::TransposeResponse response;
    const grpc::Status status = stub->Transpose(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << status.error_message();
    // Not gRPC's size check, which comes after the whole message.
    EXPECT_THAT(status.error_message(),
                ::testing::Not(HasSubstr("larger than max")));
  }
  EXPECT_LT(server->PeakResidentBytes() - resident_before, kHuge / 2)
      << "the server buffered the message";

  // A message just over the limit is still refused by gRPC's own check.
  {
    auto stub = v1::TransposeService::NewStub(client->channel());
    grpc::ClientContext context;
    v1::TransposeRequest request = Header(512, 1024);
    request.mutable_data()->resize(2 * kMiB, '\1');
    v1::TransposeResponse response;
    const grpc::Status status = stub->Transpose(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(status.error_message(), HasSubstr("larger than max"));
  }
  // Ordinary calls go through under the same quota: 1 MiB unary, and a
  // 16 MiB stream in 1 MiB messages.
  EXPECT_TRUE(Transpose(*client, 512, 512).ok());
  EXPECT_TRUE(Transpose(*client, 2048, 2048).ok());
}

// gRPC's quota resets a stream of whichever connection its reclaimer reaches
// first, not always the one that used the memory; the client library sends
// such a call again when its messages were within every server's limit (the
// reset was not its doing), and not otherwise.
TEST_F(ReliabilityTest, ACallResetByTheTransportQuotaIsSentAgain) {
  auto server = Start({"--max_message_bytes=1048576",
                       absl::StrCat("--max_inflight_bytes=", 32 * kMiB),
                       absl::StrCat("--max_transport_bytes=", 64 * kMiB)});
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server, /*max_attempts=*/2);

  // The library's upload stops after its first chunk until a hog on a
  // connection of its own has used up the quota and been answered. gRPC 1.51
  // queues a connection's reclaimer when its first stream arrives and calls
  // the queue in order, so the library's stream is reset first (a gRPC whose
  // order differs fails the attempt count below).
  constexpr uint64_t kRows = 2048, kCols = 1024;
  std::vector<uint8_t> data(kRows * kCols * 4);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i);
  Notification uploading, hog_done;
  int last_attempt = 0;
  bool paused = false;
  CallOptions call;
  call.force_stream = true;
  call.on_progress = [&](const TransferProgress& progress) {
    last_attempt = progress.attempt;
    if (progress.attempt == 1 && !paused) {
      paused = true;
      uploading.Notify();
      hog_done.WaitForNotification();
    }
  };
  absl::StatusOr<TransposeResult> result;
  std::thread caller([&] {
    result =
        client->Transpose({DataType::kFloat32, {1, kRows, kCols}, data}, call);
  });
  if (!uploading.WaitForNotificationWithTimeout(absl::Seconds(30))) {
    hog_done.Notify();
    caller.join();
    FAIL() << "the upload never started: " << result.status();
  }
  {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxSendMessageSize(-1);
    auto stub = v1::TransposeService::NewStub(grpc::CreateCustomChannel(
        server->address(), grpc::InsecureChannelCredentials(), args));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(60));
    v1::TransposeRequest request = Header(16384, 16384);
    request.mutable_data()->resize(1024 * kMiB, '\1');
    v1::TransposeResponse response;
    const grpc::Status status = stub->Transpose(&context, request, &response);
    // The quota's own reset, not gRPC's size check after the whole message.
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << status.error_message();
    EXPECT_THAT(status.error_message(), Not(HasSubstr("larger than max")));
  }
  hog_done.Notify();
  caller.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(last_attempt, 2);
  EXPECT_EQ(result->data,
            testing::ReferenceTranspose(data, 4, {1, kRows, kCols}));

  // Messages over the server's limit are final, whether gRPC's size check
  // refuses one (2 MiB) or the quota cuts it off first (512 MiB): the repeat
  // would meet the limit again. The quota's reclaimer runs on its own
  // thread: a message of 96 MiB, 1.5 quotas, once arrived whole first on a
  // busy machine (ctest -j2), and met the size check instead.
  ClientOptions options;
  options.target = server->address();
  options.max_attempts = 2;
  options.unary_max_bytes = 1024 * kMiB;
  std::unique_ptr<Client> oversized = *Client::Create(options);
  for (const auto& [rows, error] :
       {std::pair{512, "larger than max"},
        std::pair{131072, "Received RST_STREAM with error code 11"}}) {
    // Zeros: random bytes took seconds to make, and the server never
    // transposes them.
    const uint64_t rows_64 = static_cast<uint64_t>(rows);
    const std::vector<uint8_t> zeros(rows_64 * 1024 * 4);
    const absl::Status refused =
        oversized->Transpose({DataType::kFloat32, {1, rows_64, 1024}, zeros})
            .status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
    EXPECT_THAT(refused.message(), HasSubstr(error));
    EXPECT_THAT(refused.message(), Not(HasSubstr("gave up")));
    EXPECT_FALSE(IsRetryable(refused));
  }
}

// A client whose connection stays alive but whose call stops moving data (it
// sent a header and then nothing, or stopped reading the response) is ended
// after --stream_idle_seconds, and its admission comes back; keepalive cannot
// tell such a client from a healthy one.
TEST_F(ReliabilityTest, AStalledStreamIsEndedAndGivesBackItsAdmission) {
  auto server = Start({"--stream_idle_seconds=1"});
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  auto stub = v1::TransposeService::NewStub(client->channel());

  // An upload that stops after its header.
  {
    grpc::ClientContext context;
    // Without the watchdog, the call would wait for this.
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(40));
    // The server's idle time starts when the call does.
    const absl::Time stalled = absl::Now();
    std::unique_ptr<Stream> stream = stub->TransposeStream(&context);
    ASSERT_TRUE(stream->Write(Header(1536, 1024)));
    ASSERT_EQ(AwaitGauge(*server, "transpose_admitted_bytes", 6.0 * kMiB),
              6.0 * kMiB);
    v1::TransposeResponse response;
    EXPECT_FALSE(stream->Read(&response));
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_THAT(status.error_message(), HasSubstr("idle stream"));
    EXPECT_GE(absl::Now() - stalled, absl::Milliseconds(900));
    EXPECT_LT(absl::Now() - stalled, absl::Seconds(10));
    EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_bytes", 0), 0);
    EXPECT_EQ(AwaitGauge(*server, kDeadlines, 1), 1);
  }

  // A client that sends a 64 MiB matrix and never reads the result: the
  // server's writes block once the flow-control windows are full.
  {
    grpc::ClientContext context;
    // Without the watchdog, the call would wait for this.
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(40));
    std::unique_ptr<Stream> stream = stub->TransposeStream(&context);
    const std::string chunk(kMiB, '\3');
    v1::TransposeRequest request = Header(4096, 4096);
    for (int i = 0; i < 64; ++i) {
      request.set_data(chunk);
      ASSERT_TRUE(stream->Write(request));
      request.Clear();
    }
    ASSERT_TRUE(stream->WritesDone());
    EXPECT_EQ(
        AwaitGauge(*server, "transpose_admitted_bytes", 0, absl::Seconds(20)),
        0);
    v1::TransposeResponse response;
    while (stream->Read(&response)) {
    }
    // Its status could not overtake the data it does not read: the server
    // cancels the call, and counts it as timed out.
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
    EXPECT_EQ(AwaitGauge(*server, kDeadlines, 2), 2);
  }

  // A reader slower than the limit in all, but never idle for as long, gets
  // its whole result: 4 MiB in 1 MiB messages, read 0.4 s apart.
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(40));
    std::unique_ptr<Stream> stream = stub->TransposeStream(&context);
    v1::TransposeRequest request = Header(1024, 1024);
    request.set_data(std::string(4 * kMiB, '\5'));
    ASSERT_TRUE(stream->Write(request));
    ASSERT_TRUE(stream->WritesDone());
    uint64_t received = 0;
    v1::TransposeResponse response;
    while (stream->Read(&response)) {
      received += response.data().size();
      absl::SleepFor(absl::Milliseconds(400));
    }
    EXPECT_TRUE(stream->Finish().ok());
    EXPECT_EQ(received, 4 * kMiB);
  }

  EXPECT_TRUE(Transpose(*client, 4096, 4096).ok());
}

// A trickle of messages too small to be progress (a byte each, as a slowloris
// client keeps a declared matrix's admission) does not keep a stream alive:
// progress is 64 KiB of the matrix, or its last byte. Nor do empty messages
// after the upload, from a client that does not read its result.
TEST_F(ReliabilityTest, ATrickleOfBytesDoesNotKeepAStreamAlive) {
  auto server = Start({"--stream_idle_seconds=1"});
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  auto stub = v1::TransposeService::NewStub(client->channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(40));
  const absl::Time start = absl::Now();
  std::unique_ptr<Stream> stream = stub->TransposeStream(&context);
  ASSERT_TRUE(stream->Write(Header(1536, 1024)));
  ASSERT_EQ(AwaitGauge(*server, "transpose_admitted_bytes", 6.0 * kMiB),
            6.0 * kMiB);
  // A byte every 100 ms, until the server has ended the call (or 10 s pass).
  v1::TransposeRequest byte;
  byte.set_data(std::string(1, '\1'));
  while (absl::Now() - start < absl::Seconds(10) &&
         Gauge(*server, kDeadlines) < 1 && stream->Write(byte)) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  const absl::Duration lasted = absl::Now() - start;
  v1::TransposeResponse response;
  EXPECT_FALSE(stream->Read(&response));
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("less than 64 KiB"));
  EXPECT_GE(lasted, absl::Milliseconds(900));
  EXPECT_LT(lasted, absl::Seconds(5));
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_bytes", 0), 0);
  EXPECT_EQ(AwaitGauge(*server, kDeadlines, 1), 1);

  // The whole 64 MiB sent, the result not read, an empty message every
  // 100 ms.
  grpc::ClientContext unread;
  unread.set_deadline(std::chrono::system_clock::now() +
                      std::chrono::seconds(40));
  stream = stub->TransposeStream(&unread);
  v1::TransposeRequest request = Header(4096, 4096);
  for (int i = 0; i < 64; ++i) {
    request.set_data(std::string(kMiB, '\3'));
    ASSERT_TRUE(stream->Write(request));
    request.Clear();
  }
  const absl::Time uploaded = absl::Now();
  const v1::TransposeRequest empty;
  while (absl::Now() - uploaded < absl::Seconds(15) &&
         Gauge(*server, kDeadlines) < 2 && stream->Write(empty)) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  // Ended by the server, not by this loop's 15 s.
  EXPECT_LT(absl::Now() - uploaded, absl::Seconds(13));
  EXPECT_EQ(AwaitGauge(*server, kDeadlines, 2), 2);
  EXPECT_EQ(
      AwaitGauge(*server, "transpose_admitted_bytes", 0, absl::Seconds(10)), 0);
  unread.TryCancel();
  while (stream->Read(&response)) {
  }
  stream->Finish();
}

// A client that reads its whole result but never half-closes: its call cannot
// end OK (more data could follow), but its job's buffers and admission go back
// as soon as the result is out, long before the idle limit ends the call.
TEST_F(ReliabilityTest, AResultWithoutHalfCloseGivesBackItsAdmissionAtOnce) {
  auto server = Start({"--stream_idle_seconds=3"});
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  auto stub = v1::TransposeService::NewStub(client->channel());
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(40));
    std::unique_ptr<Stream> stream = stub->TransposeStream(&context);
    v1::TransposeRequest request = Header(1024, 1024);
    request.set_data(std::string(4 * kMiB, '\7'));
    ASSERT_TRUE(stream->Write(request));
    uint64_t received = 0;
    v1::TransposeResponse response;
    do {
      ASSERT_TRUE(stream->Read(&response));
      received += response.data().size();
    } while (!response.has_stats());
    EXPECT_EQ(received, 4 * kMiB);
    EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_bytes", 0), 0);
    // Not yet counted: the call is still open.
    EXPECT_EQ(Gauge(*server, kDeadlines), 0);
    EXPECT_FALSE(stream->Read(&response));
    const grpc::Status status = stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_THAT(status.error_message(), HasSubstr("did not half-close"));
    EXPECT_EQ(AwaitGauge(*server, kDeadlines, 1), 1);
  }
  EXPECT_TRUE(Transpose(*client, 64, 64).ok());
}

// The client library retries a refusal that may pass later (the server was
// busy and said to retry), on the unary and the streaming path, and not one
// that will not (a matrix over the server's limit).
TEST_F(ReliabilityTest, ClientRetriesABusyServerButNotAMatrixOverTheLimit) {
  auto server = Start({"--max_inflight_requests=1",
                       absl::StrCat("--max_matrix_bytes=", 4 * kMiB)});
  ASSERT_NE(server, nullptr);
  auto once = Connect(*server);
  auto retrying = Connect(*server, /*max_attempts=*/8);
  auto stub = v1::TransposeService::NewStub(once->channel());
  auto refusals = [&](const std::string& method) {
    return Gauge(*server,
                 "transpose_requests_total{code=\"RESOURCE_EXHAUSTED\","
                 "method=\"" +
                     method + "\"}");
  };
  // Holds the one request slot with an upload stalled after its header, lets
  // `call` start, and frees the slot once the server has refused `method`
  // once more: a client that does not retry has failed by then.
  auto while_busy = [&](const std::string& method, auto call) {
    // The last round's held stream gives its slot back after its client has
    // moved on: until it has, this round's stream would be refused instead
    // of holding the slot.
    EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_requests", 0), 0);
    grpc::ClientContext held;
    std::unique_ptr<Stream> stream = stub->TransposeStream(&held);
    EXPECT_TRUE(stream->Write(Header(1024, 256)));
    EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_requests", 1), 1);
    const double before = refusals(method);
    std::thread release([&] {
      const absl::Time give_up = absl::Now() + absl::Seconds(10);
      while (refusals(method) <= before && absl::Now() < give_up) {
        absl::SleepFor(absl::Milliseconds(5));
      }
      held.TryCancel();
    });
    const absl::Status status = call();
    release.join();
    stream->Finish();
    EXPECT_GT(refusals(method), before) << "never refused";
    return status;
  };

  const absl::Status busy =
      while_busy("Transpose", [&] { return Transpose(*once, 8, 8); });
  EXPECT_EQ(busy.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsRetryable(busy)) << busy;
  EXPECT_TRUE(
      while_busy("Transpose", [&] { return Transpose(*retrying, 8, 8); }).ok());
  // 2 MiB: past the unary limit, so it streams. Its progress comes from the
  // attempt that got through, the first having been refused.
  std::vector<TransferProgress> progress;
  CallOptions watched;
  watched.on_progress = [&progress](const TransferProgress& p) {
    progress.push_back(p);
  };
  EXPECT_TRUE(while_busy("TransposeStream", [&] {
                return Transpose(*retrying, 2048, 256, watched);
              }).ok());
  ASSERT_FALSE(progress.empty());
  EXPECT_GE(progress.back().attempt, 2);
  EXPECT_EQ(progress.back().received_bytes, progress.back().total_bytes);

  // 8 MiB against a 4 MiB limit: one refusal, however many attempts allowed.
  const double streams_refused = refusals("TransposeStream");
  const absl::Status over = Transpose(*retrying, 2048, 1024);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(IsRetryable(over)) << over;
  EXPECT_EQ(refusals("TransposeStream"), streams_refused + 1);
}

// With ClientOptions::wait_for_ready, a call made while the server restarts
// waits for it, within its deadline, and gets its result from the server that
// comes back on the same address; without, the call spends its attempts while
// nothing listens and ends UNAVAILABLE.
TEST_F(ReliabilityTest, WaitForReadyCallsRideOutARestart) {
  auto first = Start({"--unready_seconds=0"});
  ASSERT_NE(first, nullptr);
  const std::string address = first->address();
  ClientOptions options;
  options.target = address;
  options.default_timeout = absl::Seconds(60);
  auto failing_fast = *Client::Create(options);
  options.wait_for_ready = true;
  auto waiting = *Client::Create(options);
  EXPECT_TRUE(Transpose(*waiting, 8, 8).ok());
  EXPECT_TRUE(Transpose(*failing_fast, 8, 8).ok());
  ASSERT_EQ(first->Stop(SIGTERM), 0);
  first.reset();

  const absl::Time start = absl::Now();
  const absl::Status unavailable = Transpose(*failing_fast, 8, 8);
  EXPECT_EQ(unavailable.code(), absl::StatusCode::kUnavailable) << unavailable;
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));

  std::atomic<bool> returned{false};
  absl::Status waited = absl::UnknownError("not run");
  std::thread call([&] {
    waited = Transpose(*waiting, 300, 200);
    returned = true;
  });
  // Longer than the four attempts of a call that does not wait take.
  absl::SleepFor(absl::Seconds(3));
  EXPECT_FALSE(returned) << waited;
  auto second = Start({"--unready_seconds=0", "--address=" + address});
  call.join();
  ASSERT_NE(second, nullptr);
  EXPECT_TRUE(waited.ok()) << waited;
  // Served by the server that came back, not by another on the freed port.
  EXPECT_EQ(
      second->AwaitMetric(
          "transpose_requests_total{code=\"OK\",method=\"Transpose\"}", 1),
      1);
}

// Idle clients answer a GOAWAY late (gRPC polls an idle connection every 5 s,
// one after another), so once every call is done the drain does not wait for
// them: with three idle connections from this process it took 15 s.
TEST_F(ReliabilityTest, ADrainDoesNotWaitForIdleConnections) {
  auto server = Start({"--unready_seconds=0"});
  ASSERT_NE(server, nullptr);
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(Connect(*server));
    EXPECT_TRUE(Transpose(*clients.back(), 8, 8).ok());
  }
  const absl::Time start = absl::Now();
  EXPECT_EQ(server->Stop(SIGTERM), 0);
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));
}

// A caller ends its own calls through a CallCanceller: cancelled from its
// progress callback mid-upload, a call ends CANCELLED and the server gives
// back what it held; a cancelled canceller ends later calls before they send
// anything; cancelled from another thread while the client waits to retry a
// busy server, the call ends then, not when the wait is over.
TEST_F(ReliabilityTest, ACallerCancelsMidUploadAndBetweenAttempts) {
  auto server = Start({"--max_inflight_requests=1"});
  ASSERT_NE(server, nullptr);
  ClientOptions options;
  options.target = server->address();
  options.default_timeout = absl::Minutes(5);
  options.max_attempts = 8;
  // A wait of 30-60 s: one that Cancel does not cut short fails the test.
  options.initial_backoff = absl::Seconds(60);
  options.max_backoff = absl::Seconds(60);
  std::unique_ptr<Client> client = *Client::Create(options);

  // 16 MiB: streamed in 1 MiB chunks, cancelled once 2 MiB are sent.
  const MatrixShape shape{1, 2048, 2048};
  const std::vector<uint8_t> data(16 * kMiB, 5);
  CallCanceller canceller;
  uint64_t most_sent = 0;
  CallOptions call;
  call.canceller = &canceller;
  call.on_progress = [&](const TransferProgress& progress) {
    most_sent = std::max(most_sent, progress.sent_bytes);
    if (progress.sent_bytes >= 2 * kMiB) canceller.Cancel();
  };
  absl::Status status =
      client->Transpose({DataType::kFloat32, shape, data}, call).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_THAT(status.message(), HasSubstr("cancelled by its caller"));
  EXPECT_EQ(most_sent, 2 * kMiB);
  EXPECT_EQ(AwaitGauge(*server,
                       "transpose_requests_total{code=\"CANCELLED\","
                       "method=\"TransposeStream\"}",
                       1),
            1);
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_bytes", 0), 0);
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_requests", 0), 0);

  // A cancelled canceller ends the next call before it sends anything, even
  // with input that would be refused.
  bool progressed = false;
  call.on_progress = [&](const TransferProgress&) { progressed = true; };
  status = client->Transpose({DataType::kFloat32, shape, data}, call).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_FALSE(progressed);
  status =
      client->Transpose({DataType::kFloat32, {1, 3, 3}, data}, call).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  // The same client, without the canceller, carries on; by the time it has
  // its result, a call the cancelled canceller had let start would have been
  // counted.
  EXPECT_TRUE(client->Transpose({DataType::kFloat32, shape, data}).ok());
  EXPECT_EQ(Gauge(*server,
                  "transpose_requests_total{code=\"CANCELLED\","
                  "method=\"TransposeStream\"}"),
            1);

  // An upload stalled after its header holds the one request slot, so the
  // call below is refused as busy and waits to try again. The call above
  // gives its slot back just after its client has the result: until it has,
  // the upload would be refused instead.
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_requests", 0), 0);
  auto stub = v1::TransposeService::NewStub(client->channel());
  grpc::ClientContext held;
  std::unique_ptr<Stream> stream = stub->TransposeStream(&held);
  ASSERT_TRUE(stream->Write(Header(1024, 256)));
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_requests", 1), 1);
  const std::string refused =
      "transpose_requests_total{code=\"RESOURCE_EXHAUSTED\","
      "method=\"Transpose\"}";
  CallCanceller waiting;
  std::thread cancel([&] {
    // The server counts a refusal just after sending it; by half a second
    // later its client is in its 30-60 s wait.
    AwaitGauge(*server, refused, 1, absl::Seconds(20));
    absl::SleepFor(absl::Milliseconds(500));
    waiting.Cancel();
  });
  CallOptions retried;
  retried.canceller = &waiting;
  const absl::Time asked = absl::Now();
  status = Transpose(*client, 8, 8, retried);
  const absl::Duration took = absl::Now() - asked;
  cancel.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_EQ(Gauge(*server, refused), 1);  // One attempt, no more.
  EXPECT_LT(took, absl::Seconds(20));
  held.TryCancel();
  stream->Finish();
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_requests", 0), 0);
}

// Uploads cut off by their callers, or by their deadlines, are counted as
// such, never as malformed requests: their last read can fail before gRPC
// marks the call cancelled, when the upload looks merely short.
TEST_F(ReliabilityTest, UploadsCutOffMidwayAreCountedByWhyTheyEnded) {
  auto server = Start({});
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  auto stub = v1::TransposeService::NewStub(client->channel());
  constexpr int kCancelled = 150;
  constexpr int kTimedOut = 30;
  for (int i = 0; i < kCancelled + kTimedOut; ++i) {
    grpc::ClientContext context;
    if (i >= kCancelled) {
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::milliseconds(300));
    }
    std::unique_ptr<Stream> stream = stub->TransposeStream(&context);
    v1::TransposeRequest first = Header(256, 256);  // 256 KiB, 64 KiB sent.
    first.set_data(std::string(64 << 10, '\1'));
    ASSERT_TRUE(stream->Write(first));
    if (i < kCancelled) context.TryCancel();
    EXPECT_THAT(stream->Finish().error_code(),
                AnyOf(grpc::StatusCode::CANCELLED,
                      grpc::StatusCode::DEADLINE_EXCEEDED));
  }
  const auto count = [](absl::string_view code) {
    return absl::StrCat("transpose_requests_total{code=\"", code,
                        "\",method=\"TransposeStream\"}");
  };
  EXPECT_EQ(AwaitGauge(*server, count("CANCELLED"), kCancelled), kCancelled);
  EXPECT_EQ(AwaitGauge(*server, count("DEADLINE_EXCEEDED"), kTimedOut),
            kTimedOut);
  EXPECT_EQ(server->Metric(count("INVALID_ARGUMENT")).value_or(0), 0);
  EXPECT_EQ(AwaitGauge(*server, "transpose_inflight_requests", 0), 0);

  // Streams whose first message the transport quota cuts off: their reads
  // end before any header arrived.
  auto quota_server =
      Start({"--max_message_bytes=1048576",
             absl::StrCat("--max_inflight_bytes=", 32 * kMiB),
             absl::StrCat("--max_transport_bytes=", 64 * kMiB)});
  ASSERT_NE(quota_server, nullptr);
  auto quota_client = Connect(*quota_server);
  auto quota_stub = v1::TransposeService::NewStub(quota_client->channel());
  constexpr int kReset = 4;
  for (int i = 0; i < kReset; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(60));
    std::unique_ptr<Stream> stream = quota_stub->TransposeStream(&context);
    v1::TransposeRequest first = Header(8192, 8192);
    first.mutable_data()->resize(256 * kMiB, '\1');
    stream->Write(first);
    EXPECT_EQ(stream->Finish().error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  EXPECT_EQ(AwaitGauge(*quota_server, count("CANCELLED"), kReset), kReset);
  EXPECT_EQ(AwaitGauge(*quota_server, "transpose_inflight_requests", 0), 0);
  EXPECT_EQ(quota_server->Metric(count("INVALID_ARGUMENT")).value_or(0), 0);
}

// A client whose connection goes silent mid-upload, without closing (its host
// vanished, the network was cut), is noticed by keepalive: its call is
// cancelled and its admission given back long before its deadline.
TEST_F(ReliabilityTest, ASilentConnectionIsClosedByKeepalive) {
  auto server =
      Start({"--keepalive_seconds=0.5", "--keepalive_timeout_seconds=0.5"});
  ASSERT_NE(server, nullptr);
  FreezableRelay relay(server->port());
  ClientOptions options;
  options.target = relay.address();
  auto client = *Client::Create(options);
  auto stub = v1::TransposeService::NewStub(client->channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(120));
  std::unique_ptr<Stream> stream = stub->TransposeStream(&context);
  v1::TransposeRequest first = Header(1536, 1024);
  first.set_data(std::string(kMiB, '\1'));
  ASSERT_TRUE(stream->Write(first));
  ASSERT_EQ(AwaitGauge(*server, "transpose_admitted_bytes", 6.0 * kMiB),
            6.0 * kMiB);
  relay.Freeze();
  EXPECT_EQ(
      AwaitGauge(*server, "transpose_admitted_bytes", 0, absl::Seconds(15)), 0);
  EXPECT_EQ(AwaitGauge(*server, "transpose_inflight_requests", 0), 0);
  EXPECT_EQ(AwaitGauge(*server,
                       "transpose_requests_total{code=\"CANCELLED\","
                       "method=\"TransposeStream\"}",
                       1),
            1);
  context.TryCancel();
}

// The other way round: a server (or the network to it) that goes silent
// without closing the connection is noticed by the client's keepalive, mid-
// upload or waiting for the result, and the call ends UNAVAILABLE (which the
// client would send again) long before its deadline.
TEST_F(ReliabilityTest, AClientNoticesASilentServerByKeepalive) {
  auto server = Start({});
  ASSERT_NE(server, nullptr);
  const std::vector<uint8_t> data(16 * kMiB, 5);
  // Silences the server once `sent` bytes are uploaded: nothing moves either
  // way, or (`answers_only`) the server's answers stop, as when the route back
  // is cut.
  const auto call = [&](uint64_t sent, bool answers_only) {
    FreezableRelay relay(server->port());
    ClientOptions options;
    options.target = relay.address();
    options.keepalive_time = absl::Seconds(10);  // The least a client may ask.
    options.keepalive_timeout = absl::Seconds(1);
    options.default_timeout = absl::Seconds(90);
    options.max_attempts = 1;
    auto client = *Client::Create(options);
    CallOptions silenced;
    silenced.on_progress = [&](const TransferProgress& progress) {
      if (progress.sent_bytes < sent) return;
      if (answers_only) {
        relay.LimitAnswers(0);
      } else {
        relay.Freeze();
      }
    };
    const absl::Time start = absl::Now();
    const absl::Status status =
        client->Transpose({DataType::kFloat32, {1, 2048, 2048}, data}, silenced)
            .status();
    return std::pair{status, absl::Now() - start};
  };
  for (const auto& [sent, answers_only] :
       {std::pair{2 * kMiB, false}, std::pair{data.size(), true}}) {
    const auto [status, took] = call(sent, answers_only);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable)
        << status << " silenced after " << sent;
    EXPECT_LT(took, absl::Seconds(30)) << status << " silenced after " << sent;
  }
}

// A call out of time says whether it ever reached the server. Through a relay
// frozen before its first byte (as a process that never speaks HTTP/2 looks,
// or an address whose TCP handshake goes unanswered), no connection attempt
// finishes: the call says so, and a longer deadline is not the fix. Through
// one frozen after a call has gone through, the server is reached and slow,
// and the call says nothing of connecting. Every kind of call, with and
// without gRPC's wait_for_ready (health checks never wait for a connection).
TEST_F(ReliabilityTest, ACallOutOfTimeSaysWhetherItReachedTheServer) {
  auto server = Start({});
  ASSERT_NE(server, nullptr);
  for (const bool reached : {false, true}) {
    for (const bool wait_for_ready : {false, true}) {
      FreezableRelay relay(server->port());
      ClientOptions options;
      options.target = relay.address();
      options.wait_for_ready = wait_for_ready;
      options.max_attempts = 1;
      options.connections = 1;
      auto client = *Client::Create(options);
      if (reached) {
        ASSERT_TRUE(client->GetServerInfo(absl::Seconds(30)).ok());
      }
      relay.Freeze();
      const absl::Duration timeout = absl::Seconds(1);
      CallOptions call;
      call.timeout = timeout;
      // Unary at the client's default limit, or streamed.
      const std::vector<uint8_t> data(kMiB, 5);
      const MatrixView matrix{DataType::kFloat32, {1, 256, 1024}, data};
      CallOptions streamed = call;
      streamed.force_stream = true;
      const std::pair<const char*, absl::Status> calls[] = {
          {"info", client->GetServerInfo(timeout).status()},
          {"health", client->CheckHealth("", timeout).status()},
          {"unary", client->Transpose(matrix, call).status()},
          {"stream", client->Transpose(matrix, streamed).status()},
      };
      for (const auto& [kind, status] : calls) {
        SCOPED_TRACE(absl::StrCat(kind, reached ? ", reached" : ", unreached",
                                  wait_for_ready ? ", wait_for_ready" : ""));
        EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
        EXPECT_EQ(MadeNoConnection(status), !reached) << status;
        const std::string note =
            absl::StrCat("no connection to ", relay.address(), " was made");
        if (reached) {
          EXPECT_THAT(status.message(), Not(HasSubstr(note)));
        } else if (wait_for_ready && absl::string_view(kind) != "health") {
          EXPECT_THAT(status.message(),
                      HasSubstr(absl::StrCat(note, " (wait_for_ready)")));
        } else {
          EXPECT_THAT(status.message(),
                      HasSubstr(absl::StrCat(note, ": still connecting")));
        }
      }
    }
  }

  // A stream that reached the server on a connection the server then retired
  // (a GOAWAY at its age), from a client whose channel was not ready as the
  // call began nor as it ended (the relay refuses its reconnections), is not
  // marked either: its headers went out.
  auto aging = Start({"--max_connection_age_seconds=1"});
  ASSERT_NE(aging, nullptr);
  FreezableRelay relay(aging->port());
  ClientOptions options;
  options.target = relay.address();
  options.max_attempts = 1;
  options.connections = 1;
  auto client = *Client::Create(options);
  const auto ready = [&] {
    return client->channel()->GetState(/*try_to_connect=*/false) ==
           GRPC_CHANNEL_READY;
  };
  std::optional<absl::Duration> retired_after;
  CallOptions call;
  call.timeout = absl::Seconds(12);
  call.on_progress = [&](const TransferProgress& progress) {
    if (progress.sent_bytes == 0 || retired_after.has_value()) return;
    relay.RefuseNewConnections();
    const absl::Time start = absl::Now();
    while (ready() && absl::Now() - start < absl::Seconds(10)) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    retired_after = absl::Now() - start;
    relay.Freeze();  // The rest of the upload waits out the deadline.
  };
  const std::vector<uint8_t> data(8 * kMiB, 5);
  EXPECT_FALSE(ready());
  const absl::Status status =
      client->Transpose({DataType::kFloat32, {1, 2048, 1024}, data}, call)
          .status();
  EXPECT_LT(retired_after.value_or(absl::InfiniteDuration()),
            absl::Seconds(10));
  EXPECT_FALSE(ready());
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_FALSE(MadeNoConnection(status)) << status;
}

// A call out of time while queued behind the server's limit on concurrent
// streams had a connection: it is not marked as one that made none, and so
// keeps the advice of a longer deadline. Streams learn of their connection
// when their headers go out, which here they never do.
TEST_F(ReliabilityTest, ACallQueuedForAStreamSlotIsNotTakenForUnconnected) {
  auto server = Start({"--max_concurrent_streams=1"});
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  // The connection is up and its settings are in before the slot is taken.
  ASSERT_TRUE(client->GetServerInfo(absl::Seconds(30)).ok());
  auto stub = v1::TransposeService::NewStub(client->channel());
  grpc::ClientContext held;
  std::unique_ptr<Stream> stream = stub->TransposeStream(&held);
  ASSERT_TRUE(stream->Write(Header(64, 64)));
  const std::vector<uint8_t> data(64 * 64 * 4, 5);
  const MatrixView matrix{DataType::kFloat32, {1, 64, 64}, data};
  CallOptions call;
  call.timeout = absl::Seconds(1);
  CallOptions streamed = call;
  streamed.force_stream = true;
  const std::pair<const char*, absl::Status> calls[] = {
      {"unary", client->Transpose(matrix, call).status()},
      {"stream", client->Transpose(matrix, streamed).status()},
  };
  for (const auto& [kind, status] : calls) {
    SCOPED_TRACE(kind);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_FALSE(MadeNoConnection(status)) << status;
    EXPECT_THAT(status.message(), Not(HasSubstr("no connection to")));
  }
  held.TryCancel();
  // With the slot given back, the same client's calls go through.
  EXPECT_TRUE(client->Transpose(matrix, streamed).ok());
}

// A client that keeps its idle connection alive with pings (grpc-go's
// PermitWithoutStream, grpcio's keepalive_permit_without_calls) at the server's
// least interval, 5 s, keeps it: gRPC's default would send it away with
// "too_many_pings".
TEST_F(ReliabilityTest, AnIdleClientThatPingsKeepsItsConnection) {
  auto server = Start({});
  ASSERT_NE(server, nullptr);
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 5100);
  // Long: a slow answer on a loaded machine is not what this is about.
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Only the keepalive pings count, so that the server's ping policy sees
  // the same sequence every run.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      server->address(), grpc::InsecureChannelCredentials(), args);
  auto stub = v1::TransposeService::NewStub(channel);
  {
    grpc::ClientContext context;
    v1::TransposeRequest request = Header(8, 8);
    request.set_data(std::string(8 * 8 * 4, '\1'));
    v1::TransposeResponse response;
    ASSERT_TRUE(stub->Transpose(&context, request, &response).ok());
  }
  // Four pings, each past the server's least interval: gRPC's default lets
  // the first after a call go, and sends the client away at the third strike,
  // about 20.4 s from here. Waiting on the channel's state polls the
  // connection, as an application's event loop would: the ping's answer is
  // read at once, and a GOAWAY would show.
  EXPECT_FALSE(channel->WaitForStateChange(
      GRPC_CHANNEL_READY,
      std::chrono::system_clock::now() + std::chrono::seconds(25)));
  EXPECT_EQ(channel->GetState(/*try_to_connect=*/false), GRPC_CHANNEL_READY);
}

// A unary reply the client does not read yet keeps its job, and so its
// admission, until it is sent: the budget bounds the replies in flight too.
// The call stays in flight until then, and a reply that never arrives is not
// counted OK.
TEST_F(ReliabilityTest, AnUnreadUnaryReplyKeepsItsAdmissionUntilSent) {
  auto server = Start({});
  ASSERT_NE(server, nullptr);
  FreezableRelay relay(server->port());
  // Room for the connection's settings and the upload's window updates, not
  // for the 32 MiB reply.
  relay.LimitAnswers(1 * kMiB);
  constexpr uint64_t kBytes = 32 * kMiB;
  ClientOptions options;
  options.target = relay.address();
  auto client = *Client::Create(options);
  auto stub = v1::TransposeService::NewStub(client->channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(60));
  v1::TransposeRequest request = Header(4096, 2048);
  request.set_data(std::string(kBytes, '\2'));
  grpc::Status status;
  std::thread call([&] {
    v1::TransposeResponse response;
    status = stub->Transpose(&context, request, &response);
  });
  // The job has run (its kernel read and wrote the matrix)...
  EXPECT_EQ(AwaitGauge(
                *server,
                "transpose_kernel_bytes_total{backend=\"" +
                    ServerProcess::BackendFromEnvironment() +
                    (ServerProcess::BackendFromEnvironment() == "cuda" ? ":0\"}"
                                                                       : "\"}"),
                2.0 * kBytes, absl::Seconds(30)),
            2.0 * kBytes);
  // ...but its reply is not out: its bytes are still the job's, counted, and
  // the call is in flight.
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(Gauge(*server, "transpose_admitted_bytes"), kBytes);
  EXPECT_EQ(Gauge(*server, "transpose_inflight_requests"), 1);
  EXPECT_EQ(Gauge(*server,
                  "transpose_requests_total{code=\"OK\","
                  "method=\"Transpose\"}"),
            0);
  // Bytes of it already queued on the connection must go before the job can:
  // let them, once the client has given up.
  context.TryCancel();
  call.join();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED);
  relay.LimitAnswers(UINT64_MAX);
  constexpr absl::Duration kDrained = absl::Seconds(20);
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_bytes", 0, kDrained), 0);
  EXPECT_EQ(AwaitGauge(*server, "transpose_inflight_requests", 0, kDrained), 0);
  EXPECT_EQ(AwaitGauge(*server,
                       "transpose_requests_total{code=\"CANCELLED\","
                       "method=\"Transpose\"}",
                       1, kDrained),
            1);
}

// A client killed in the middle of a 1 GiB upload leaves nothing behind on the
// server.
TEST_F(ReliabilityTest, AClientThatDiesMidUploadLeavesNothingBehind) {
  auto server = Start({"--max_matrix_bytes=2147483648",
                       absl::StrCat("--max_inflight_bytes=", 1100 * kMiB)});
  ASSERT_NE(server, nullptr);
  char path[] = "/tmp/transpose-upload-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 1 << 30), 0);  // 1 GiB of zeros, sparse.
  close(fd);
  const std::string transpose_cli = ServerProcess::CliFromEnvironment();
  const pid_t child = fork();
  if (child == 0) {
    const std::string server_flag =
        absl::StrCat("--server=", server->address());
    const std::string in_flag = absl::StrCat("--in=", path);
    execl(transpose_cli.c_str(), transpose_cli.c_str(), server_flag.c_str(),
          "transpose", in_flag.c_str(), "--out=/dev/null", "--rows=32768",
          "--cols=32768", "--dtype=uint8", "--progress=false",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  // Kill it once the server holds the upload.
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_bytes", 1 << 30,
                       absl::Seconds(30)),
            1 << 30);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  unlink(path);
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_bytes", 0), 0);
  EXPECT_EQ(AwaitGauge(*server, "transpose_inflight_requests", 0), 0);
  auto client = Connect(*server);
  EXPECT_TRUE(Transpose(*client, 64, 64).ok());
}

// A unary request shorter than its header says is refused before a job is
// made for it: it takes no admission and no buffers. Before, 4 bytes declaring
// 4 GiB were admitted and given 4 GiB of buffers (pinned, on a GPU), which
// stayed in the pool, and a few such calls refused real ones as busy.
TEST_F(ReliabilityTest, AShortUnaryRequestIsRefusedBeforeItTakesMemory) {
  auto server = Start({});
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  ASSERT_TRUE(Transpose(*client, 64, 64).ok());
  const std::string backend = ServerProcess::BackendFromEnvironment();
  const std::string memory_used =
      "transpose_device_memory_used_bytes{backend=\"" + backend +
      (backend == "cuda" ? ":0\"}" : "\"}");
  const double memory_before = Gauge(*server, memory_used);
  ASSERT_GE(memory_before, 0);
  auto stub = v1::TransposeService::NewStub(client->channel());
  v1::TransposeRequest huge = Header(32768, 32768);  // Declares 4 GiB.
  huge.set_data("abcd");
  v1::TransposeRequest nearly = Header(4096, 4096);  // Declares 64 MiB.
  nearly.set_data(std::string(60 * kMiB, '\1'));
  for (const v1::TransposeRequest* request : {&huge, &nearly, &huge, &nearly}) {
    grpc::ClientContext context;
    v1::TransposeResponse response;
    const grpc::Status status = stub->Transpose(&context, *request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_THAT(status.error_message(), HasSubstr("shorter than declared"));
  }
  EXPECT_EQ(Gauge(*server, memory_used), memory_before);
  EXPECT_EQ(AwaitGauge(*server, "transpose_admitted_bytes", 0), 0);
  EXPECT_TRUE(Transpose(*client, 4096, 4096).ok());
}

// A machine with NVIDIA GPUs that this server cannot use (built without CUDA,
// or CUDA failing) serves on the CPU, and says why at start rather than
// leaving an operator to find the GPU idle; GPUs hidden on purpose are not
// mentioned.
TEST_F(ReliabilityTest, AutoSaysWhyItServesOnTheCpuBesideGpus) {
  char dir[] = "/tmp/transpose-devices-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string devices = dir;
  bool gpus_used = false;
  const auto start_logs = [this, &devices, &gpus_used] {
    const ServerLog server_log;
    auto server = Start({"--backend=auto", "--log_level=warning",
                         "--testing_nvidia_device_dir=" + devices},
                        server_log.path());
    EXPECT_NE(server, nullptr);
    std::string log = server_log.Read();
    if (server != nullptr) {
      absl::StatusOr<v1::ServerInfo> info = Connect(*server)->GetServerInfo();
      EXPECT_TRUE(info.ok()) << info.status();
      gpus_used = info.ok() && info->backends(0).name() != "cpu";
      EXPECT_EQ(server->Stop(SIGTERM), 0);
    }
    return log;
  };
  EXPECT_THAT(start_logs(), Not(HasSubstr("NVIDIA")));
  if (gpus_used) GTEST_SKIP() << "this machine's GPUs are used";
  // Two GPUs' device files, beside the driver's others.
  const std::vector<std::string> device_files = {"nvidia0", "nvidia1",
                                                 "nvidiactl", "nvidia-uvm"};
  for (const std::string& file : device_files) {
    const std::string path = devices + "/" + file;
    const int fd = open(path.c_str(), O_CREAT | O_WRONLY, 0600);
    ASSERT_GE(fd, 0) << path;
    close(fd);
  }
  const std::string log = start_logs();
  EXPECT_THAT(log, HasSubstr("WARNING this machine has 2 NVIDIA GPUs, but "));
  EXPECT_THAT(log, HasSubstr(": serving on the CPU"));
  // This build's reason: none compiled in, or CUDA's own error.
  EXPECT_THAT(log, AnyOf(HasSubstr("built without CUDA"),
                         HasSubstr("CUDA sees none (cudaGetDeviceCount: ")));
  // Hidden on purpose: nothing to say.
  for (const char* hidden : {"", "-1"}) {
    setenv("CUDA_VISIBLE_DEVICES", hidden, 1);
    EXPECT_THAT(start_logs(), Not(HasSubstr("NVIDIA"))) << hidden;
    unsetenv("CUDA_VISIBLE_DEVICES");
  }
  for (const std::string& file : device_files) {
    unlink((devices + "/" + file).c_str());
  }
  rmdir(dir);
}

// Values that cannot work stop the server before it listens, with a message
// that names the flag (a zero response chunk used to send empty messages until
// the client's deadline).
TEST_F(ReliabilityTest, NonsenseFlagValuesAreRefusedAtStartUp) {
  for (const std::string flag : {"--response_chunk_bytes=0",
                                 "--max_message_bytes=0",
                                 "--max_message_bytes=1048575",
                                 "--max_message_bytes=4294967296",
                                 "--max_matrix_bytes=0",
                                 "--streams_per_device=-1",
                                 "--cpu_threads=-2",
                                 "--max_inflight_requests=-1",
                                 "--drain_seconds=-1",
                                 "--unready_seconds=nan",
                                 "--backend=gpu",
                                 "--max_transport_bytes=1048576",
                                 "--stream_idle_seconds=0.5",
                                 "--gpu_hang_seconds=0.5",
                                 "--max_connection_age_seconds=0.5",
                                 "--tls_cert=cert.pem",
                                 "--tls_key=key.pem",
                                 "--tls_client_ca=ca.pem",
                                 "--streams_per_device=100000",
                                 "--cpu_threads=5000",
                                 "--address=127.0.0.1:65536",
                                 "--address=127.0.0.1",
                                 "--metrics_address=:0",
                                 "--metrics_address=[::1]:0",
                                 "--metrics_address=0,127.0.0.1:0",
                                 "--log_level=loud",
                                 "--testing_cuda_unusable_device=-2",
                                 "stray"}) {
    const auto [code, text] =
        ServerProcess::RunUntilExit({"--backend=cpu", flag});
    EXPECT_EQ(code, 2) << flag << ": " << text;
    EXPECT_THAT(text, HasSubstr(flag.substr(0, flag.find('=') + 1)));
    EXPECT_THAT(text, HasSubstr("expected"));
    // --only_check_args refuses the same values, as a deploy step checking a
    // server's flags expects (it used to check only that they parse, and then
    // took a stray word).
    const auto [check_code, check_text] = ServerProcess::RunUntilExit(
        {"--backend=cpu", "--only_check_args", flag});
    EXPECT_EQ(check_code, 2) << flag << ": " << check_text;
    EXPECT_THAT(check_text, HasSubstr(flag.substr(0, flag.find('=') + 1)));
  }
  EXPECT_EQ(
      ServerProcess::RunUntilExit({"--backend=cpu", "--only_check_args"}).code,
      0);
  // Values that cannot work together: no admission budget but a transport
  // quota below one message (no call gets through); a million CPU threads;
  // both listeners on one port.
  for (const std::vector<std::string>& flags :
       std::vector<std::vector<std::string>>{
           {"--max_inflight_bytes=0", "--max_transport_bytes=1048576"},
           {"--streams_per_device=1024", "--cpu_threads=1024"},
           {"--address=127.0.0.1:50051", "--metrics_address=0.0.0.0:50051"}}) {
    std::vector<std::string> args = {"--backend=cpu"};
    args.insert(args.end(), flags.begin(), flags.end());
    const auto [code, text] = ServerProcess::RunUntilExit(args);
    EXPECT_EQ(code, 2) << flags[1] << ": " << text;
    EXPECT_THAT(text, HasSubstr(flags[1]));
    EXPECT_THAT(text, HasSubstr("expected"));
  }
  // The boundary values still start.
  EXPECT_NE(Start({"--response_chunk_bytes=1"}), nullptr);
  EXPECT_NE(Start({"--max_inflight_bytes=0",
                   absl::StrCat("--max_transport_bytes=", 64 * kMiB)}),
            nullptr);
  // The smallest message limit still takes the client library's largest
  // messages: a unary 1 MiB matrix and a stream of 1 MiB chunks.
  auto server = Start({"--max_message_bytes=1048576"});
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  EXPECT_TRUE(Transpose(*client, 512, 512).ok());
  EXPECT_TRUE(Transpose(*client, 1024, 1024).ok());
}

TEST_F(ReliabilityTest,
       DrainTurnsUnreadyRefusesNewCallsAndFinishesRunningOnes) {
  // Room for a loaded machine: health must be seen NOT_SERVING before the
  // unready period (5 s) ends, and the GOAWAY within 10 s.
  auto server = Start({"--drain_seconds=20", "--unready_seconds=5"});
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  auto stub = v1::TransposeService::NewStub(client->channel());

  // A running upload: 4 MiB, half sent.
  grpc::ClientContext context;
  std::unique_ptr<Stream> stream = stub->TransposeStream(&context);
  std::vector<uint8_t> data(4 * kMiB);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<uint8_t>(i * 7);
  v1::TransposeRequest first = Header(1024, 1024);
  first.set_data(data.data(), data.size() / 2);
  ASSERT_TRUE(stream->Write(first));
  ASSERT_EQ(AwaitGauge(*server, "transpose_inflight_requests", 1), 1);

  const absl::Time signalled = absl::Now();
  kill(server->pid(), SIGTERM);
  // Health turns NOT_SERVING while calls are still taken...
  bool unready = false;
  while (!unready && absl::Now() - signalled < absl::Seconds(4.5)) {
    absl::StatusOr<bool> serving = client->CheckHealth("", absl::Seconds(1));
    unready = serving.ok() && !*serving;
  }
  EXPECT_TRUE(unready);
  // ...then the server sends its connections a GOAWAY, so that a client
  // holding one reconnects (elsewhere, behind a Service) while the running
  // call goes on: this client's channel leaves READY.
  grpc_connectivity_state state = client->channel()->GetState(false);
  while (state == GRPC_CHANNEL_READY &&
         absl::Now() - signalled < absl::Seconds(10)) {
    client->channel()->WaitForStateChange(
        state, std::chrono::system_clock::now() + std::chrono::seconds(1));
    state = client->channel()->GetState(false);
  }
  EXPECT_NE(state, GRPC_CHANNEL_READY);
  // New calls are refused, UNAVAILABLE (the listener is closed), which
  // clients retry; not CANCELLED.
  const absl::Status refused = Transpose(*client, 8, 8);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;

  // The running call finishes with the right result.
  v1::TransposeRequest rest;
  rest.set_data(data.data() + data.size() / 2, data.size() / 2);
  ASSERT_TRUE(stream->Write(rest));
  // Half-closed after the result, as the library does: the drain closes the
  // connection as the call ends, which could reset it under a result not
  // read yet (ConnectionsAreReplacedAtTheirMaxAge says more).
  std::string result;
  v1::TransposeResponse response;
  while (!response.has_stats() && stream->Read(&response)) {
    result += response.data();
  }
  stream->WritesDone();
  EXPECT_FALSE(stream->Read(&response));
  const grpc::Status finished = stream->Finish();
  ASSERT_TRUE(finished.ok())
      << finished.error_code() << ": " << finished.error_message();
  ASSERT_EQ(result.size(), data.size());
  const auto* in = reinterpret_cast<const uint32_t*>(data.data());
  const auto* out = reinterpret_cast<const uint32_t*>(result.data());
  for (uint64_t r = 0; r < 1024; r += 37) {
    for (uint64_t c = 0; c < 1024; c += 41)
      ASSERT_EQ(out[c * 1024 + r], in[r * 1024 + c]);
  }
  // And the server exits cleanly, well inside its drain time.
  EXPECT_EQ(server->Stop(0, absl::Seconds(8)), 0);
}

TEST_F(ReliabilityTest, DrainCutsOffCallsThatOutlastIt) {
  const ServerLog server_log;
  auto server =
      Start({"--drain_seconds=1", "--unready_seconds=0", "--log_level=warning"},
            server_log.path());
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  auto stub = v1::TransposeService::NewStub(client->channel());
  grpc::ClientContext context;
  std::unique_ptr<Stream> stream = stub->TransposeStream(&context);
  ASSERT_TRUE(stream->Write(Header(1024, 1024)));  // And never the data.
  ASSERT_EQ(AwaitGauge(*server, "transpose_inflight_requests", 1), 1);
  const absl::Time signalled = absl::Now();
  kill(server->pid(), SIGTERM);
  v1::TransposeResponse response;
  EXPECT_FALSE(stream->Read(&response));
  EXPECT_FALSE(stream->Finish().ok());
  EXPECT_EQ(server->Stop(0, absl::Seconds(10)), 0);
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(5));
  // The log says the drain cut a call off, and counts it as the server's
  // failure, not as a client's cancel.
  const std::string log = server_log.Read();
  EXPECT_THAT(log, HasSubstr("drain: 1 calls still running after 1s are cut "
                             "off (UNAVAILABLE)"));
  EXPECT_THAT(log, HasSubstr("UNAVAILABLE: the server's drain "
                             "(--drain_seconds) ended before the call did"));
  EXPECT_THAT(log, Not(HasSubstr("CANCELLED")));
}

// The drain ends at its deadline even when a connection stops answering
// while its result goes out. gRPC's own shutdown then sometimes waits for the
// connection until its keepalive timeout (20 s), which made a 1 s drain take
// 20 s: in 2 of 3 drains on a busy 2-core machine, in none of 12 on a quiet
// one (it seems to need the server's socket buffer full before the client's
// flow-control window is). So this guards the bound where the wait happens,
// and proves it only there; three drains, to meet it more often.
TEST_F(ReliabilityTest, ADrainEndsOnTimeWhenAConnectionStopsAnswering) {
  // 64 MiB: more of the result than the sockets' buffers hold.
  const std::vector<uint8_t> data(64 * kMiB, 3);
  for (int round = 0; round < 3; ++round) {
    const ServerLog server_log;
    auto server = Start(
        {"--drain_seconds=1", "--unready_seconds=0", "--log_level=warning"},
        server_log.path());
    ASSERT_NE(server, nullptr);
    FreezableRelay relay(server->port());
    ClientOptions options;
    options.target = relay.address();
    options.max_attempts = 1;
    options.keepalive_time = absl::InfiniteDuration();
    auto client = *Client::Create(options);
    CallOptions call;
    Notification frozen;
    bool froze = false;  // On the caller's thread only.
    call.on_progress = [&](const TransferProgress& progress) {
      if (progress.received_bytes > 0 && !froze) {
        relay.Freeze();
        froze = true;
        frozen.Notify();
      }
    };
    CallCanceller canceller;
    call.canceller = &canceller;
    std::thread caller([&] {
      client->Transpose({DataType::kFloat32, {1, 4096, 4096}, data}, call)
          .IgnoreError();
    });
    if (!frozen.WaitForNotificationWithTimeout(absl::Seconds(30))) {
      ADD_FAILURE() << "no result arrived, round " << round;
      canceller.Cancel();
      caller.join();
      return;
    }
    const absl::Time signalled = absl::Now();
    kill(server->pid(), SIGTERM);
    EXPECT_EQ(server->Stop(0, absl::Seconds(30)), 0);
    const absl::Duration took = absl::Now() - signalled;
    EXPECT_LT(took, absl::Seconds(5)) << "round " << round;
    // Past the drain and its second of slack, the log says why.
    if (took > absl::Seconds(2)) {
      EXPECT_THAT(server_log.Read(),
                  HasSubstr("drain: gRPC's shutdown still waits on a "
                            "connection that does not answer"));
    }
    canceller.Cancel();
    caller.join();
  }
}

// Calls that arrive as the drain starts can be caught in the transport's
// shutdown and end CANCELLED; the client library sends them again, so its
// callers see OK or UNAVAILABLE, never a cancel they did not ask for.
TEST_F(ReliabilityTest, CallsRacingTheDrainAreSentAgainNotCancelled) {
  auto server = Start({"--unready_seconds=0", "--drain_seconds=5"});
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server, /*max_attempts=*/4);
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::map<absl::StatusCode, int> codes;
  std::vector<std::thread> callers;
  for (int i = 0; i < 4; ++i) {
    callers.emplace_back([&] {
      while (!stop) {
        const absl::StatusCode code = Transpose(*client, 128, 128).code();
        std::lock_guard<std::mutex> lock(mutex);
        ++codes[code];
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(300));
  kill(server->pid(), SIGTERM);
  EXPECT_EQ(server->Stop(0, absl::Seconds(15)), 0);
  absl::SleepFor(absl::Milliseconds(300));
  stop = true;
  for (std::thread& caller : callers) caller.join();
  EXPECT_TRUE(codes.count(absl::StatusCode::kOk));
  EXPECT_TRUE(codes.count(absl::StatusCode::kUnavailable));
  for (const auto& [code, count] : codes) {
    EXPECT_TRUE(code == absl::StatusCode::kOk ||
                code == absl::StatusCode::kUnavailable)
        << absl::StatusCodeToString(code) << " x" << count;
  }
}

// The local ports of this network namespace's established TCP connections to
// `server_port`: the client ends of the connections to a server (gRPC's
// sockets are IPv6 ones, reaching 127.0.0.1 as ::ffff:127.0.0.1).
std::set<int> ClientPortsTo(int server_port) {
  std::set<int> ports;
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream table(path);
    std::string line;
    std::getline(table, line);  // The column names.
    while (std::getline(table, line)) {
      // "  sl  local_address rem_address   st ...", addresses as HEX:HEXPORT.
      const std::vector<std::string> fields =
          absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (fields.size() < 4 || fields[3] != "01") continue;  // ESTABLISHED.
      const auto port_of = [](const std::string& address) {
        return std::stoi(address.substr(address.find(':') + 1), nullptr, 16);
      };
      if (port_of(fields[2]) == server_port) ports.insert(port_of(fields[1]));
    }
  }
  return ports;
}

// An admission budget below --max_matrix_bytes limits the matrices, and the
// server says so as it starts: every larger request is refused for good.
TEST_F(ReliabilityTest, ABudgetThatLimitsTheMatricesIsWarnedOfAtStart) {
  for (const bool limited : {true, false}) {
    const ServerLog server_log;
    // A 1 GiB budget, whose worst case (about 6 GiB on the CPU) a machine
    // that runs these tests holds: the server lowers a budget it cannot hold,
    // and each host's share with it.
    auto server = Start(
        {"--max_inflight_bytes=1073741824", "--max_matrix_bytes=1073741824",
         limited ? "--max_inflight_bytes_per_peer=1024"
                 : "--max_inflight_bytes_per_peer=1073741824",
         "--log_level=warning", "--unready_seconds=0"},
        server_log.path());
    ASSERT_NE(server, nullptr);
    EXPECT_EQ(server->Stop(SIGTERM), 0);
    const std::string log = server_log.Read();
    if (limited) {
      EXPECT_THAT(log, HasSubstr("matrices are limited to 1024 bytes, the "
                                 "admission budget"));
    } else {
      EXPECT_THAT(log, Not(HasSubstr("matrices are limited")));
    }
  }
}

// A buffer the pool cannot keep is allocated (pinned, on a GPU) and freed with
// every request: a pool too small for the largest matrix the limits admit is
// a misconfiguration worth a line at start, and one that holds it is not.
TEST_F(ReliabilityTest, APoolTooSmallForTheLargestMatricesIsWarnedOfAtStart) {
  struct Case {
    std::vector<std::string> flags;
    bool warned;
  };
  const Case cases[] = {
      {{"--buffer_pool_bytes=536870912"}, true},  // 1 GiB matrices.
      {{"--buffer_pool_bytes=536870912", "--max_matrix_bytes=536870912"},
       false},
      {{"--buffer_pool_bytes=536870912",
        "--max_inflight_bytes_per_peer=536870912"},
       false},
      {{"--buffer_pool_bytes=805306368", "--max_matrix_bytes=805306369"},
       true},  // A 896 MiB buffer.
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrJoin(c.flags, " "));
    const ServerLog server_log;
    // A budget whose worst case (about 6 GiB on the CPU) a machine that runs
    // these tests holds, as the defaults' may not be: the server would lower
    // it, and the largest matrix with it.
    std::vector<std::string> flags = {"--max_inflight_bytes=1073741824",
                                      "--max_matrix_bytes=1073741824"};
    flags.insert(flags.end(), c.flags.begin(), c.flags.end());
    flags.insert(flags.end(), {"--log_level=warning", "--unready_seconds=0"});
    auto server = Start(flags, server_log.path());
    ASSERT_NE(server, nullptr);
    EXPECT_EQ(server->Stop(SIGTERM), 0);
    const std::string log = server_log.Read();
    if (c.warned) {
      EXPECT_THAT(log, HasSubstr("WARNING --buffer_pool_bytes="));
      EXPECT_THAT(log, HasSubstr("cannot keep a buffer for the largest "
                                 "matrices"));
    } else {
      EXPECT_THAT(log, Not(HasSubstr("cannot keep a buffer"))) << log;
    }
  }
}

// A connection gets a GOAWAY at --max_connection_age_seconds: the client
// reconnects (resolving its target again, which is how DNS clients find new
// servers), its calls go on without an error, and a call running at that age
// finishes on the old connection.
TEST_F(ReliabilityTest, ConnectionsAreReplacedAtTheirMaxAge) {
  for (const bool aged : {false, true}) {
    SCOPED_TRACE(aged ? "1 s connection age" : "300 s connection age");
    auto server =
        Start({absl::StrCat("--max_connection_age_seconds=", aged ? 1 : 300),
               "--unready_seconds=0"});
    ASSERT_NE(server, nullptr);
    auto client = Connect(*server);
    auto stub = v1::TransposeService::NewStub(client->channel());
    // A stream that runs across the age: its header now, its data later.
    grpc::ClientContext context;
    std::unique_ptr<Stream> stream = stub->TransposeStream(&context);
    ASSERT_TRUE(stream->Write(Header(256, 256)));
    // Taken by the server before the connection's age: a stream the GOAWAY
    // overtook would be refused, not finished.
    EXPECT_EQ(AwaitGauge(*server, "transpose_inflight_requests", 1), 1);
    std::set<int> ports;
    const absl::Time start = absl::Now();
    while (absl::Now() - start < absl::Seconds(3)) {
      EXPECT_TRUE(Transpose(*client, 64, 64).ok());
      for (int port : ClientPortsTo(server->port())) ports.insert(port);
      absl::SleepFor(absl::Milliseconds(50));
    }
    v1::TransposeRequest data;
    data.set_data(std::string(256 * 256 * 4, '\x07'));
    ASSERT_TRUE(stream->Write(data));
    // As the README asks of clients, and the library does: half-close once
    // the result (its last message carries the stats) is in. The server's
    // call ends at the half-close, and gRPC closes the aged connection the
    // moment its last call ends: a client that half-closed first could be
    // reset under a result it had not read yet (about one run in 40 did).
    v1::TransposeResponse response;
    uint64_t received = 0;
    while (!response.has_stats() && stream->Read(&response)) {
      received += response.data().size();
    }
    EXPECT_TRUE(response.has_stats());
    stream->WritesDone();
    EXPECT_FALSE(stream->Read(&response));
    const grpc::Status finished = stream->Finish();
    EXPECT_TRUE(finished.ok()) << finished.error_message();
    EXPECT_EQ(received, 256 * 256 * 4);
    // About two ages in 3 s: at least one new connection, besides the
    // stream's own.
    if (aged) {
      EXPECT_GE(ports.size(), 2u);
    } else {
      EXPECT_EQ(ports.size(), 1u);
    }
    // Still running, and it drains cleanly: a server that ended by itself
    // would have reset every connection.
    EXPECT_EQ(server->Stop(SIGTERM), 0);
  }
}

// A client failing call after call gets 10 warning lines a second, not one a
// call, and the lines that go out count the ones held back: none is lost.
TEST_F(ReliabilityTest, AFloodOfFailedCallsIsLoggedTenLinesASecond) {
  const ServerLog server_log;
  auto server = Start({"--log_level=warning"}, server_log.path());
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  auto stub = v1::TransposeService::NewStub(client->channel());
  const auto fail_once = [&stub] {
    grpc::ClientContext context;
    v1::TransposeResponse response;
    return !stub->Transpose(&context, Header(0, 5), &response).ok();
  };
  int failed = 0;
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Seconds(1)) failed += fail_once();
  absl::SleepFor(absl::Milliseconds(1100));
  failed += fail_once();  // After the flood: logged at once.
  const absl::Duration elapsed = absl::Now() - start;
  EXPECT_EQ(server->Stop(SIGTERM), 0);

  int lines = 0;
  uint64_t held_back = 0;
  for (absl::string_view line : absl::StrSplit(server_log.Read(), '\n')) {
    if (absl::StrContains(line, "Transpose from")) {
      ++lines;
      EXPECT_THAT(line, HasSubstr("INVALID_ARGUMENT"));
      // A line that goes out after some were held back counts them...
      if (const size_t at = line.find("(and "); at != line.npos) {
        held_back += std::stoull(std::string(line.substr(at + 5)));
        EXPECT_THAT(line, HasSubstr("failed calls not logged since the last"));
      }
    } else if (const size_t at = line.find(" failed calls not logged");
               at != line.npos) {
      // ...and so does the server's summary each second, once none follows.
      const size_t number = line.rfind(' ', at - 1) + 1;
      held_back += std::stoull(std::string(line.substr(number, at - number)));
    }
  }
  EXPECT_GT(failed, 30);  // A flood, even under a sanitizer.
  EXPECT_GT(held_back, 0u);
  EXPECT_LE(lines, 10 * (absl::ToInt64Seconds(elapsed) + 1));
  EXPECT_EQ(lines + held_back, static_cast<uint64_t>(failed));
}

// A call gives its admission back before its client has its status, so a
// client that sends its next call at once is never refused by its own last
// one: N callers of M bytes each fit a budget of exactly N * M.
TEST_F(ReliabilityTest, BackToBackCallsFitABudgetOfExactlyTheirSize) {
  constexpr int kCallers = 4;
  constexpr uint64_t kRows = 1024, kCols = 1024;  // 4 MiB of float32.
  auto server = Start(
      {absl::StrCat("--max_inflight_bytes=", kCallers * kRows * kCols * 4)});
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);  // One attempt: a refusal shows.
  std::atomic<int> refused{0}, failed{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&] {
      CallOptions call;
      call.force_stream = true;
      for (int j = 0; j < 40; ++j) {
        const absl::Status status = Transpose(*client, kRows, kCols, call);
        if (absl::IsResourceExhausted(status)) ++refused;
        if (!status.ok()) ++failed;
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(refused, 0);
  EXPECT_EQ(failed, 0);
}

// A call whose result goes over its own input is not sent again once part of
// the result has arrived: the input is gone. One with a separate output is.
TEST_F(ReliabilityTest, AnInPlaceCallIsNotSentAgainOnceItsResultBegan) {
  for (const bool in_place : {true, false}) {
    auto server = Start({"--response_chunk_bytes=65536"});
    ASSERT_NE(server, nullptr);
    auto client = Connect(*server, /*max_attempts=*/3);
    const MatrixShape shape = MatrixShape::Matrix(4096, 4096);  // 64 MiB.
    std::vector<uint8_t> data(shape.elements() * 4, 1);
    std::vector<uint8_t> separate(data.size());
    CallOptions call;
    call.force_stream = true;
    bool killed = false;
    // The server dies as the result starts to arrive.
    call.on_progress = [&](const TransferProgress& progress) {
      if (progress.received_bytes > 0 && !killed) {
        killed = true;
        kill(server->pid(), SIGKILL);
      }
    };
    const absl::Status status =
        client
            ->TransposeInto({DataType::kFloat32, shape, data},
                            absl::MakeSpan(in_place ? data : separate), call)
            .status();
    ASSERT_TRUE(killed);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    if (in_place) {
      EXPECT_THAT(status.message(),
                  HasSubstr("not sent again: part of the result had already "
                            "been written over the input"));
    } else {
      EXPECT_THAT(status.message(), HasSubstr("gave up after 3 attempts"));
    }
  }
}

// A result that arrived whole, with its stats, is the call's, whatever ends
// the stream after it: the server dying before its trailers (here in place,
// where the call could not be sent again), or the caller's cancel.
TEST_F(ReliabilityTest, AResultThatArrivedWholeIsKeptWhenTheStreamThenEnds) {
  for (const bool killed : {true, false}) {
    SCOPED_TRACE(killed ? "server killed" : "call cancelled");
    auto server = Start({"--response_chunk_bytes=65536"});
    ASSERT_NE(server, nullptr);
    auto client = Connect(*server, /*max_attempts=*/3);
    const MatrixShape shape = MatrixShape::Matrix(512, 768);
    std::vector<uint8_t> data(shape.elements() * 4);
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i);
    const std::vector<uint8_t> expected =
        testing::ReferenceTranspose(data, 4, shape);
    CallCanceller canceller;
    CallOptions call;
    call.force_stream = true;
    call.canceller = &canceller;
    bool ended = false;
    int attempts = 0;
    call.on_progress = [&](const TransferProgress& progress) {
      attempts = progress.attempt;
      if (progress.received_bytes < progress.total_bytes || ended) return;
      ended = true;
      if (killed) {
        server->Stop(SIGKILL);
      } else {
        canceller.Cancel();
      }
    };
    const absl::StatusOr<TransposeStats> stats = client->TransposeInto(
        {DataType::kFloat32, shape, data}, absl::MakeSpan(data), call);
    ASSERT_TRUE(ended);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(attempts, 1);
    EXPECT_GT(stats->kernel_seconds, 0);
    EXPECT_EQ(data, expected);
  }
}

// A signal while the server starts (setting up many GPUs can take a while)
// stops it at once, without the drain's clean exit code; before, signals were
// blocked until it served, and a second Ctrl-C merged into the first.
TEST_F(ReliabilityTest, ASignalDuringStartUpStopsTheServerAtOnce) {
  absl::Time signalled = absl::InfiniteFuture();
  const auto [code, text] = ServerProcess::RunUntilExit(
      {ServerProcess::BackendFlag(), "--log_level=warning",
       "--testing_startup_delay_seconds=60"},
      absl::Seconds(30), [&signalled](pid_t pid, absl::string_view stderr) {
        if (signalled == absl::InfiniteFuture() &&
            absl::StrContains(stderr, "start-up waits")) {
          kill(pid, SIGTERM);
          signalled = absl::Now();
        }
      });
  ASSERT_NE(signalled, absl::InfiniteFuture()) << text;
  EXPECT_EQ(code, 1) << text;
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(5));
  EXPECT_THAT(text, HasSubstr("signal 15 during start-up: stopping"));
}

// A second signal during the wait before the drain ends the server at once,
// without the drain's clean exit code.
TEST_F(ReliabilityTest, ASecondSignalStopsTheServerAtOnce) {
  auto server = Start({"--unready_seconds=60"});
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  kill(server->pid(), SIGTERM);
  // The first signal has been taken once health reports NOT_SERVING.
  absl::StatusOr<bool> serving = true;
  for (int i = 0; i < 100 && serving.ok() && *serving; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
    serving = client->CheckHealth("", absl::Seconds(1));
  }
  ASSERT_TRUE(serving.ok()) << serving.status();
  ASSERT_FALSE(*serving);
  EXPECT_EQ(server->Stop(SIGINT, absl::Seconds(5)), 1);
}

// A slow client gets its whole result when the server closes the connection
// while it reads, at the connection's age or in a drain. The server ends the
// call only at the client's half-close, and the client half-closes once it
// has the result: before, it half-closed after its upload, the server's last
// stream ended as soon as gRPC had taken the last chunk, and the close reset
// the connection under the bytes the client had not read yet.
TEST_F(ReliabilityTest, ASlowReaderGetsItsWholeResultAsTheConnectionCloses) {
  const MatrixShape shape{1, 2048, 2048};
  const std::vector<uint8_t> data = testing::RandomBytes(16 * kMiB, 7);
  const std::vector<uint8_t> expected =
      testing::ReferenceTranspose(data, 4, shape);
  for (const bool drain : {false, true}) {
    auto server = drain ? Start({"--unready_seconds=0", "--drain_seconds=60"})
                        : Start({"--max_connection_age_seconds=1"});
    ASSERT_NE(server, nullptr);
    FreezableRelay relay(server->port());
    // 16 MiB at 4 MiB/s: past the connection's age of 1 s.
    relay.ThrottleAnswers(4 * kMiB);
    ClientOptions options;
    options.target = relay.address();
    options.default_timeout = absl::Seconds(60);
    options.max_attempts = 1;
    auto client = *Client::Create(options);
    CallOptions call;
    bool signalled = false;
    call.on_progress = [&](const TransferProgress& progress) {
      if (drain && !signalled && progress.sent_bytes == data.size()) {
        kill(server->pid(), SIGTERM);
        signalled = true;
      }
    };
    absl::StatusOr<TransposeResult> result =
        client->Transpose({DataType::kFloat32, shape, data}, call);
    ASSERT_TRUE(result.ok())
        << (drain ? "drain: " : "age: ") << result.status();
    EXPECT_TRUE(result->data == expected);
    // Signal 0: none more (a second SIGTERM would stop it at once).
    if (drain) EXPECT_EQ(server->Stop(0, absl::Seconds(30)), 0);
  }
}

// A port another server listens on is refused, not shared with it (gRPC
// would set SO_REUSEPORT and split the connections between the two).
TEST_F(ReliabilityTest, APortInUseIsRefused) {
  auto server = Start({});
  ASSERT_NE(server, nullptr);
  const std::string address = absl::StrCat("127.0.0.1:", server->port());
  const auto [code, text] = ServerProcess::RunUntilExit(
      {"--backend=cpu", "--address=" + address}, absl::Seconds(10));
  EXPECT_EQ(code, 1) << text;
  EXPECT_THAT(text, HasSubstr("cannot listen on " + address));
  EXPECT_TRUE(Transpose(*Connect(*server), 8, 8).ok());

  // The metrics port too, before a backend starts (a GPU's would calibrate).
  const std::string metrics_address =
      absl::StrCat("127.0.0.1:", server->metrics_port());
  const auto [metrics_code, metrics_text] =
      ServerProcess::RunUntilExit({"--backend=cpu", "--log_level=info",
                                   "--metrics_address=" + metrics_address},
                                  absl::Seconds(10));
  EXPECT_EQ(metrics_code, 1) << metrics_text;
  EXPECT_THAT(metrics_text,
              HasSubstr("cannot serve metrics on " + metrics_address +
                        ": the port is in use"));
  EXPECT_THAT(metrics_text, Not(HasSubstr("backend cpu")));
}

// A server on the CUDA backend whose every job after each device's first
// spins for 30 s (as a device that stops answering would), past a hang limit
// of `hang_seconds`, on one stream per device.
std::unique_ptr<ServerProcess> StartWithHangingGpuJobs(
    const ServerLog& log, int hang_seconds,
    std::vector<std::string> more_args = {}) {
  std::vector<std::string> args = {
      "--testing_cuda_hang_after_jobs=1",
      absl::StrCat("--gpu_hang_seconds=", hang_seconds),
      "--streams_per_device=1",
      "--drain_seconds=1",
      "--unready_seconds=0",
      "--log_level=warning"};
  args.insert(args.end(), more_args.begin(), more_args.end());
  return Start(std::move(args), log.path());
}

std::unique_ptr<Client> ConnectForHangs(const ServerProcess& server,
                                        absl::Duration deadline) {
  ClientOptions options;
  options.target = server.address();
  options.max_attempts = 1;
  options.default_timeout = deadline;
  return *Client::Create(options);
}

// With the CUDA backend (the GPU machine): a job that holds its stream past
// --gpu_hang_seconds (here a kernel that spins for 30 s, as a device that stops
// answering would) takes its device out of service, as a fault does: new calls
// go to the devices left, then get UNAVAILABLE, and health turns NOT_SERVING,
// for the liveness probe to restart the process. Before, the stream stayed
// taken and health said SERVING. A job still hung counts in its device's load,
// so each device takes one.
TEST_F(ReliabilityTest, AHungGpuJobTakesTheDeviceOutOfService) {
  if (ServerProcess::BackendFromEnvironment() != "cuda") {
    GTEST_SKIP() << "needs the CUDA backend (TRANSPOSE_TEST_BACKEND=cuda)";
  }
  const ServerLog server_log;
  auto server = StartWithHangingGpuJobs(server_log, /*hang_seconds=*/1);
  ASSERT_NE(server, nullptr);
  auto client = ConnectForHangs(*server, absl::Seconds(4));
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  const int devices = info->backends_size();
  for (int i = 0; i < devices; ++i) {
    EXPECT_TRUE(Transpose(*client, 64, 64).ok()) << "job " << i;
  }
  const auto devices_in_service = [&server, devices] {
    int in_service = 0;
    for (int device = 0; device < devices; ++device) {
      in_service += server->Metric(absl::StrCat(
                        "transpose_backend_healthy{backend=\"cuda:", device,
                        "\"}")) == 1.0;
    }
    return in_service;
  };
  for (int i = 0; i < devices; ++i) {
    EXPECT_EQ(Transpose(*client, 64, 64).code(),
              absl::StatusCode::kDeadlineExceeded)
        << "job " << devices + i;
    // The caller's 4 s end past the 1 s limit and long before the kernel's
    // 30 s: its device is out of service by then, on the limit.
    EXPECT_EQ(devices_in_service(), devices - 1 - i) << "job " << devices + i;
  }
  const absl::Status after = Transpose(*client, 64, 64);
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable) << after;
  EXPECT_THAT(after.message(),
              HasSubstr("no backend of this server is in service"));
  absl::SleepFor(absl::Milliseconds(1500));  // The server checks each second.
  const absl::StatusOr<bool> serving = client->CheckHealth();
  ASSERT_TRUE(serving.ok()) << serving.status();
  EXPECT_FALSE(*serving);
  EXPECT_EQ(server->Stop(SIGTERM), 0);
  const std::string log = server_log.Read();
  for (int device = 0; device < devices; ++device) {
    const std::string line =
        absl::StrCat("ERROR cuda:", device, ": a job has held its stream for ");
    EXPECT_THAT(log, HasSubstr(line)) << log;
    EXPECT_EQ(log.find(line), log.rfind(line)) << log;
  }
  EXPECT_THAT(log, HasSubstr("past the 1s a job may take"));
}

// With the CUDA backend (the GPU machine): calls queued behind a hung job's
// stream fail with UNAVAILABLE once the hang takes the device out of service,
// instead of waiting with it until their callers' deadlines. Each device first
// runs a job, then takes a hung one (a hung job counts in its device's load, so
// each takes one); two more calls then queue behind them. Without a pool of
// idle buffers every job's pinned memory is freed as the job goes, which the
// device would block (cudaFreeHost waits for it): each failed job's free,
// which comes before its reply, would hold that reply (and, behind it, the
// other queued call's on the same device) until the spin ends.
TEST_F(ReliabilityTest, CallsQueuedBehindAHungGpuJobFailOnceItIsOutOfService) {
  if (ServerProcess::BackendFromEnvironment() != "cuda") {
    GTEST_SKIP() << "needs the CUDA backend (TRANSPOSE_TEST_BACKEND=cuda)";
  }
  const ServerLog server_log;
  // 3 s: time to queue the calls behind every device's hung job before the
  // first one's hang is seen.
  auto server = StartWithHangingGpuJobs(server_log, /*hang_seconds=*/3,
                                        {"--buffer_pool_bytes=0"});
  ASSERT_NE(server, nullptr);
  auto client = ConnectForHangs(*server, absl::Seconds(15));
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  const int devices = info->backends_size();
  for (int i = 0; i < devices; ++i) {
    EXPECT_TRUE(Transpose(*client, 64, 64).ok()) << "job " << i;
  }
  const auto busy_streams = [&server, devices] {
    double busy = 0;
    for (int device = 0; device < devices; ++device) {
      busy += Gauge(*server,
                    absl::StrCat("transpose_stream_pool_busy_streams{backend="
                                 "\"cuda:",
                                 device, "\"}"));
    }
    return busy;
  };
  // Each call's status and how long it took.
  struct Call {
    absl::Status status;
    absl::Duration took;
    std::thread thread;
  };
  const auto start_call = [&client](Call& call) {
    call.thread = std::thread([&client, &call] {
      const absl::Time start = absl::Now();
      call.status = Transpose(*client, 64, 64);
      call.took = absl::Now() - start;
    });
  };
  std::vector<Call> hung(devices);
  for (int i = 0; i < devices; ++i) {
    start_call(hung[i]);
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (busy_streams() < i + 1 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(busy_streams(), i + 1) << "hung job " << i;
  }
  for (int device = 0; device < devices; ++device) {
    EXPECT_EQ(Gauge(*server, absl::StrCat("transpose_backend_healthy{backend="
                                          "\"cuda:",
                                          device, "\"}")),
              1.0)
        << "cuda:" << device
        << ": the calls below should queue, not be refused";
  }
  std::vector<Call> queued(2);
  for (Call& call : queued) start_call(call);
  for (Call& call : queued) call.thread.join();
  for (size_t i = 0; i < queued.size(); ++i) {
    EXPECT_EQ(queued[i].status.code(), absl::StatusCode::kUnavailable)
        << "queued call " << i << ": " << queued[i].status;
    EXPECT_THAT(queued[i].status.message(),
                HasSubstr("is out of service after a fault or hang"));
    // The 3 s limit and the watch's look every 0.75 s; a call held until the
    // 30 s spin ends, or its 15 s deadline, is far past this.
    EXPECT_LT(queued[i].took, absl::Seconds(8)) << "queued call " << i;
  }
  for (Call& call : hung) call.thread.join();
  for (int i = 0; i < devices; ++i) {
    EXPECT_EQ(hung[i].status.code(), absl::StatusCode::kDeadlineExceeded)
        << "hung job " << i << ": " << hung[i].status;
  }
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

// With a GPU (the GPU machine): on --backend=auto a GPU that fails to come up
// at start-up is left out, with a warning that says why, and the server serves
// on the others, or on the CPU when there are none (a machine's one GPU
// broken). --backend=cuda does not start then, and says which GPU failed.
TEST_F(ReliabilityTest, AGpuThatFailsToComeUpIsLeftOutOnAuto) {
  if (ServerProcess::BackendFromEnvironment() != "cuda") {
    GTEST_SKIP() << "needs the CUDA backend (TRANSPOSE_TEST_BACKEND=cuda)";
  }
  const ServerLog server_log;
  auto server = Start({"--backend=auto", "--testing_cuda_unusable_device=0",
                       "--log_level=warning"},
                      server_log.path());
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_GT(info->backends_size(), 0);
  for (const auto& backend : info->backends()) {
    EXPECT_NE(backend.name(), "cuda:0");
    // One GPU: the CPU, else the others.
    EXPECT_EQ(backend.name() == "cpu", info->backends_size() == 1)
        << backend.name();
  }
  EXPECT_TRUE(Transpose(*client, 300, 500).ok());
  const std::string log = server_log.Read();
  EXPECT_THAT(log, HasSubstr("cuda:0: a testing flag "
                             "(--testing_cuda_unusable_device) keeps it from "
                             "coming up: not serving on it"));
  if (info->backends_size() == 1) {
    EXPECT_THAT(log, HasSubstr("no GPU came up: serving on the CPU"));
  }

  const auto [code, text] = ServerProcess::RunUntilExit(
      {"--backend=cuda", "--testing_cuda_unusable_device=0"},
      absl::Seconds(60));
  EXPECT_EQ(code, 1) << text;
  EXPECT_THAT(text, HasSubstr("cuda:0: a testing flag"));
  EXPECT_THAT(text, HasSubstr("--backend=cuda needs every visible GPU"));
}

// With the CUDA backend (the GPU machine): the server loads every kernel as it
// starts. CUDA by default loads each on its first run, which the first request
// to use it paid in the kernel time it reports: 0.13 to 3.5 ms instead of 0.05
// (docs/BENCHMARKS.md). An operator's CUDA_MODULE_LOADING=LAZY stands, with a
// warning; an empty value does not.
TEST_F(ReliabilityTest,
       GpuKernelsAreLoadedAtStartUnlessTheEnvironmentSaysLazy) {
  if (ServerProcess::BackendFromEnvironment() != "cuda") {
    GTEST_SKIP() << "needs the CUDA backend (TRANSPOSE_TEST_BACKEND=cuda)";
  }
  // A bare name unsets it. An empty value had left CUDA loading lazily.
  for (const std::string setting :
       {"CUDA_MODULE_LOADING",
        "CUDA_MODULE_LOADING=", "CUDA_MODULE_LOADING=LAZY"}) {
    SCOPED_TRACE(setting);
    const bool lazy = absl::EndsWith(setting, "LAZY");
    bool stopped = false;
    const auto [code, text] = ServerProcess::RunUntilExit(
        {"--backend=cuda", "--log_level=info", "--unready_seconds=0"},
        absl::Seconds(120),
        [&stopped](pid_t pid, absl::string_view stderr) {
          if (!stopped && absl::StrContains(stderr, " INFO serving ")) {
            kill(pid, SIGTERM);
            stopped = true;
          }
        },
        {setting});
    ASSERT_TRUE(stopped) << text;
    EXPECT_EQ(code, 0) << text;
    EXPECT_THAT(text, HasSubstr("backend cuda:0: "));
    if (lazy) {
      EXPECT_THAT(text, HasSubstr("each kernel loaded on its first run"));
      EXPECT_THAT(text, Not(HasSubstr("kernels loaded at start")));
      EXPECT_THAT(text, HasSubstr("WARNING cuda:0 loads each kernel on its "
                                  "first run (CUDA_MODULE_LOADING=LAZY)"));
    } else {
      EXPECT_THAT(text, HasSubstr("kernels loaded at start"));
      EXPECT_THAT(text, Not(HasSubstr("loads each kernel on its first run")));
    }
  }
}

// With the CUDA backend (the GPU machine): a device fault that poisons the CUDA
// context fails the request it hit and takes that device out of service;
// later requests go to the devices left, and once none is left health turns
// NOT_SERVING and requests get UNAVAILABLE instead of results from a broken
// device. The server stays up. With one stream per device and nothing else
// running, requests take the devices in turn, so every device runs two jobs
// before the first fault.
TEST_F(ReliabilityTest, AStickyGpuFaultTakesTheDeviceOutOfService) {
  if (ServerProcess::BackendFromEnvironment() != "cuda") {
    GTEST_SKIP() << "needs the CUDA backend (TRANSPOSE_TEST_BACKEND=cuda)";
  }
  const ServerLog server_log;
  auto server = Start({"--testing_cuda_fault_after_jobs=2",
                       "--streams_per_device=1", "--log_level=warning"},
                      server_log.path());
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  const int devices = info->backends_size();
  auto serving_after_a_health_check = [&] {
    absl::SleepFor(absl::Milliseconds(1500));  // The server checks each second.
    absl::StatusOr<bool> serving = client->CheckHealth();
    return serving.ok() && *serving;
  };
  for (int i = 0; i < 2 * devices; ++i) {
    EXPECT_TRUE(Transpose(*client, 64, 64).ok()) << "job " << i;
  }
  // Through a stub, to read the retry advice: a fault says not to send the
  // call again (it could be the query's, and fault the next device too).
  auto stub = v1::TransposeService::NewStub(client->channel());
  const auto faulting_call = [&stub](std::string& pushback) {
    grpc::ClientContext context;
    v1::TransposeRequest request = Header(64, 64);
    request.set_data(std::string(64 * 64 * 4, '\3'));
    v1::TransposeResponse response;
    const grpc::Status status = stub->Transpose(&context, request, &response);
    const auto& trailers = context.GetServerTrailingMetadata();
    const auto found = trailers.find(api::kRetryPushbackKey);
    pushback = found == trailers.end()
                   ? "none"
                   : std::string(found->second.data(), found->second.size());
    return api::FromGrpcStatus(status);
  };
  const auto device_healthy = [&server](int device) {
    return server->Metric(absl::StrCat(
        "transpose_backend_healthy{backend=\"cuda:", device, "\"}"));
  };
  for (int device = 0; device < devices; ++device) {
    EXPECT_EQ(device_healthy(device), 1.0) << "cuda:" << device;
  }
  int faults = 0;
  absl::Status status = absl::OkStatus();
  for (int i = 0; i < 4 * devices; ++i) {
    std::string pushback;
    status = faulting_call(pushback);
    if (status.code() != absl::StatusCode::kInternal) break;
    EXPECT_EQ(pushback, "-1") << status;
    ++faults;
    if (faults < devices) {
      EXPECT_TRUE(serving_after_a_health_check())
          << faults << " of " << devices << " devices faulted";
    }
  }
  EXPECT_GE(faults, devices);
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  // The last faulting device's own refusal, or the engine's once none is
  // left: the texts the runbook quotes.
  EXPECT_THAT(status.message(),
              AnyOf(HasSubstr("is out of service after a fault"),
                    HasSubstr("no backend of this server is in service")));
  EXPECT_FALSE(serving_after_a_health_check());
  const absl::Status after = Transpose(*client, 64, 64);
  EXPECT_EQ(after.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(after.message(),
              HasSubstr("no backend of this server is in service"));
  // Each device's gauge says it is out of service, one by one as they fault.
  for (int device = 0; device < devices; ++device) {
    EXPECT_EQ(device_healthy(device), 0.0) << "cuda:" << device;
  }
  EXPECT_EQ(server->Stop(SIGTERM), 0);
  // Each device says, once, that it is out of service, and why.
  const std::string log = server_log.Read();
  for (int device = 0; device < devices; ++device) {
    const std::string line = absl::StrCat(
        "ERROR cuda:", device, ": cudaErrorIllegalAddress (an illegal memory ");
    EXPECT_THAT(log, HasSubstr(line)) << log;
    EXPECT_EQ(log.find(line), log.rfind(line)) << log;
  }
  EXPECT_THAT(log, HasSubstr("the device is out of service until the server "
                             "restarts"));
  EXPECT_THAT(log, HasSubstr("ERROR health: NOT_SERVING (no healthy device)"));
  EXPECT_THAT(log, HasSubstr("--testing_cuda_fault_after_jobs=2: a testing "
                             "flag; every GPU faults on purpose"));
}

}  // namespace
}  // namespace transpose
