#include "server/buffer_pool.h"

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "server/core/process.h"
#include "server/core/retry.h"

namespace transpose {
namespace {

// Counts what reaches the real allocator underneath.
class CountingAllocator final : public MemoryAllocator {
 public:
  explicit CountingAllocator(int* allocations, int* frees)
      : allocations_(allocations), frees_(frees) {}
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    if (bytes > (size_t{1} << 40))
      return absl::ResourceExhaustedError("too big");
    ++*allocations_;
    return std::malloc(bytes);
  }
  void Free(void* data, size_t) override {
    ++*frees_;
    std::free(data);
  }

 private:
  int* allocations_;
  int* frees_;
};

TEST(BufferPoolTest, ReusesReleasedBuffers) {
  int allocations = 0, frees = 0;
  {
    BufferPool pool(std::make_unique<CountingAllocator>(&allocations, &frees),
                    1 << 30);
    uint8_t* first;
    {
      absl::StatusOr<BufferPool::Buffer> buffer = pool.Acquire(3 << 20);
      ASSERT_TRUE(buffer.ok());
      EXPECT_EQ(buffer->size(), size_t{3} << 20);
      first = buffer->data();
      buffer->data()[buffer->size() - 1] = 1;  // Writable to its end.
    }
    EXPECT_GT(pool.idle_bytes(), 0u);
    for (int i = 0; i < 10; ++i) {
      absl::StatusOr<BufferPool::Buffer> again = pool.Acquire((3 << 20) - 100);
      ASSERT_TRUE(again.ok());
      EXPECT_EQ(again->data(), first);
    }
    EXPECT_EQ(allocations, 1);
  }
  EXPECT_EQ(frees, 1);
}

TEST(BufferPoolTest, HandsOutDistinctBuffersAtOnce) {
  int allocations = 0, frees = 0;
  BufferPool pool(std::make_unique<CountingAllocator>(&allocations, &frees),
                  1 << 30);
  absl::StatusOr<BufferPool::Buffer> a = pool.Acquire(1 << 20);
  absl::StatusOr<BufferPool::Buffer> b = pool.Acquire(1 << 20);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->data(), b->data());
  EXPECT_EQ(pool.allocated_bytes(), size_t{2} << 20);
}

TEST(BufferPoolTest, KeepsAHugeIdleBufferForRequestsThatNeedIt) {
  int allocations = 0, frees = 0;
  BufferPool pool(std::make_unique<CountingAllocator>(&allocations, &frees),
                  1 << 30);
  { ASSERT_TRUE(pool.Acquire(64 << 20).ok()); }
  absl::StatusOr<BufferPool::Buffer> small = pool.Acquire(4096);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(allocations, 2);
  EXPECT_EQ(pool.idle_bytes(), size_t{64} << 20);
}

TEST(BufferPoolTest, FreesWhatExceedsTheIdleBound) {
  int allocations = 0, frees = 0;
  BufferPool pool(std::make_unique<CountingAllocator>(&allocations, &frees),
                  1 << 20);
  {
    absl::StatusOr<BufferPool::Buffer> big = pool.Acquire(4 << 20);
    ASSERT_TRUE(big.ok());
  }
  EXPECT_EQ(frees, 1);
  EXPECT_EQ(pool.allocated_bytes(), 0u);
  EXPECT_EQ(pool.idle_bytes(), 0u);
}

TEST(BufferPoolTest, ABufferJustUsedDisplacesTheIdleOnesUsedLongestAgo) {
  int allocations = 0, frees = 0;
  BufferPool pool(std::make_unique<CountingAllocator>(&allocations, &frees),
                  8 << 20);
  uint8_t* older;
  {
    // A burst of large requests fills the idle bound.
    absl::StatusOr<BufferPool::Buffer> a = pool.Acquire(4 << 20);
    absl::StatusOr<BufferPool::Buffer> b = pool.Acquire(4 << 20);
    ASSERT_TRUE(a.ok() && b.ok());
    older = a->data();
    a->Reset();  // Released first.
  }
  EXPECT_EQ(pool.idle_bytes(), size_t{8} << 20);
  // Then smaller ones, which those buffers are too large for: the first is
  // kept, in place of the large buffer released first, and the rest reuse it.
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(pool.Acquire(1 << 20).ok());
  }
  EXPECT_EQ(allocations, 3);
  EXPECT_EQ(frees, 1);
  EXPECT_EQ(pool.idle_bytes(), size_t{5} << 20);
  EXPECT_EQ(pool.allocated_bytes(), size_t{5} << 20);
  // The large buffer kept is the one released last.
  absl::StatusOr<BufferPool::Buffer> large = pool.Acquire(4 << 20);
  ASSERT_TRUE(large.ok());
  EXPECT_NE(large->data(), older);
  EXPECT_EQ(allocations, 3);
}

TEST(BufferPoolTest, ReportsAllocationFailure) {
  int allocations = 0, frees = 0;
  BufferPool pool(std::make_unique<CountingAllocator>(&allocations, &frees),
                  1 << 20);
  EXPECT_EQ(pool.Acquire(size_t{1} << 41).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.allocated_bytes(), 0u);
}

// Host memory that runs out is worth a retry only for a job that could fit
// the host at all: a larger one would be sent again until its deadline.
TEST(BufferPoolTest, OutOfHostMemoryIsForNowOnlyWhereTheJobCouldFit) {
  BufferPool pool(NewHostAllocator(), 0);
  const absl::Status never = pool.Acquire(size_t{1} << 62).status();
  EXPECT_EQ(never.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(IsRetryLater(never));
  EXPECT_TRUE(FitsHostMemory(UsableMemoryBytes() / 4));
  EXPECT_FALSE(FitsHostMemory(UsableMemoryBytes()));
}

// The largest sizes have a class (themselves), not one that wraps to 0.
TEST(BufferPoolTest, SizeClassesNeverWrap) {
  for (size_t bytes : {SIZE_MAX, SIZE_MAX - 1, size_t{1} << 63,
                       (size_t{1} << 63) + 1, size_t{3} << 62}) {
    EXPECT_GE(BufferPool::SizeClass(bytes), bytes) << bytes;
  }
  EXPECT_EQ(BufferPool::SizeClass((size_t{1} << 40) + 1),
            (size_t{1} << 40) + (size_t{1} << 38));
}

TEST(BufferPoolTest, MovedBufferIsReleasedOnce) {
  int allocations = 0, frees = 0;
  {
    BufferPool pool(std::make_unique<CountingAllocator>(&allocations, &frees),
                    0);
    absl::StatusOr<BufferPool::Buffer> a = pool.Acquire(100);
    ASSERT_TRUE(a.ok());
    BufferPool::Buffer b = std::move(*a);
    BufferPool::Buffer c;
    c = std::move(b);
    EXPECT_EQ(c.size(), 100u);
  }
  EXPECT_EQ(allocations, 1);
  EXPECT_EQ(frees, 1);
}

// The observer sees every change of the allocated bytes, in order, and nothing
// when a request reuses an idle buffer: a backend's memory gauge, set from it,
// stays right without reading the pool after every request.
TEST(BufferPoolTest, TellsItsObserverEachChangeOfTheAllocatedBytes) {
  int allocations = 0, frees = 0;
  BufferPool pool(std::make_unique<CountingAllocator>(&allocations, &frees),
                  /*max_idle_bytes=*/3 << 20);
  std::vector<size_t> seen;
  pool.ObserveAllocatedBytes([&seen](size_t bytes) { seen.push_back(bytes); });
  EXPECT_EQ(seen, std::vector<size_t>({0}));  // The figure at once.
  {
    absl::StatusOr<BufferPool::Buffer> a = pool.Acquire(1 << 20);
    absl::StatusOr<BufferPool::Buffer> b = pool.Acquire(2 << 20);
    ASSERT_TRUE(a.ok() && b.ok());
  }
  EXPECT_EQ(seen, std::vector<size_t>({0, 1 << 20, 3 << 20}));
  for (int i = 0; i < 5; ++i) {  // Reused: no change, no call.
    ASSERT_TRUE(pool.Acquire(2 << 20).ok());
  }
  EXPECT_EQ(seen.size(), 3u);
  // A larger buffer displaces both idle ones when released: one change.
  ASSERT_TRUE(pool.Acquire(3 << 20).ok());
  EXPECT_EQ(seen, std::vector<size_t>({0, 1 << 20, 3 << 20, 6 << 20, 3 << 20}));
  EXPECT_EQ(seen.back(), pool.allocated_bytes());
  EXPECT_EQ(frees, 2);
}

}  // namespace
}  // namespace transpose
