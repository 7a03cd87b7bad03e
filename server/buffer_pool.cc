#include "server/buffer_pool.h"

#include <sys/mman.h>

#include <cstdlib>
#include <utility>

#include "absl/numeric/bits.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "server/core/process.h"
#include "server/core/retry.h"

namespace transpose {
namespace {

constexpr size_t kPage = 4096;

size_t RoundToPages(size_t bytes) {
  return (bytes + kPage - 1) / kPage * kPage;
}

// From this size on, buffers are advised onto transparent huge pages: the CPU
// transpose writes each output line into a different 4 KiB page, so with small
// pages nearly every store misses the TLB (float32 8192² on the 2-core CI
// machine: 43-74% of memcpy with 4 KiB pages, 67-87% with huge pages;
// docs/BENCHMARKS.md).
constexpr size_t kHugePageMinBytes = size_t{8} << 20;

// Pages straight from the kernel: freeing gives them back at once, where malloc
// would keep large blocks in its arenas (glibc raises its mmap threshold after
// each large free), so the server's resident memory tracks what its pools hold.
class HostAllocator final : public MemoryAllocator {
 public:
  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* data = mmap(nullptr, RoundToPages(bytes), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) {
      absl::Status status = absl::ResourceExhaustedError(
          absl::StrFormat("out of host memory allocating %d bytes", bytes));
      // Other jobs hold the memory for now, unless this one could never fit.
      return FitsHostMemory(bytes) ? RetryLater(std::move(status)) : status;
    }
    // Advice only: where THP is off, the pages stay small. With THP's defrag
    // on "madvise", the first touch of a new buffer may compact memory; the
    // pool keeps buffers, so that is paid once per buffer, not per request.
    if (bytes >= kHugePageMinBytes) {
      madvise(data, RoundToPages(bytes), MADV_HUGEPAGE);
    }
    return data;
  }
  void Free(void* data, size_t bytes) override {
    munmap(data, RoundToPages(bytes));
  }
};

}  // namespace

// Whole pages below 64 KiB, then four classes per power of two, so buffers are
// reused across nearby sizes and waste at most a quarter.
size_t BufferPool::SizeClass(size_t bytes) {
  if (bytes <= 64 * 1024) return RoundToPages(bytes);
  const int top = 63 - absl::countl_zero(static_cast<uint64_t>(bytes));
  const size_t step = size_t{1} << (top - 2);
  // No class above the largest size: no machine has it anyway.
  if (bytes > SIZE_MAX - (step - 1)) return bytes;
  return (bytes + step - 1) / step * step;
}

std::unique_ptr<MemoryAllocator> NewHostAllocator() {
  return std::make_unique<HostAllocator>();
}

BufferPool::Buffer& BufferPool::Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::exchange(other.pool_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

void BufferPool::Buffer::Reset() {
  if (pool_ != nullptr) pool_->Release(data_, capacity_);
  pool_ = nullptr;
  data_ = nullptr;
  size_ = capacity_ = 0;
}

BufferPool::BufferPool(std::unique_ptr<MemoryAllocator> allocator,
                       size_t max_idle_bytes)
    : allocator_(std::move(allocator)), max_idle_bytes_(max_idle_bytes) {}

BufferPool::~BufferPool() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [capacity, idle] : idle_) {
    allocator_->Free(idle.data, capacity);
  }
}

absl::StatusOr<BufferPool::Buffer> BufferPool::Acquire(size_t bytes) {
  const size_t capacity = SizeClass(bytes == 0 ? 1 : bytes);
  Buffer buffer;
  buffer.pool_ = this;
  buffer.size_ = bytes;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // A much larger idle buffer stays for a request that needs it.
    auto it = idle_.lower_bound(capacity);
    if (it != idle_.end() && it->first <= 2 * capacity) {
      buffer.capacity_ = it->first;
      buffer.data_ = it->second.data;
      EraseIdle(it);
      return buffer;
    }
  }
  absl::StatusOr<void*> data = allocator_->Allocate(capacity);
  if (!data.ok()) {
    buffer.pool_ = nullptr;
    return data.status();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  allocated_bytes_ += capacity;
  AllocatedBytesChanged();
  buffer.data_ = static_cast<uint8_t*>(*data);
  buffer.capacity_ = capacity;
  return buffer;
}

void BufferPool::Release(uint8_t* data, size_t capacity) {
  // Freed outside the lock: unpinning memory can take milliseconds.
  std::vector<std::pair<uint8_t*, size_t>> freed;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (capacity > max_idle_bytes_) {
      freed.emplace_back(data, capacity);
    } else {
      // The buffer just used is the likeliest to be wanted again: a pool full
      // of one burst's sizes would otherwise allocate and free every request
      // of another size for good.
      while (idle_bytes_ + capacity > max_idle_bytes_) {
        const IdleByCapacity::iterator oldest =
            idle_by_release_.begin()->second;
        freed.emplace_back(oldest->second.data, oldest->first);
        EraseIdle(oldest);
      }
      const uint64_t released = ++releases_;
      idle_by_release_.emplace(released,
                               idle_.emplace(capacity, Idle{data, released}));
      idle_bytes_ += capacity;
    }
    for (const auto& [unused, bytes] : freed) allocated_bytes_ -= bytes;
    if (!freed.empty()) AllocatedBytesChanged();
  }
  for (const auto& [freed_data, bytes] : freed) {
    allocator_->Free(freed_data, bytes);
  }
}

void BufferPool::EraseIdle(IdleByCapacity::iterator it) {
  idle_bytes_ -= it->first;
  idle_by_release_.erase(it->second.released);
  idle_.erase(it);
}

void BufferPool::AllocatedBytesChanged() {
  if (observer_) observer_(allocated_bytes_);
}

void BufferPool::ObserveAllocatedBytes(std::function<void(size_t)> observer) {
  std::lock_guard<std::mutex> lock(mutex_);
  observer_ = std::move(observer);
  AllocatedBytesChanged();
}

size_t BufferPool::allocated_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return allocated_bytes_;
}

size_t BufferPool::idle_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_bytes_;
}

}  // namespace transpose
