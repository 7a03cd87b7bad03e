#include "server/core/heap.h"

#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace transpose {
namespace {

// Page faults taken by a fresh thread that, `rounds` times, allocates 16 MiB
// in 64 KiB blocks (the slices gRPC reads a socket into), writes them and
// frees them all, counting from the second round on.
long FaultsAfterFirstRound(int rounds) {
  long faults = 0;
  std::thread thread([&] {
    constexpr size_t kBlock = size_t{64} << 10;
    long first_round_end = 0;
    for (int round = 0; round < rounds; ++round) {
      std::vector<void*> blocks;
      for (size_t i = 0; i < (size_t{16} << 20) / kBlock; ++i) {
        void* block = std::malloc(kBlock);
        std::memset(block, round + 1, kBlock);
        blocks.push_back(block);
      }
      for (void* block : blocks) std::free(block);
      rusage usage;
      getrusage(RUSAGE_THREAD, &usage);
      if (round == 0) first_round_end = usage.ru_minflt;
      faults = usage.ru_minflt - first_round_end;
    }
  });
  thread.join();
  return faults;
}

TEST(RetainFreedHeapMemoryTest, FreedTransportBuffersAreNotFaultedInAgain) {
  constexpr int kRounds = 5;
  constexpr long kPagesPerRound = (16 << 20) / 4096;
  // glibc's defaults hand the blocks back to the kernel each round.
  const long before = FaultsAfterFirstRound(kRounds);
  if (!RetainFreedHeapMemory()) {
    GTEST_SKIP() << "this allocator ignores mallopt (a sanitizer build)";
  }
  const long after = FaultsAfterFirstRound(kRounds);
  std::printf(
      "page faults after the first round: %ld with glibc's defaults, "
      "%ld retained\n",
      before, after);
  EXPECT_GT(before, kPagesPerRound) << "glibc's defaults no longer trim";
  EXPECT_LT(after, kPagesPerRound / 10)
      << "freed blocks still go back to the kernel";
}

}  // namespace
}  // namespace transpose
