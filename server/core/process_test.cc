#include "server/core/process.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace transpose {
namespace {

uint64_t MappedBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t pages = 0;
  statm >> pages;
  return pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// ulimit -v counts address space that holds no memory (a reservation, here;
// thread stacks and malloc arenas in a client), so what is left under it is
// the limit less what is mapped, not the limit.
TEST(ProcessTest, MemoryLeftUnderAnAddressSpaceLimitIsLessWhatIsMapped) {
  rlimit before;
  ASSERT_EQ(getrlimit(RLIMIT_AS, &before), 0);
  if (before.rlim_max != RLIM_INFINITY) {
    GTEST_SKIP() << "a hard ulimit -v may not leave room for the test's";
  }
  constexpr uint64_t kHeadroom = uint64_t{1} << 30;
  constexpr size_t kReserved = size_t{256} << 20;
  rlimit lowered = before;
  lowered.rlim_cur = MappedBytes() + kHeadroom;
  ASSERT_EQ(setrlimit(RLIMIT_AS, &lowered), 0);

  const uint64_t left = MemoryLeftBytes();
  void* reserved =
      mmap(nullptr, kReserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  const uint64_t left_with_reservation = MemoryLeftBytes();
  const uint64_t usable = UsableMemoryBytes();
  if (reserved != MAP_FAILED) munmap(reserved, kReserved);
  ASSERT_EQ(setrlimit(RLIMIT_AS, &before), 0);

  ASSERT_NE(reserved, MAP_FAILED);
  EXPECT_LE(left, kHeadroom);
  EXPECT_GT(left, kHeadroom - (uint64_t{64} << 20));
  EXPECT_LE(left_with_reservation + kReserved, left);
  EXPECT_LT(left, usable);
}

TEST(ProcessTest, WithoutAnAddressSpaceLimitMemoryLeftIsTheUsableMemory) {
  rlimit limit;
  ASSERT_EQ(getrlimit(RLIMIT_AS, &limit), 0);
  if (limit.rlim_cur != RLIM_INFINITY) {
    GTEST_SKIP() << "this process runs under ulimit -v";
  }
  EXPECT_EQ(MemoryLeftBytes(), UsableMemoryBytes());
}

// Threads' stacks count against ulimit -v whole, but hold only the pages
// they touch: a server planning its memory reserves them only under a limit.
TEST(ProcessTest, ThreadsTakeAddressSpaceOnlyUnderALimit) {
  rlimit before;
  ASSERT_EQ(getrlimit(RLIMIT_AS, &before), 0);
  if (before.rlim_cur != RLIM_INFINITY || before.rlim_max != RLIM_INFINITY) {
    GTEST_SKIP() << "this process runs under ulimit -v";
  }
  EXPECT_EQ(ThreadsAddressSpaceBytes(16), 0u);
  rlimit lowered = before;
  lowered.rlim_cur = MappedBytes() + (uint64_t{1} << 30);
  ASSERT_EQ(setrlimit(RLIMIT_AS, &lowered), 0);
  const uint64_t sixteen = ThreadsAddressSpaceBytes(16);
  const uint64_t none = ThreadsAddressSpaceBytes(0);
  ASSERT_EQ(setrlimit(RLIMIT_AS, &before), 0);
  EXPECT_EQ(sixteen, 16 * ThreadStackBytes());
  EXPECT_GT(sixteen, 0u);
  EXPECT_EQ(none, 0u);
}

// Without ulimit -v, MemoryLeftBytes is the whole memory: what the process
// holds already (its libraries, a GPU driver's) counts apart, and grows with
// memory it touches. Under a limit MemoryLeftBytes has taken it off.
TEST(ProcessTest, MemoryHeldIsTheResidentMemoryWithoutALimit) {
  rlimit before;
  ASSERT_EQ(getrlimit(RLIMIT_AS, &before), 0);
  if (before.rlim_cur != RLIM_INFINITY || before.rlim_max != RLIM_INFINITY) {
    GTEST_SKIP() << "this process runs under ulimit -v";
  }
  const uint64_t held = MemoryHeldBytes();
  EXPECT_GT(held, 0u);
  constexpr size_t kTouched = size_t{64} << 20;
  std::vector<char> touched(kTouched, 1);
  EXPECT_GE(MemoryHeldBytes(), held + kTouched / 2);
  rlimit lowered = before;
  lowered.rlim_cur = MappedBytes() + (uint64_t{1} << 30);
  ASSERT_EQ(setrlimit(RLIMIT_AS, &lowered), 0);
  const uint64_t under_limit = MemoryHeldBytes();
  ASSERT_EQ(setrlimit(RLIMIT_AS, &before), 0);
  EXPECT_EQ(under_limit, 0u);
  EXPECT_EQ(touched[kTouched - 1], 1);
}

// A bench of 32 workers under a 300 MiB ulimit -v ended in std::system_error
// when it counted only its buffers: each thread maps ThreadStackBytes.
TEST(ProcessTest, AThreadMapsThreadStackBytes) {
  const uint64_t stack = ThreadStackBytes();
  EXPECT_GE(stack, uint64_t{64} << 10);
  rlimit stack_limit;
  ASSERT_EQ(getrlimit(RLIMIT_STACK, &stack_limit), 0);
  if (stack_limit.rlim_cur != RLIM_INFINITY) {
    const uint64_t page = sysconf(_SC_PAGESIZE);  // glibc rounds up to pages.
    EXPECT_EQ(stack, (stack_limit.rlim_cur + page - 1) / page * page);
  }
  const uint64_t before = MappedBytes();
  std::atomic<bool> measured{false};
  std::atomic<bool> started{false};
  std::thread thread([&] {
    started = true;
    while (!measured) std::this_thread::yield();
  });
  while (!started) std::this_thread::yield();
  const uint64_t during = MappedBytes();
  measured = true;
  thread.join();
  EXPECT_GE(during - before, stack);
}

// Each malloc arena past the first reserves 64 MiB of address space as its
// thread first allocates; under ulimit -v eight of them took 512 MiB of the
// CLI's limit, and gRPC then failed for want of a stack. There SetUpProcess
// keeps one, so threads that allocate map little more than their stacks.
TEST(ProcessTest, UnderAnAddressSpaceLimitThreadsShareOneMallocArena) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's allocator has no malloc arenas";
#endif
  rlimit limit;
  ASSERT_EQ(getrlimit(RLIMIT_AS, &limit), 0);
  if (limit.rlim_max != RLIM_INFINITY) {
    GTEST_SKIP() << "a hard ulimit -v may not leave room for the test's";
  }
  // In a child of its own: the arena cap holds for the whole process.
  EXPECT_EXIT(
      {
        rlimit lowered;
        if (getrlimit(RLIMIT_AS, &lowered) != 0) std::exit(2);
        lowered.rlim_cur = MappedBytes() + (uint64_t{2} << 30);
        if (setrlimit(RLIMIT_AS, &lowered) != 0) std::exit(2);
        SetUpProcess();
        constexpr int kThreads = 4;
        const uint64_t before = MappedBytes();
        std::atomic<int> allocated{0};
        std::atomic<bool> measured{false};
        std::vector<std::thread> threads;
        for (int i = 0; i < kThreads; ++i) {
          threads.emplace_back([&] {
            void* volatile block = std::malloc(1000);
            ++allocated;
            while (!measured) std::this_thread::yield();
            std::free(block);
          });
        }
        while (allocated < kThreads) std::this_thread::yield();
        const uint64_t grown = MappedBytes() - before;
        measured = true;
        for (std::thread& thread : threads) thread.join();
        // 4 stacks (8 MiB each by default), where 4 arenas would add 256 MiB.
        std::fprintf(stderr, "grew %llu MiB\n",
                     static_cast<unsigned long long>(grown >> 20));
        std::exit(grown < kThreads * (ThreadStackBytes() + (uint64_t{16} << 20))
                      ? 0
                      : 1);
      },
      ::testing::ExitedWithCode(0), "grew");
}

}  // namespace
}  // namespace transpose
