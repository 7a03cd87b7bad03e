#include "server/core/process.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>

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

}  // namespace
}  // namespace transpose
