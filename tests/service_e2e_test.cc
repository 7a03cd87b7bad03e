// End to end: the real transpose_server binary on loopback (port 0), driven by
// the real client library and by raw stubs for the malformed requests a
// well-behaved client cannot send. The backend comes from
// TRANSPOSE_TEST_BACKEND (cpu in CI; cuda on the GPU machine).
#include <grpcpp/generic/generic_stub.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/metrics_scrape.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "tests/reference_transpose.h"
#include "tests/reflection_client.h"
#include "tests/server_process.h"
#include "transpose/v1/transpose.grpc.pb.h"

namespace transpose {
namespace {

using ::testing::HasSubstr;
using testing::RandomBytes;
using testing::ReferenceTranspose;
using testing::ServerLog;
using testing::ServerProcess;
using ::testing::StartsWith;

constexpr uint64_t kUnaryLimit = 1 << 20;
constexpr uint64_t kMatrixLimit = 64 << 20;
// Far above what the tests here hold, unlike the defaults, and small enough
// that what the server may hold at worst under them (about 9 GiB on the CPU,
// with the default pool and gRPC's room) fits the machine, where the server
// would lower its budget (host_memory_plan.h).
constexpr uint64_t kInflightBytesLimit = uint64_t{1} << 30;
constexpr int kInflightRequestsLimit = 250;
constexpr uint64_t kInflightBytesPerPeer = uint64_t{768} << 20;
constexpr int kInflightRequestsPerPeer = 240;
constexpr double kStreamIdleSeconds = 100.5;

class ServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::StartFromEnvironment(
            {absl::StrCat("--max_message_bytes=", kUnaryLimit),
             absl::StrCat("--max_matrix_bytes=", kMatrixLimit),
             absl::StrCat("--max_inflight_bytes=", kInflightBytesLimit),
             absl::StrCat("--max_inflight_requests=", kInflightRequestsLimit),
             absl::StrCat("--max_inflight_bytes_per_peer=",
                          kInflightBytesPerPeer),
             absl::StrCat("--max_inflight_requests_per_peer=",
                          kInflightRequestsPerPeer),
             absl::StrCat("--stream_idle_seconds=", kStreamIdleSeconds)});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
    ClientOptions options;
    options.target = server_->address();
    client_ = Client::Create(options)->release();
    stub_ = v1::TransposeService::NewStub(client_->channel()).release();
  }
  static void TearDownTestSuite() {
    delete stub_;
    delete client_;
    if (server_ != nullptr) EXPECT_EQ(server_->Stop(SIGTERM), 0);
    delete server_;
  }

  static bool GpuBackend() {
    return ServerProcess::BackendFromEnvironment() != "cpu";
  }

  // Transposes random data through the client library and checks the result.
  static void ExpectRoundTrip(
      DataType dtype, const MatrixShape& shape, bool force_stream,
      kernels::Algorithm algorithm = kernels::Algorithm::kAuto) {
    const size_t size = ElementSize(dtype);
    const std::vector<uint8_t> input =
        RandomBytes(shape.elements() * size, shape.elements());
    CallOptions call;
    call.force_stream = force_stream;
    call.algorithm = algorithm;
    absl::StatusOr<TransposeResult> result =
        client_->Transpose({dtype, shape, input}, call);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->dtype, dtype);
    EXPECT_EQ(result->shape, shape.Transposed());
    EXPECT_TRUE(result->data == ReferenceTranspose(input, size, shape))
        << DataTypeName(dtype) << " " << ShapeToString(shape);
    // Any of the GPUs on a machine with several.
    if (GpuBackend()) {
      EXPECT_THAT(result->stats.backend, StartsWith("cuda:"));
    } else {
      EXPECT_EQ(result->stats.backend, "cpu");
    }
    ExpectConsistentStats(result->stats, input.size());
  }

  // The stats of a transpose of `bytes` hold DESIGN.md's definitions: the
  // bandwidth counts the bytes read and written over the kernel time, the peak
  // fraction is against the calibration GetServerInfo reports for the backend
  // that ran it, and the parts fit in the whole.
  static void ExpectConsistentStats(const TransposeStats& stats,
                                    uint64_t bytes) {
    ASSERT_GT(stats.kernel_seconds, 0);
    EXPECT_DOUBLE_EQ(stats.bandwidth_bytes_per_second,
                     2.0 * static_cast<double>(bytes) / stats.kernel_seconds);
    absl::StatusOr<v1::ServerInfo> info = client_->GetServerInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    double calibrated = 0;
    for (const v1::Backend& backend : info->backends()) {
      if (backend.name() == stats.backend) {
        calibrated = backend.calibrated_copy_bandwidth_bytes_per_second();
      }
    }
    ASSERT_GT(calibrated, 0) << "no calibration for " << stats.backend;
    EXPECT_DOUBLE_EQ(stats.peak_fraction,
                     stats.bandwidth_bytes_per_second / calibrated);
    EXPECT_GE(stats.queue_seconds, 0);
    EXPECT_GE(stats.total_seconds, stats.kernel_seconds);
    EXPECT_GE(stats.total_seconds, stats.queue_seconds);
    if (GpuBackend()) {
      // CUDA events time the copies (none, 0, where a small matrix is worked
      // on in mapped host memory) and the kernel; the total is wall clock.
      EXPECT_GE(stats.copy_in_seconds, 0);
      EXPECT_GE(stats.copy_out_seconds, 0);
      EXPECT_GE(stats.total_seconds * 1.01 + 1e-4, stats.copy_in_seconds +
                                                       stats.kernel_seconds +
                                                       stats.copy_out_seconds);
    }
  }

  static grpc::Status Unary(const v1::TransposeRequest& request) {
    grpc::ClientContext context;
    v1::TransposeResponse response;
    return stub_->Transpose(&context, request, &response);
  }

  // Sends `messages` on TransposeStream, half-closes, and returns the final
  // status.
  static grpc::Status Stream(
      const std::vector<v1::TransposeRequest>& messages) {
    grpc::ClientContext context;
    auto stream = stub_->TransposeStream(&context);
    for (const v1::TransposeRequest& message : messages) {
      if (!stream->Write(message)) break;
    }
    stream->WritesDone();
    v1::TransposeResponse response;
    while (stream->Read(&response)) {
    }
    return stream->Finish();
  }

  // Sends `bytes` as the one message of a call to `method`, as a client with
  // no generated code could, and returns the call's status.
  static grpc::Status RawUnary(const std::string& method,
                               const std::string& bytes) {
    grpc::GenericStub stub(client_->channel());
    grpc::CompletionQueue queue;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    auto call = stub.PrepareCall(&context, method, &queue);
    auto await = [&queue] {
      void* tag;
      bool ok = false;
      return queue.Next(&tag, &ok) && ok;
    };
    call->StartCall(nullptr);
    if (await()) {
      grpc::Slice slice(bytes);
      call->WriteLast(grpc::ByteBuffer(&slice, 1), grpc::WriteOptions(),
                      nullptr);
      await();
      grpc::ByteBuffer response;
      call->Read(&response, nullptr);
      await();
    }
    grpc::Status status;
    call->Finish(&status, nullptr);
    await();
    return status;
  }

  // A good request still works: a bad one disturbed nothing.
  static void ExpectStillServing() {
    ExpectRoundTrip(DataType::kFloat32, {1, 17, 19}, false);
  }

  static ServerProcess* server_;
  static Client* client_;
  static v1::TransposeService::Stub* stub_;
};

ServerProcess* ServiceTest::server_ = nullptr;
Client* ServiceTest::client_ = nullptr;
v1::TransposeService::Stub* ServiceTest::stub_ = nullptr;

v1::TransposeRequest Header(v1::DataType dtype, uint64_t rows, uint64_t cols,
                            uint64_t batch = 0) {
  v1::TransposeRequest request;
  request.set_dtype(dtype);
  request.mutable_shape()->set_batch(batch);
  request.mutable_shape()->set_rows(rows);
  request.mutable_shape()->set_cols(cols);
  return request;
}

v1::TransposeRequest WithData(v1::TransposeRequest request, size_t bytes) {
  request.set_data(std::string(bytes, '\x5a'));
  return request;
}

v1::TransposeRequest DataOnly(size_t bytes) {
  return WithData(v1::TransposeRequest(), bytes);
}

TEST_F(ServiceTest, EveryDtypeAndShapeUnaryAndStreamed) {
  const MatrixShape shapes[] = {{1, 1, 1},  {1, 1, 257}, {1, 257, 1},
                                {1, 7, 13}, {1, 97, 89}, {3, 65, 129},
                                {5, 1, 3}};
  for (DataType dtype : AllDataTypes()) {
    for (const MatrixShape& shape : shapes) {
      ExpectRoundTrip(dtype, shape, /*force_stream=*/false);
      ExpectRoundTrip(dtype, shape, /*force_stream=*/true);
    }
  }
}

TEST_F(ServiceTest, StreamsAMatrixLargerThanTheUnaryLimit) {
  // 1013 x 1019 float64 is about 7.9 MiB, eight times the server's unary limit.
  ExpectRoundTrip(DataType::kFloat64, {1, 1013, 1019}, /*force_stream=*/false);
  ExpectRoundTrip(DataType::kUInt8, {4, 1031, 1021}, /*force_stream=*/false);
}

// The result may overwrite the input: the input is sent whole before any of
// the result arrives.
TEST_F(ServiceTest, TransposeIntoTheInputsOwnBuffer) {
  const MatrixShape shape = MatrixShape::Matrix(1013, 1019);  // 3.9 MiB.
  for (const bool force_stream : {false, true}) {
    std::vector<uint8_t> data =
        RandomBytes(shape.elements() * 4, shape.elements());
    const std::vector<uint8_t> expected = ReferenceTranspose(data, 4, shape);
    CallOptions call;
    call.force_stream = force_stream;
    absl::StatusOr<TransposeStats> stats = client_->TransposeInto(
        {DataType::kFloat32, shape, data}, absl::MakeSpan(data), call);
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_TRUE(data == expected) << force_stream;
  }
  const MatrixShape small = MatrixShape::Matrix(31, 33);  // Unary.
  std::vector<uint8_t> data = RandomBytes(small.elements() * 2, 7);
  const std::vector<uint8_t> expected = ReferenceTranspose(data, 2, small);
  ASSERT_TRUE(
      client_
          ->TransposeInto({DataType::kInt16, small, data}, absl::MakeSpan(data))
          .ok());
  EXPECT_TRUE(data == expected);
}

// A call's timeout: unset is the client's default, infinite is none, and zero
// or less has passed already. A passed one says so, and how long it was.
TEST_F(ServiceTest, TimeoutsSayWhichDeadlinePassed) {
  const MatrixShape shape = MatrixShape::Matrix(1013, 1019);  // 7.9 MiB.
  const std::vector<uint8_t> input =
      RandomBytes(shape.elements() * 8, shape.elements());
  for (const absl::Duration timeout :
       {absl::ZeroDuration(), absl::Milliseconds(-5), absl::Milliseconds(1)}) {
    int progress_calls = 0;
    CallOptions call;
    call.timeout = timeout;
    call.on_progress = [&](const TransferProgress&) { ++progress_calls; };
    absl::StatusOr<TransposeResult> result =
        client_->Transpose({DataType::kFloat64, shape, input}, call);
    EXPECT_EQ(result.status().code(), absl::StatusCode::kDeadlineExceeded)
        << timeout << ": " << result.status();
    EXPECT_THAT(
        result.status().message(),
        HasSubstr(absl::StrCat("(the call's timeout of ",
                               absl::FormatDuration(timeout), " passed")));
    // Passed before the call: nothing sent.
    if (timeout <= absl::ZeroDuration()) EXPECT_EQ(progress_calls, 0);
  }
  CallOptions no_deadline;
  no_deadline.timeout = absl::InfiniteDuration();
  absl::StatusOr<TransposeResult> result =
      client_->Transpose({DataType::kFloat64, shape, input}, no_deadline);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->data == ReferenceTranspose(input, 8, shape));
}

TEST_F(ServiceTest, EveryAlgorithmTheBackendHas) {
  for (kernels::Algorithm algorithm : kernels::AllAlgorithms()) {
    if (!GpuBackend() && algorithm != kernels::Algorithm::kAuto) {
      v1::TransposeRequest request =
          WithData(Header(v1::DATA_TYPE_FLOAT32, 2, 2), 16);
      request.set_algorithm(static_cast<v1::Algorithm>(algorithm));
      grpc::Status status = Unary(request);
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
      EXPECT_THAT(status.error_message(),
                  HasSubstr(kernels::AlgorithmName(algorithm)));
      continue;
    }
    ExpectRoundTrip(DataType::kFloat32, {2, 131, 67}, false, algorithm);
    ExpectRoundTrip(DataType::kInt16, {1, 300, 501}, true, algorithm);
  }
}

TEST_F(ServiceTest, BadUnaryRequestsAreInvalidArgument) {
  struct Case {
    std::string name;
    v1::TransposeRequest request;
    std::string message;
  };
  v1::TransposeRequest unknown_algorithm =
      WithData(Header(v1::DATA_TYPE_FLOAT32, 2, 2), 16);
  unknown_algorithm.set_algorithm(static_cast<v1::Algorithm>(77));
  const Case cases[] = {
      {"unspecified dtype",
       WithData(Header(v1::DATA_TYPE_UNSPECIFIED, 2, 2), 16), "unspecified"},
      {"unknown dtype",
       WithData(Header(static_cast<v1::DataType>(99), 2, 2), 16), "99"},
      {"zero rows", WithData(Header(v1::DATA_TYPE_FLOAT32, 0, 2), 0), "zero"},
      {"zero cols", WithData(Header(v1::DATA_TYPE_FLOAT32, 2, 0), 0), "zero"},
      {"overflow",
       WithData(
           Header(v1::DATA_TYPE_FLOAT32, uint64_t{1} << 32, uint64_t{1} << 31),
           4),
       "overflows"},
      {"overflow by batch",
       WithData(Header(v1::DATA_TYPE_UINT8, uint64_t{1} << 32,
                       uint64_t{1} << 16, 1 << 16),
                4),
       "overflows"},
      {"data short", WithData(Header(v1::DATA_TYPE_FLOAT32, 3, 3), 35),
       "shorter than declared"},
      {"data long", WithData(Header(v1::DATA_TYPE_FLOAT32, 3, 3), 37),
       "longer than declared"},
      {"no data", Header(v1::DATA_TYPE_INT8, 3, 3), "shorter than declared"},
      {"no header", DataOnly(16), "before the header"},
  };
  for (const Case& c : cases) {
    grpc::Status status = Unary(c.request);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.name;
    EXPECT_THAT(status.error_message(), HasSubstr(c.message)) << c.name;
    ExpectStillServing();
  }
  // An algorithm newer than the server is no malformed request: a client can
  // tell it from one and fall back.
  const grpc::Status unknown = Unary(unknown_algorithm);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  EXPECT_THAT(unknown.error_message(), HasSubstr("algorithm 77 is unknown"));
  ExpectStillServing();
  // Bytes that are no TransposeRequest at all (a truncated field): gRPC's own
  // deserialization would have answered UNIMPLEMENTED with no message.
  const grpc::Status garbage =
      RawUnary("/transpose.v1.TransposeService/Transpose", "\x1a\x7f\x01");
  EXPECT_EQ(garbage.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_FALSE(garbage.error_message().empty());
  ExpectStillServing();
}

TEST_F(ServiceTest, BadStreamsAreInvalidArgument) {
  v1::TransposeRequest other_header = Header(v1::DATA_TYPE_FLOAT32, 4, 3);
  struct Case {
    std::string name;
    std::vector<v1::TransposeRequest> messages;
    std::string message;
  };
  const Case cases[] = {
      {"data before header",
       {DataOnly(8), WithData(Header(v1::DATA_TYPE_FLOAT32, 2, 2), 8)},
       "before the header"},
      {"header repeated with other values",
       {WithData(Header(v1::DATA_TYPE_FLOAT32, 3, 4), 24),
        WithData(other_header, 24)},
       "header repeated with other values"},
      {"dtype changed",
       {WithData(Header(v1::DATA_TYPE_FLOAT32, 3, 4), 24),
        Header(v1::DATA_TYPE_INT32, 3, 4)},
       "header repeated with other values"},
      {"long",
       {WithData(Header(v1::DATA_TYPE_FLOAT32, 3, 4), 40), DataOnly(9)},
       "longer than declared"},
      {"short",
       {WithData(Header(v1::DATA_TYPE_FLOAT32, 3, 4), 40), DataOnly(7)},
       "shorter than declared"},
      {"empty", {}, "no header"},
      {"zero dimension", {Header(v1::DATA_TYPE_FLOAT32, 3, 0)}, "zero"},
  };
  // Counted as such too, the short and empty uploads included (the call is
  // recorded once gRPC is done with it, and was not cancelled).
  const std::string refused =
      "transpose_requests_total{code=\"INVALID_ARGUMENT\","
      "method=\"TransposeStream\"}";
  const double refused_before = server_->Metric(refused).value_or(0);
  for (const Case& c : cases) {
    grpc::Status status = Stream(c.messages);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.name;
    EXPECT_THAT(status.error_message(), HasSubstr(c.message)) << c.name;
    ExpectStillServing();
  }
  const double refused_now = refused_before + std::size(cases);
  EXPECT_EQ(server_->AwaitMetric(refused, refused_now), refused_now);
  // The same header twice is fine.
  const v1::TransposeRequest header = Header(v1::DATA_TYPE_UINT8, 2, 2);
  EXPECT_TRUE(Stream({WithData(header, 2), WithData(header, 2)}).ok());
}

// The result can be out before the client has sent all it means to: the call
// ends only at the half-close, so data after it is still refused.
TEST_F(ServiceTest, DataSentAfterTheResultIsInvalidArgument) {
  for (const bool extra : {true, false}) {
    grpc::ClientContext context;
    auto stream = stub_->TransposeStream(&context);
    ASSERT_TRUE(
        stream->Write(WithData(Header(v1::DATA_TYPE_FLOAT32, 3, 4), 48)));
    v1::TransposeResponse response;
    uint64_t received = 0;
    do {
      ASSERT_TRUE(stream->Read(&response)) << stream->Finish().error_message();
      received += response.data().size();
    } while (!response.has_stats());
    EXPECT_EQ(received, 48u);
    if (extra) EXPECT_TRUE(stream->Write(DataOnly(2)));
    stream->WritesDone();
    EXPECT_FALSE(stream->Read(&response));
    const grpc::Status status = stream->Finish();
    if (extra) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_THAT(status.error_message(), HasSubstr("longer than declared"));
    } else {
      EXPECT_TRUE(status.ok()) << status.error_message();
    }
  }
  ExpectStillServing();
}

TEST_F(ServiceTest, OverTheLimitsIsResourceExhausted) {
  // A unary message past --max_message_bytes: gRPC refuses it on receipt.
  grpc::Status unary =
      Unary(WithData(Header(v1::DATA_TYPE_UINT8, 1024, 2048), 2 << 20));
  EXPECT_EQ(unary.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  ExpectStillServing();
  // Data just past the limit fits in gRPC's room for the header fields; the
  // service refuses it, in a unary call or a stream chunk alike, and counts
  // the refusals. At the limit it passes.
  const auto refused = [](const char* method) {
    return absl::StrCat(
        "transpose_requests_total{code=\"RESOURCE_EXHAUSTED\",method=\"",
        method, "\"}");
  };
  const double unary_refused =
      server_->Metric(refused("Transpose")).value_or(-1);
  const double stream_refused =
      server_->Metric(refused("TransposeStream")).value_or(-1);
  EXPECT_TRUE(
      Unary(WithData(Header(v1::DATA_TYPE_UINT8, 1024, 1024), kUnaryLimit))
          .ok());
  for (const grpc::Status& status :
       {Unary(WithData(Header(v1::DATA_TYPE_UINT8, 1025, 1024),
                       kUnaryLimit + 1024)),
        Stream({WithData(Header(v1::DATA_TYPE_UINT8, 1025, 1024),
                         kUnaryLimit + 1024)})}) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(status.error_message(),
                HasSubstr(absl::StrCat("limit of ", kUnaryLimit,
                                       " bytes per message")));
  }
  EXPECT_EQ(server_->AwaitMetric(refused("Transpose"), unary_refused + 1),
            unary_refused + 1);
  EXPECT_EQ(
      server_->AwaitMetric(refused("TransposeStream"), stream_refused + 1),
      stream_refused + 1);
  ExpectStillServing();
  // A stream declaring more than --max_matrix_bytes: refused at the header,
  // before any data.
  grpc::Status stream = Stream({Header(v1::DATA_TYPE_FLOAT32, 8192, 4096)});
  EXPECT_EQ(stream.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(stream.error_message(), HasSubstr("limit"));
  ExpectStillServing();
}

// gRPC retry policies (gRFC A6) that list RESOURCE_EXHAUSTED would otherwise
// send an oversized matrix again and again: a final refusal says not to.
TEST_F(ServiceTest, FinalRefusalsTellRetryPoliciesNotToRetry) {
  const auto pushback = [](const grpc::ClientContext& context) {
    const auto& trailers = context.GetServerTrailingMetadata();
    const auto found = trailers.find(api::kRetryPushbackKey);
    return found == trailers.end()
               ? std::string("none")
               : std::string(found->second.data(), found->second.size());
  };
  {
    grpc::ClientContext context;
    v1::TransposeResponse response;
    const grpc::Status status = stub_->Transpose(
        &context,
        WithData(Header(v1::DATA_TYPE_UINT8, 1025, 1024), kUnaryLimit + 1024),
        &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(pushback(context), "-1");
  }
  {
    grpc::ClientContext context;
    auto stream = stub_->TransposeStream(&context);
    stream->Write(Header(v1::DATA_TYPE_FLOAT32, 8192, 4096));
    stream->WritesDone();
    v1::TransposeResponse response;
    while (stream->Read(&response)) {
    }
    EXPECT_EQ(stream->Finish().error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_EQ(pushback(context), "-1");
  }
  // Bad input is not retried by policies anyway, and says nothing.
  {
    grpc::ClientContext context;
    v1::TransposeResponse response;
    const grpc::Status status =
        stub_->Transpose(&context, v1::TransposeRequest(), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(pushback(context), "none");
  }
}

// A refusal is a Trailers-Only response, with no headers before its status,
// so a gRPC retry policy (gRFC A6) that lists its code retries it: custom
// response headers would commit the call to its first attempt.
TEST_F(ServiceTest, RefusalsReachRetryPoliciesAsTrailersOnly) {
  grpc::ChannelArguments args;
  args.SetServiceConfigJSON(R"({"methodConfig": [{
      "name": [{"service": "transpose.v1.TransposeService"}],
      "retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.01s",
                      "maxBackoff": "0.01s", "backoffMultiplier": 1,
                      "retryableStatusCodes": ["INVALID_ARGUMENT"]}}]})");
  auto stub = v1::TransposeService::NewStub(grpc::CreateCustomChannel(
      server_->address(), grpc::InsecureChannelCredentials(), args));
  const std::string refusals =
      "transpose_requests_total{code=\"INVALID_ARGUMENT\",method="
      "\"Transpose\"}";
  // The refusals of the tests before may still be counting (a call is
  // counted once gRPC is done with it): the count from which it holds still.
  double before = server_->Metric(refusals).value_or(0);
  for (double last = -1; last != before;) {
    last = before;
    absl::SleepFor(absl::Milliseconds(200));
    before = server_->Metric(refusals).value_or(0);
  }
  grpc::ClientContext context;
  v1::TransposeResponse response;
  EXPECT_EQ(
      stub->Transpose(&context, v1::TransposeRequest(), &response).error_code(),
      grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(server_->AwaitMetric(refusals, before + 3), before + 3);
}

TEST_F(ServiceTest, ConcurrentClientsAllGetTheirOwnResults) {
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([t, &failures] {
      for (int i = 0; i < 20; ++i) {
        const DataType dtype = AllDataTypes()[(t + i) % AllDataTypes().size()];
        const MatrixShape shape{1 + static_cast<uint64_t>(i % 3),
                                31 + 17 * static_cast<uint64_t>(t),
                                29 + 41 * static_cast<uint64_t>(i)};
        const size_t size = ElementSize(dtype);
        const std::vector<uint8_t> input =
            RandomBytes(shape.elements() * size, t * 100 + i);
        CallOptions call;
        call.force_stream = (i % 2) == 1;
        absl::StatusOr<TransposeResult> result =
            client_->Transpose({dtype, shape, input}, call);
        if (!result.ok() ||
            result->data != ReferenceTranspose(input, size, shape)) {
          ++failures;
          ADD_FAILURE() << DataTypeName(dtype) << " " << ShapeToString(shape)
                        << ": "
                        << (result.ok() ? "wrong result"
                                        : result.status().ToString());
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures, 0);
}

// With several devices (the GPU machine's two-GPU kind), concurrent requests
// spread over all of them, and each gives correct results.
TEST_F(ServiceTest, ConcurrentRequestsUseEveryDevice) {
  absl::StatusOr<v1::ServerInfo> info = client_->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  if (info->backends_size() < 2) {
    GTEST_SKIP() << "the server has one device (" << info->backends(0).name()
                 << "); this needs two or more";
  }
  const std::string metrics_url =
      absl::StrCat("http://127.0.0.1:", server_->metrics_port(), "/metrics");
  auto kernel_bytes = [&] {
    absl::StatusOr<std::string> text = FetchUrl(metrics_url);
    EXPECT_TRUE(text.ok()) << text.status();
    absl::StatusOr<MetricSamples> samples =
        ParseMetricsText(text.ok() ? *text : "");
    std::map<std::string, double> bytes;
    for (const v1::Backend& backend : info->backends()) {
      const std::string name = absl::StrCat(
          "transpose_kernel_bytes_total{backend=\"", backend.name(), "\"}");
      bytes[backend.name()] =
          samples.ok() && samples->count(name) ? samples->at(name) : -1;
    }
    return bytes;
  };
  const std::map<std::string, double> before = kernel_bytes();
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 2 * info->backends_size(); ++t) {
    threads.emplace_back([t, &failures] {
      const MatrixShape shape{1, 1000 + static_cast<uint64_t>(t), 1024};
      for (int i = 0; i < 8; ++i) {
        const std::vector<uint8_t> input =
            RandomBytes(shape.elements() * 4, 1000 * t + i);
        absl::StatusOr<TransposeResult> result =
            client_->Transpose({DataType::kFloat32, shape, input});
        if (!result.ok() ||
            result->data != ReferenceTranspose(input, 4, shape)) {
          ++failures;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failures, 0);
  const std::map<std::string, double> after = kernel_bytes();
  for (const auto& [name, bytes] : after) {
    EXPECT_GT(bytes, before.at(name)) << name << " took no work";
  }
}

TEST_F(ServiceTest, GetServerInfoReportsBackendsAndLimits) {
  absl::StatusOr<v1::ServerInfo> info = client_->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_FALSE(info->version().empty());
  ASSERT_GE(info->backends_size(), 1);
  EXPECT_EQ(info->backends(0).name(), GpuBackend() ? "cuda:0" : "cpu");
  EXPECT_TRUE(info->backends(0).healthy());
  EXPECT_GT(info->backends(0).calibrated_copy_bandwidth_bytes_per_second(), 0);
  EXPECT_GT(info->backends(0).total_memory_bytes(), uint64_t{1} << 30);
  EXPECT_EQ(info->limits().max_message_bytes(), kUnaryLimit);
  EXPECT_EQ(info->limits().max_matrix_bytes(), kMatrixLimit);
  EXPECT_EQ(info->limits().max_inflight_bytes(), kInflightBytesLimit);
  EXPECT_EQ(info->limits().max_inflight_requests(), kInflightRequestsLimit);
  EXPECT_EQ(info->limits().max_inflight_bytes_per_peer(),
            kInflightBytesPerPeer);
  EXPECT_EQ(info->limits().max_inflight_requests_per_peer(),
            kInflightRequestsPerPeer);
  EXPECT_EQ(info->limits().stream_idle_seconds(), kStreamIdleSeconds);
}

TEST_F(ServiceTest, HealthAnswers) {
  EXPECT_EQ(client_->CheckHealth("").value_or(false), true);
  EXPECT_EQ(
      client_->CheckHealth("transpose.v1.TransposeService").value_or(false),
      true);
  EXPECT_EQ(client_->CheckHealth("no.such.Service").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ServiceTest, ReflectionListsTheServices) {
  absl::StatusOr<std::vector<std::string>> names =
      testing::ListServices(client_->channel());
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names, ::testing::IsSupersetOf({"transpose.v1.TransposeService",
                                               "grpc.health.v1.Health"}));
}

// The id a call carries (the caller's or the library's own) ends the message
// of its failure and the server's log lines about it, so one can be found from
// the other; one that a raw client makes up is escaped there.
TEST(RequestIdTest, NamesACallInItsErrorAndInTheServersLog) {
  const ServerLog log;
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::StartFromEnvironment(
          {"--max_matrix_bytes=1024", "--log_level=debug",
           "--unready_seconds=0"},
          absl::Seconds(60), log.path());
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions options;
  options.target = (*server)->address();
  std::unique_ptr<Client> client = *Client::Create(options);
  const std::vector<uint8_t> over(2048, 1);
  const MatrixView too_large{DataType::kUInt8, {1, 32, 64}, over};

  CallOptions named;
  named.request_id = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  for (const bool stream : {false, true}) {
    named.force_stream = stream;
    const absl::Status refused = client->Transpose(too_large, named).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(
        std::string(refused.message()),
        ::testing::EndsWith(absl::StrCat(" [request ", named.request_id, "]")));
  }
  // Without one, the library makes one up, different for each call.
  std::vector<std::string> made_up;
  for (int i = 0; i < 2; ++i) {
    const absl::Status refused = client->Transpose(too_large).status();
    const std::string message(refused.message());
    std::smatch id;
    ASSERT_TRUE(std::regex_search(
        message, id, std::regex(R"( \[request ([0-9a-f]{16})\]$)")))
        << refused;
    made_up.push_back(id[1]);
  }
  EXPECT_NE(made_up[0], made_up[1]);
  const std::vector<uint8_t> fits(512, 1);
  named.force_stream = false;
  named.request_id = "fits-1";
  EXPECT_TRUE(
      client->Transpose({DataType::kUInt8, {1, 16, 32}, fits}, named).ok());
  // An id the library would not send is refused before anything is sent.
  named.request_id = "two words";
  EXPECT_EQ(client->Transpose({DataType::kUInt8, {1, 16, 32}, fits}, named)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // The trailers carry the call's id: a raw client's own, or a new one where
  // it sent none, or one with a space, or one far too long (those two are
  // quoted in the log, escaped and cut).
  // Their eight failures log in a window of their own: the server logs at
  // most ten a second. The unary calls above are counted and logged once their
  // reply is out, which may be after their caller has it: the window starts
  // after the last of them.
  EXPECT_EQ(
      (*server)->AwaitMetric("transpose_requests_total{code="
                             "\"RESOURCE_EXHAUSTED\",method=\"Transpose\"}",
                             3),
      3);
  EXPECT_EQ(
      (*server)->AwaitMetric(
          "transpose_requests_total{code=\"OK\",method=\"Transpose\"}", 1),
      1);
  absl::SleepFor(absl::Milliseconds(1100));
  std::vector<std::string> returned;
  for (const std::optional<std::string>& sent :
       {std::optional<std::string>("raw-1"), std::optional<std::string>(),
        std::optional<std::string>("two \"words\""),
        std::optional<std::string>(std::string(300, 'x'))}) {
    for (const bool stream : {false, true}) {
      grpc::ClientContext context;
      if (sent.has_value()) context.AddMetadata(api::kRequestIdKey, *sent);
      std::unique_ptr<v1::TransposeService::Stub> stub =
          v1::TransposeService::NewStub(client->channel());
      grpc::Status status;
      if (stream) {
        auto call = stub->TransposeStream(&context);
        call->WritesDone();
        v1::TransposeResponse response;
        while (call->Read(&response)) {
        }
        status = call->Finish();
      } else {
        v1::TransposeResponse response;
        status = stub->Transpose(&context, v1::TransposeRequest(), &response);
      }
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << status.error_message();
      const auto& trailers = context.GetServerTrailingMetadata();
      const auto found = trailers.find(api::kRequestIdKey);
      ASSERT_NE(found, trailers.end()) << "stream " << stream;
      const std::string id(found->second.data(), found->second.size());
      if (sent == "raw-1") {
        EXPECT_EQ(id, "raw-1");
      } else {
        EXPECT_THAT(id, ::testing::MatchesRegex("[0-9a-f]{16}"));
        returned.push_back(id);
      }
    }
  }
  ASSERT_EQ(returned.size(), 6);
  EXPECT_EQ(std::set<std::string>(returned.begin(), returned.end()).size(), 6);

  const std::string text = (*server)->Stop(SIGTERM) == 0 ? log.Read() : "";
  for (const std::string& method : {"Transpose", "TransposeStream"}) {
    EXPECT_THAT(text,
                ::testing::ContainsRegex(absl::StrCat(
                    method,
                    " from [^ ]+ failed after [0-9.]+s: "
                    "RESOURCE_EXHAUSTED: .* \\[request "
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-"
                    "01\\]")));
  }
  for (const std::string& id : made_up) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("[request ", id, "]")));
  }
  EXPECT_THAT(text, ::testing::ContainsRegex(
                        "Transpose from [^ ]+ ok in [0-9.]+s \\[request "
                        "fits-1\\]"));
  EXPECT_THAT(text, HasSubstr("[request raw-1]"));
  for (int i = 0; i < 2; ++i) {
    EXPECT_THAT(text, HasSubstr(absl::StrCat("[request ", returned[i], "]")));
    EXPECT_THAT(text, HasSubstr(absl::StrCat(
                          "[request ", returned[2 + i],
                          "; the client sent \"two \\\"words\\\"\", not a "
                          "valid id]")));
    EXPECT_THAT(text, HasSubstr(absl::StrCat(
                          "[request ", returned[4 + i], "; the client sent \"",
                          std::string(128, 'x'), "\", not a valid id]")));
  }
  EXPECT_THAT(text, ::testing::Not(HasSubstr(std::string(129, 'x'))));
}

// ClientOptions::connections: calls made one at a time, unary and streamed,
// keep to one connection; calls at once take a connection each, up to the
// client's, each a TCP connection of its own (the server's log names each
// call's peer).
TEST(ConnectionsTest, CallsAtOnceSpreadOverTheClientsConnections) {
  const ServerLog log;
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::StartFromEnvironment(
          {"--log_level=debug", "--unready_seconds=0"}, absl::Seconds(60),
          log.path());
  ASSERT_TRUE(server.ok()) << server.status();
  ClientOptions options;
  options.target = (*server)->address();
  options.connections = 3;
  std::unique_ptr<Client> client = *Client::Create(options);
  const MatrixShape shape{1, 64, 96};
  const auto transpose = [&client, &shape](const std::string& id, bool stream,
                                           std::function<void()> on_progress) {
    const std::vector<uint8_t> input =
        RandomBytes(shape.elements() * 2, std::hash<std::string>()(id));
    CallOptions call;
    call.force_stream = stream;
    call.request_id = id;
    if (on_progress) {
      call.on_progress = [&on_progress](const TransferProgress&) {
        on_progress();
      };
    }
    absl::StatusOr<TransposeResult> result =
        client->Transpose({DataType::kInt16, shape, input}, call);
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->data, ReferenceTranspose(input, 2, shape));
  };
  for (int i = 0; i < 6; ++i) {
    transpose(absl::StrCat("one-at-a-time-", i), i % 2 == 1, nullptr);
  }
  // Four streamed calls at once: each holds its connection until all four
  // have sent their first chunk, so the fourth shares one.
  std::mutex mutex;
  std::condition_variable all_sent;
  int sent = 0;
  const auto wait_for_all = [&] {
    std::unique_lock<std::mutex> lock(mutex);
    if (++sent == 4) all_sent.notify_all();
    all_sent.wait_for(lock, std::chrono::seconds(30),
                      [&sent] { return sent >= 4; });
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      bool waited = false;
      transpose(absl::StrCat("at-once-", i), true, [&] {
        if (!std::exchange(waited, true)) wait_for_all();
      });
    });
  }
  for (std::thread& thread : threads) thread.join();

  const std::string text = (*server)->Stop(SIGTERM) == 0 ? log.Read() : "";
  std::map<std::string, std::set<std::string>> peers;
  std::map<std::string, int> calls;
  const std::regex line(
      R"(Transpose(?:Stream)? from (\S+) ok in [0-9.]+s \[request ([a-z-]+)-\d\])");
  for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end;
       ++it) {
    peers[(*it)[2]].insert((*it)[1]);
    ++calls[(*it)[2]];
  }
  EXPECT_EQ(calls["one-at-a-time"], 6) << text;
  EXPECT_EQ(calls["at-once"], 4) << text;
  EXPECT_EQ(peers["one-at-a-time"].size(), 1) << text;
  EXPECT_EQ(peers["at-once"].size(), 3) << text;
}

}  // namespace
}  // namespace transpose
