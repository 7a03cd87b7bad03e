// Reuses large buffers across requests so that, once warm, a request allocates
// nothing: the first touch of fresh host pages and pinning memory for DMA both
// cost more than the copies they serve.
#ifndef TRANSPOSE_SERVER_BUFFER_POOL_H_
#define TRANSPOSE_SERVER_BUFFER_POOL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace transpose {

// One kind of memory: pageable host, pinned host, ...
class MemoryAllocator {
 public:
  virtual ~MemoryAllocator() = default;
  // RESOURCE_EXHAUSTED when the memory is not there.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* data, size_t bytes) = 0;
};

// Page-aligned pageable host memory.
std::unique_ptr<MemoryAllocator> NewHostAllocator();

class BufferPool {
 public:
  // A buffer of at least size() bytes, given back to its pool when destroyed.
  // The pool must outlive it.
  class Buffer {
   public:
    Buffer() = default;
    Buffer(Buffer&& other) noexcept { *this = std::move(other); }
    Buffer& operator=(Buffer&& other) noexcept;
    ~Buffer() { Reset(); }

    uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    absl::Span<uint8_t> span() const { return {data_, size_}; }
    // Gives the memory back to the pool now.
    void Reset();

   private:
    friend class BufferPool;
    BufferPool* pool_ = nullptr;
    uint8_t* data_ = nullptr;
    size_t size_ = 0;
    size_t capacity_ = 0;
  };

  // Keeps up to `max_idle_bytes` of released buffers for reuse. A released
  // buffer that does not fit beside them displaces those released longest ago,
  // so the pool follows the sizes in use now.
  BufferPool(std::unique_ptr<MemoryAllocator> allocator, size_t max_idle_bytes);
  ~BufferPool();

  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // What a buffer for `bytes` takes: its size rounded up to a size class. A
  // buffer larger than max_idle_bytes is freed when released, and allocated
  // again for the next request.
  static size_t SizeClass(size_t bytes);

  // The smallest idle buffer that holds `bytes`, or a new one.
  absl::StatusOr<Buffer> Acquire(size_t bytes);

  // Bytes allocated from the allocator: in use plus idle.
  size_t allocated_bytes() const;
  size_t idle_bytes() const;

  // From now on `observer` gets allocated_bytes() each time it changes, and
  // once now. It runs under the pool's lock, so calls come in order and the
  // last one has the current figure; it must be quick and must not use the
  // pool. A gauge set this way costs a request that reuses buffers nothing,
  // where reading the pool after each request would take its lock again.
  // Freed bytes leave the figure just before the allocator frees them.
  void ObserveAllocatedBytes(std::function<void(size_t)> observer);

 private:
  void Release(uint8_t* data, size_t capacity);

  const std::unique_ptr<MemoryAllocator> allocator_;
  const size_t max_idle_bytes_;
  mutable std::mutex mutex_;
  struct Idle {
    uint8_t* data;
    uint64_t released;  // Order of release: the smallest went idle first.
  };
  using IdleByCapacity = std::multimap<size_t, Idle>;
  // Erases `it` from both indexes. Under mutex_.
  void EraseIdle(IdleByCapacity::iterator it);
  // Tells observer_ allocated_bytes_. Under mutex_.
  void AllocatedBytesChanged();

  IdleByCapacity idle_;
  // The same buffers by `released`, for the displacement.
  std::map<uint64_t, IdleByCapacity::iterator> idle_by_release_;
  uint64_t releases_ = 0;
  size_t idle_bytes_ = 0;
  size_t allocated_bytes_ = 0;
  std::function<void(size_t)> observer_;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_BUFFER_POOL_H_
