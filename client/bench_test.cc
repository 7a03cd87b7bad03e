#include "client/bench.h"

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
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

// Where more workers than CheckBenchMemory foresaw cannot start, the run is a
// status, not std::system_error ending the process, and it comes at once: the
// workers that did start have made no call.
TEST(RunBenchTest, WorkersThatCannotStartAreThisProcesssFailure) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers reserve terabytes of address space, which "
                  "no ulimit -v leaves them";
#endif
  rlimit limit;
  ASSERT_EQ(getrlimit(RLIMIT_AS, &limit), 0);
  if (limit.rlim_max != RLIM_INFINITY) {
    GTEST_SKIP() << "a hard ulimit -v may not leave room for the test's";
  }
  // The child runs this test alone in a fresh process: a fork of one whose
  // earlier tests started gRPC would share gRPC's state.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        // One malloc arena: otherwise a gRPC thread's first allocation after
        // the limit below could reserve a new arena's 64 MiB of address space
        // and leave the bench's buffers none (it did, once, under ctest -j2).
        mallopt(M_ARENA_MAX, 1);
        // Nothing listens there: a call would wait out its deadline for a
        // connection, so a worker that called before the run was called off
        // would hold the refusal up for a minute.
        ClientOptions client_options;
        client_options.target = "127.0.0.1:1";
        client_options.wait_for_ready = true;
        absl::StatusOr<std::unique_ptr<Client>> client =
            Client::Create(client_options);
        if (!client.ok()) std::exit(2);
        BenchOptions options;
        options.dtype = DataType::kUInt8;
        options.shape = MatrixShape::Matrix(64, 64);
        options.concurrency = 256;
        options.duration = absl::Hours(1);
        options.call.timeout = absl::Minutes(1);
        // Room for the buffers and a few dozen stacks, not 256.
        std::ifstream statm("/proc/self/statm");
        uint64_t pages = 0;
        statm >> pages;
        rlimit lowered;
        if (getrlimit(RLIMIT_AS, &lowered) != 0) std::exit(2);
        lowered.rlim_cur =
            pages * sysconf(_SC_PAGESIZE) + (uint64_t{256} << 20);
        if (setrlimit(RLIMIT_AS, &lowered) != 0) std::exit(2);
        const absl::Time start = absl::Now();
        const absl::StatusOr<BenchReport> report = RunBench(**client, options);
        const absl::Duration took = absl::Now() - start;
        std::fprintf(stderr, "%s (in %s)\n",
                     StatusText(report.status()).c_str(),
                     absl::FormatDuration(took).c_str());
        std::fflush(stderr);
        // Without static destructors, which gRPC's threads would outlive.
        _exit(!report.ok() && IsInThisProcess(report.status()) &&
                      absl::IsResourceExhausted(report.status()) &&
                      took < absl::Seconds(30)
                  ? 0
                  : 1);
      },
      ::testing::ExitedWithCode(0),
      "could start only [0-9]+ of the bench's 256 worker threads");
}

}  // namespace
}  // namespace transpose
