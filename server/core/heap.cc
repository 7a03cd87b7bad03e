#include "server/core/heap.h"

#include <malloc.h>

#include <algorithm>
#include <climits>

namespace transpose {

bool RetainFreedHeapMemory(size_t retain_bytes, int arenas) {
  // 32 MiB is the largest mmap threshold glibc accepts on 64-bit (half its
  // per-thread heap size); setting it also stops glibc raising the threshold
  // and the trim threshold by itself.
  constexpr int kMmapThreshold = 32 << 20;
  const bool mmap_set = mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1;
  const bool trim_set =
      mallopt(M_TRIM_THRESHOLD,
              static_cast<int>(std::min<size_t>(retain_bytes, INT_MAX))) == 1;
  const bool arenas_set = mallopt(M_ARENA_MAX, arenas) == 1;
  return mmap_set && trim_set && arenas_set;
}

}  // namespace transpose
