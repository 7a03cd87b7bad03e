// Process-wide heap settings for programs that move large messages.
#ifndef TRANSPOSE_SERVER_CORE_HEAP_H_
#define TRANSPOSE_SERVER_CORE_HEAP_H_

#include <cstddef>

namespace transpose {

// gRPC reads a socket into 64 KiB slices and frees them once the message is
// parsed. With glibc's defaults the freed memory at the top of a malloc arena
// is trimmed back to the kernel as soon as it passes the trim threshold (128
// KiB, or a threshold glibc raises by itself), and large blocks are mmapped, so
// the next reads page-fault and zero it all again: on the 2-core machine that
// was 13,000 page faults per 64 MiB request, and a third of the server's CPU
// (docs/BENCHMARKS.md). This keeps blocks under 32 MiB on the heap and up to
// `retain_bytes` of free memory per malloc arena, so resident memory stays at
// its high-water mark instead of being handed back and faulted in again. It
// also caps the arenas at `arenas` (glibc's default is 8 per core), which
// bounds what is kept to arenas x retain_bytes: on the 16-core GPU host,
// uncapped arenas each grew to their own high-water mark and the soak test saw
// resident memory climb 22-53 MiB after its warm-up (8 arenas: 7-13 MiB), at
// no cost in throughput. Call first thing in main, in programs (not
// libraries). Returns false where the allocator ignores it (sanitizer builds).
bool RetainFreedHeapMemory(size_t retain_bytes = size_t{64} << 20,
                           int arenas = 8);

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_HEAP_H_
