#include "client/client.h"

#include <cstdint>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "server/core/retry.h"
#include "tests/refused_port.h"

namespace transpose {
namespace {

using ::testing::HasSubstr;

// Options that would fail every call are refused when the client is made.
TEST(ClientCreateTest, RefusesOptionsNoCallCouldWorkWith) {
  const auto create = [](void (*change)(ClientOptions&)) {
    ClientOptions options;
    options.target = "localhost:50051";
    change(options);
    return Client::Create(options).status();
  };
  EXPECT_TRUE(create([](ClientOptions&) {}).ok());
  EXPECT_TRUE(
      create([](ClientOptions& o) { o.connections = kMaxConnections; }).ok());
  EXPECT_TRUE(create([](ClientOptions& o) {
                o.default_timeout = absl::InfiniteDuration();
              }).ok());
  EXPECT_TRUE(create([](ClientOptions& o) {
                o.keepalive_time = absl::InfiniteDuration();
                o.keepalive_timeout = absl::ZeroDuration();
              }).ok());
  EXPECT_TRUE(create([](ClientOptions& o) {
                o.chunk_bytes = o.unary_max_bytes = api::kMaxMessageDataBytes;
              }).ok());
  const std::pair<void (*)(ClientOptions&), const char*> refused[] = {
      {[](ClientOptions& o) { o.default_timeout = absl::ZeroDuration(); },
       "default_timeout is 0; expected a positive one"},
      {[](ClientOptions& o) { o.default_timeout = absl::Seconds(-1); },
       "default_timeout is -1s"},
      {[](ClientOptions& o) { o.max_attempts = 0; }, "max_attempts is 0"},
      {[](ClientOptions& o) { o.connections = 0; },
       "connections is 0; expected 1 to 64"},
      {[](ClientOptions& o) { o.connections = kMaxConnections + 1; },
       "connections is 65"},
      {[](ClientOptions& o) { o.chunk_bytes = 0; }, "chunk_bytes is 0"},
      {[](ClientOptions& o) { o.chunk_bytes = uint64_t{2} << 30; },
       "chunk_bytes is 2147483648; expected at most 2146435071"},
      {[](ClientOptions& o) {
         o.unary_max_bytes = api::kMaxMessageDataBytes + 1;
       },
       "unary_max_bytes is 2146435072; expected at most"},
      {[](ClientOptions& o) { o.keepalive_time = absl::Seconds(5); },
       "keepalive every 5s with a timeout of 10s; expected at least 10s"},
      {[](ClientOptions& o) { o.keepalive_timeout = absl::ZeroDuration(); },
       "keepalive every 30s with a timeout of 0;"},
      {[](ClientOptions& o) {
         o.initial_backoff = absl::Seconds(3);
         o.max_backoff = absl::Seconds(2);
       },
       "backoff from 3s to 2s"},
      {[](ClientOptions& o) { o.initial_backoff = absl::Seconds(-1); },
       "backoff from -1s to"},
      {[](ClientOptions& o) { o.bearer_token = "a b"; },
       "bearer_token holds a character that is not visible ASCII"},
      {[](ClientOptions& o) {
         o.bearer_token = "a";
         o.bearer_token_file = "/nonexistent";
       },
       "bearer_token and bearer_token_file are both set"},
      {[](ClientOptions& o) { o.tls_cert_chain_pem = "cert"; },
       "a client certificate needs its key"},
      {[](ClientOptions& o) { o.tls_private_key_pem = "key"; },
       "a client certificate needs its key"},
      {[](ClientOptions& o) { o.target = ""; }, "no target given"},
  };
  for (const auto& [change, message] : refused) {
    const absl::Status status = create(change);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_THAT(status.message(), HasSubstr(message));
  }
}

// A client whose target is never reached (these calls end before anything is
// sent), and 1 PiB matrices that are never read (one byte, spanned).
class ClientTransposeTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kSide = uint64_t{1} << 25;

  void SetUp() override {
    ClientOptions options;
    options.target = "127.0.0.1:1";
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
  }

  // kSide x kSide, with the bytes of as many 1-byte elements.
  MatrixView Petabyte(DataType dtype = DataType::kUInt8) const {
    return {dtype, MatrixShape::Matrix(kSide, kSide),
            absl::MakeConstSpan(&byte_, kSide * kSide)};
  }

  std::unique_ptr<Client> client_;
  const uint8_t byte_ = 0;
};

// A result too large for memory is a status, not std::bad_alloc.
TEST_F(ClientTransposeTest, AResultThatDoesNotFitInMemoryIsResourceExhausted) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's operator new stops the process instead "
                  "of throwing std::bad_alloc";
#endif
  const absl::StatusOr<TransposeResult> result = client_->Transpose(Petabyte());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted)
      << result.status();
  EXPECT_THAT(
      std::string(result.status().message()),
      ::testing::HasSubstr("out of memory for the 1125899906842624-byte "
                           "result"));
  // This machine's memory, which RESOURCE_EXHAUSTED would put on the server.
  EXPECT_TRUE(IsInThisProcess(result.status()));
  EXPECT_EQ(StatusText(result.status()), result.status().message());
}

// A call that would be refused is refused before its result is allocated:
// with no time, an inconsistent input or a bad request id, a 1 PiB matrix is
// not RESOURCE_EXHAUSTED (nor, under AddressSanitizer, the end of the
// process).
TEST_F(ClientTransposeTest, RefusalsComeBeforeTheResultIsAllocated) {
  CallOptions no_time;
  no_time.timeout = absl::ZeroDuration();
  absl::Status status = client_->Transpose(Petabyte(), no_time).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;

  CallOptions bad_id;
  bad_id.request_id = "two words";
  status = client_->Transpose(Petabyte(), bad_id).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;

  status = client_->Transpose(Petabyte(DataType::kUnspecified)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  status = client_->Transpose(Petabyte(DataType::kUInt16)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("input holds"));
  // TransposeInto's output must take exactly the result.
  std::vector<uint8_t> small_input(12), small_output(11);
  status = client_
               ->TransposeInto(
                   {DataType::kFloat32, MatrixShape::Matrix(1, 3), small_input},
                   absl::MakeSpan(small_output))
               .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("output holds 11 bytes"));
}

// A call that waits for a connection that never comes is marked so, where a
// call refused at once, or one whose server answered too late, is not.
TEST(MadeNoConnectionTest, MarksOnlyAWaitThatFoundNoServer) {
  for (const bool wait_for_ready : {false, true}) {
    ClientOptions options;
    const testing::RefusedPort refused;
    options.target = refused.address();
    options.wait_for_ready = wait_for_ready;
    options.max_attempts = 1;
    options.connections = 1;
    std::unique_ptr<Client> client = *Client::Create(options);
    const absl::Status info =
        client->GetServerInfo(absl::Milliseconds(300)).status();
    CallOptions call;
    call.timeout = absl::Milliseconds(300);
    const absl::Status transposed =
        client
            ->Transpose({DataType::kUInt8, {1, 1, 1}, std::vector<uint8_t>{1}},
                        call)
            .status();
    for (const absl::Status& status : {info, transposed}) {
      EXPECT_EQ(status.code(), wait_for_ready
                                   ? absl::StatusCode::kDeadlineExceeded
                                   : absl::StatusCode::kUnavailable)
          << status;
      EXPECT_EQ(MadeNoConnection(status), wait_for_ready) << status;
    }
  }
  EXPECT_FALSE(MadeNoConnection(absl::DeadlineExceededError("too slow")));
}

TEST(StatusTextTest, CodeAndMessageWithoutPayloads) {
  // The retry mark would otherwise follow the request id that ends a failed
  // call's message.
  const absl::Status refused = RetryLater(
      absl::UnavailableError("the server is shutting down [request 0a1b]"));
  EXPECT_TRUE(IsRetryable(refused));
  EXPECT_EQ(StatusText(refused),
            "UNAVAILABLE: the server is shutting down [request 0a1b]");
  EXPECT_EQ(StatusText(absl::OkStatus()), "OK");
}

TEST(StatusTextTest, AFailureInThisProcessIsItsMessageAlone) {
  const absl::Status out_of_memory =
      InThisProcess(absl::ResourceExhaustedError("out of memory for a chunk"));
  EXPECT_EQ(out_of_memory.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsInThisProcess(out_of_memory));
  EXPECT_EQ(StatusText(out_of_memory), "out of memory for a chunk");
  // The server's own answer keeps its code.
  const absl::Status from_server =
      absl::ResourceExhaustedError("out of device memory");
  EXPECT_FALSE(IsInThisProcess(from_server));
  EXPECT_EQ(StatusText(from_server),
            "RESOURCE_EXHAUSTED: out of device memory");
}

TEST(CheckTargetTest, TakesWhatGrpcResolves) {
  for (const char* target :
       {"localhost:50051", "localhost", "10.0.0.1:1", "[::1]:50051",
        "dns:///svc:50051", "dns:svc", "dns://8.8.8.8/svc:50051",
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
      {"127.0.0.1", "127.0.0.1 names no port"},
      {"[::1]", "[::1] names no port"},
      {"::1", "::1 names no port"},
      {"dns:///10.0.0.1", "10.0.0.1 names no port"},
      {"ipv4:10.0.0.1:1,10.0.0.2", "10.0.0.2 names no port"},
      {"ipv6:[::1]", "[::1] names no port"},
      {"fe80::1%eth0", "fe80::1%eth0 names no port"},
      {"[fe80::1%25eth0]", "[fe80::1%25eth0] names no port"},
      {"localhost:abc", "port 'abc' is not a number"},
      {"[::1]:x", "port 'x' is not a number"},
      {"[::1", "has no closing ]"},
      {"[::1]50051", "does not parse as [HOST]:PORT"},
      {"localhost:107951", "port 107951 is past 65535"},
      {"ipv4:10.0.0.1:1,10.0.0.2:65536", "port 65536 is past 65535"},
      {"dns:///svc:9999999999", "port 9999999999 is past 65535"},
      {"http://localhost:50051", "a URL; expected host:port"},
      {"HTTPS://svc.example:443", "a URL; expected host:port"},
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
