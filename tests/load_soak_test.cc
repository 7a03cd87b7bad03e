// Bounded load and soak against the real server binary (CPU backend): many
// concurrent clients with mixed sizes and data types, every result checked, no
// errors; and thousands of requests with cancellations and bad requests mixed
// in, with the server's resident memory flat. Each test prints its figures
// (docs/RELIABILITY.md records them).
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/reference_transpose.h"
#include "tests/server_process.h"
#include "transpose/v1/transpose.grpc.pb.h"

namespace transpose {
namespace {

using testing::ReferenceTranspose;
using testing::ServerProcess;

std::unique_ptr<ServerProcess> Start() {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::StartFromEnvironment({"--buffer_pool_bytes=67108864"});
  EXPECT_TRUE(server.ok()) << server.status();
  return server.ok() ? *std::move(server) : nullptr;
}

std::unique_ptr<Client> Connect(const ServerProcess& server) {
  ClientOptions options;
  options.target = server.address();
  options.default_timeout = absl::Seconds(60);
  return *Client::Create(options);
}

TEST(LoadTest, ManyClientsMixedSizesAndTypesAllCorrect) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  std::atomic<uint64_t> requests{0}, bytes{0}, errors{0};
  const absl::Time start = absl::Now();
  std::vector<std::thread> threads;
  for (int t = 0; t < 24; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int i = 0; i < 25; ++i) {
        const DataType dtype = AllDataTypes()[rng() % AllDataTypes().size()];
        // Mostly small, some up to a few MiB (streamed), some batched.
        const bool large = rng() % 8 == 0;
        const MatrixShape shape{1 + rng() % 3, 1 + rng() % (large ? 1500 : 200),
                                1 + rng() % (large ? 1500 : 200)};
        const size_t size = ElementSize(dtype);
        std::vector<uint8_t> input(shape.elements() * size);
        for (uint8_t& b : input) b = static_cast<uint8_t>(rng());
        CallOptions call;
        call.force_stream = rng() % 2 == 0;
        absl::StatusOr<TransposeResult> result =
            client->Transpose({dtype, shape, input}, call);
        if (!result.ok() ||
            result->data != ReferenceTranspose(input, size, shape)) {
          ++errors;
          ADD_FAILURE() << DataTypeName(dtype) << " " << ShapeToString(shape)
                        << ": "
                        << (result.ok() ? "wrong result"
                                        : result.status().ToString());
          continue;
        }
        ++requests;
        bytes += 2 * input.size();
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  std::printf(
      "load: %llu requests, %.1f MiB moved, %llu errors, 24 clients, %.1f s\n",
      static_cast<unsigned long long>(requests.load()),
      bytes.load() / 1048576.0, static_cast<unsigned long long>(errors.load()),
      seconds);
  EXPECT_EQ(errors, 0u);
  EXPECT_EQ(requests, 24u * 25);
}

double Mean(const double* begin, const double* end) {
  return std::accumulate(begin, end, 0.0) / (end - begin);
}
double EarlierHalfMean(const std::vector<double>& v) {
  return Mean(v.data(), v.data() + v.size() / 2);
}
double LaterHalfMean(const std::vector<double>& v) {
  return Mean(v.data() + v.size() - v.size() / 2, v.data() + v.size());
}

TEST(SoakTest, MemoryStaysFlatThroughRequestsCancellationsAndBadInput) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  auto client = Connect(*server);
  auto stub = v1::TransposeService::NewStub(client->channel());
  std::atomic<uint64_t> ok{0}, cancelled{0}, rejected{0}, unexpected{0};

  auto run = [&](int thread, int iterations) {
    std::mt19937 rng(1000 + thread);
    for (int i = 0; i < iterations; ++i) {
      const int kind = rng() % 20;
      if (kind < 14) {  // A good request, up to 4 MiB, checked.
        const MatrixShape shape{1, 1 + rng() % 1024, 1 + rng() % 1024};
        const std::vector<uint8_t> input = testing::RandomBytes(
            shape.elements() * 4, static_cast<uint32_t>(thread * 100000 + i));
        absl::StatusOr<TransposeResult> result =
            client->Transpose({DataType::kFloat32, shape, input});
        if (result.ok() &&
            result->data == ReferenceTranspose(input, 4, shape)) {
          ++ok;
        } else {
          ++unexpected;
          ADD_FAILURE() << ShapeToString(shape) << ": "
                        << (result.ok() ? "wrong result"
                                        : result.status().ToString());
        }
      } else if (kind < 17) {  // Cancelled mid-upload.
        grpc::ClientContext context;
        auto stream = stub->TransposeStream(&context);
        v1::TransposeRequest header;
        header.set_dtype(v1::DATA_TYPE_FLOAT32);
        header.mutable_shape()->set_rows(512);
        header.mutable_shape()->set_cols(512);
        header.set_data(std::string(1 << 19, '\1'));
        stream->Write(header);
        context.TryCancel();
        stream->Finish();
        ++cancelled;
      } else {  // Malformed: the declared size and the data disagree.
        v1::TransposeRequest bad;
        bad.set_dtype(v1::DATA_TYPE_INT16);
        bad.mutable_shape()->set_rows(100);
        bad.mutable_shape()->set_cols(100);
        bad.set_data(std::string(19999, '\2'));
        grpc::ClientContext context;
        v1::TransposeResponse response;
        if (stub->Transpose(&context, bad, &response).error_code() ==
            grpc::StatusCode::INVALID_ARGUMENT) {
          ++rejected;
        } else {
          ++unexpected;
        }
      }
    }
  };
  auto round = [&](int iterations) {
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) threads.emplace_back(run, t, iterations);
    for (std::thread& thread : threads) thread.join();
  };

  // Warm-up: the buffer pools fill up to their cap (64 MiB here), allocator
  // arenas settle. With the CUDA backend on the H200, resident memory was
  // still climbing for about 4000 requests (e.g. 328 MiB after 1200, then
  // 416 and 415 after 2800 and 4400, 430-476 from then on): a shorter warm-up
  // put part of that climb inside the comparison.
  round(450);
  const uint64_t warm_requests = ok + cancelled + rejected + unexpected;
  const double warm = static_cast<double>(server->ResidentBytes());
  // Rounds of 1600 requests after it; TRANSPOSE_SOAK_ROUNDS makes the soak
  // longer.
  int rounds = 6;
  if (const char* env = std::getenv("TRANSPOSE_SOAK_ROUNDS"))
    ASSERT_TRUE(absl::SimpleAtoi(env, &rounds) && rounds >= 2) << env;
  const absl::Time start = absl::Now();
  std::vector<double> readings;
  for (int r = 0; r < rounds; ++r) {
    round(200);
    readings.push_back(static_cast<double>(server->ResidentBytes()));
  }
  const uint64_t total = ok + cancelled + rejected + unexpected - warm_requests;
  std::string trace;
  for (double reading : readings)
    absl::StrAppendFormat(&trace, " %.1f", reading / 1048576.0);
  std::printf(
      "soak: %llu requests after %llu of warm-up (%llu ok, %llu cancelled, "
      "%llu bad input rejected, %llu unexpected in all) in %.1f s; server "
      "resident memory %.1f MiB after the warm-up, then after each round of "
      "1600 (MiB):%s; later half over the earlier half %+.1f MiB\n",
      static_cast<unsigned long long>(total),
      static_cast<unsigned long long>(warm_requests),
      static_cast<unsigned long long>(ok.load()),
      static_cast<unsigned long long>(cancelled.load()),
      static_cast<unsigned long long>(rejected.load()),
      static_cast<unsigned long long>(unexpected.load()),
      absl::ToDoubleSeconds(absl::Now() - start), warm / 1048576.0,
      trace.c_str(),
      (LaterHalfMean(readings) - EarlierHalfMean(readings)) / 1048576.0);
  EXPECT_EQ(unexpected, 0u);
  EXPECT_EQ(total, 8u * 200 * rounds);
  EXPECT_GT(warm, 0);
  // The bound: the later rounds' mean within 32 MiB of the earlier rounds'.
  // Single readings cannot be compared: taken between rounds, with the server
  // idle, they still swing by ~10-25 MiB on the CPU backend and by up to 47 MiB
  // with the CUDA backend (22,400 requests on the H200: 375-423 MiB, no
  // trend). A server build leaking an input and output's worth in one job of
  // a hundred measured +79 MiB here; with the CUDA backend (one pinned buffer
  // per job) such a leak would come to about half that, near the bound.
  EXPECT_LT(LaterHalfMean(readings) - EarlierHalfMean(readings),
            32.0 * 1048576);
}

}  // namespace
}  // namespace transpose
