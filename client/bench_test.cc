#include "client/bench.h"

#include <memory>
#include <vector>

#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace transpose {
namespace {

TEST(NearestRankPercentileTest, TakesTheSmallestValueWithPAtOrBelowIt) {
  std::vector<double> hundred;
  for (int i = 1; i <= 100; ++i) hundred.push_back(i);
  EXPECT_EQ(NearestRankPercentile(hundred, 0.50), 50);
  EXPECT_EQ(NearestRankPercentile(hundred, 0.90), 90);
  EXPECT_EQ(NearestRankPercentile(hundred, 0.99), 99);
  EXPECT_EQ(NearestRankPercentile(hundred, 1.0), 100);
  // Few samples: p99 of ten is the largest, p50 of two the smaller.
  const std::vector<double> ten = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(NearestRankPercentile(ten, 0.90), 9);
  EXPECT_EQ(NearestRankPercentile(ten, 0.99), 10);
  EXPECT_EQ(NearestRankPercentile({1, 2}, 0.50), 1);
  EXPECT_EQ(NearestRankPercentile({7}, 0.01), 7);
  EXPECT_EQ(NearestRankPercentile({}, 0.5), 0);
}

// 1 PiB of uint8: more than any machine holds, and no server is asked.
BenchOptions PetabyteBench() {
  BenchOptions options;
  options.dtype = DataType::kUInt8;
  options.shape = MatrixShape::Matrix(uint64_t{1} << 25, uint64_t{1} << 25);
  options.count = 1;
  return options;
}

TEST(CheckBenchMemoryTest, BuffersOverTheMemoryLeftAreThisProcesssRefusal) {
  const absl::Status status = CheckBenchMemory(PetabyteBench());
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_TRUE(IsInThisProcess(status)) << status;
  EXPECT_EQ(StatusText(status), status.message());
}

// Where the check did not foresee the memory (another process took it), the
// buffers' allocation fails as this process's failure, not the server's
// RESOURCE_EXHAUSTED.
TEST(RunBenchTest, BuffersThatDoNotFitInMemoryAreThisProcesssFailure) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's operator new stops the process instead "
                  "of throwing std::bad_alloc";
#endif
  ClientOptions client_options;
  client_options.target = "127.0.0.1:1";  // Never reached: nothing is sent.
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Create(client_options);
  ASSERT_TRUE(client.ok()) << client.status();
  const absl::StatusOr<BenchReport> report =
      RunBench(**client, PetabyteBench());
  ASSERT_FALSE(report.ok());
  EXPECT_THAT(std::string(report.status().message()),
              ::testing::HasSubstr("out of memory for the bench's buffers"));
  EXPECT_TRUE(IsInThisProcess(report.status())) << report.status();
  EXPECT_EQ(StatusText(report.status()), report.status().message());
}

}  // namespace
}  // namespace transpose
