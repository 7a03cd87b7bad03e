// Process-wide settings shared by the programs that move matrices over gRPC:
// transpose_server, the transpose CLI, and the benchmarks' client and echo
// server (which take them too, so that comparisons are about the transpose).
#ifndef TRANSPOSE_SERVER_CORE_PROCESS_H_
#define TRANSPOSE_SERVER_CORE_PROCESS_H_

#include <cstdint>

namespace transpose {

// Call first thing in main, in programs (not libraries):
// - RetainFreedHeapMemory (server/core/heap.h), with one malloc arena under
//   an address-space limit (ulimit -v);
// - absl::Mutex deadlock detection off. Debian's Abseil is built with it on,
//   and gRPC takes an absl::Mutex for nearly everything it does: with 64
//   callers of 64x64 transposes on the 2-core machine, the detector's graph
//   bookkeeping was 6% of the server's CPU.
void SetUpProcess();

// The memory this process may use: the machine's physical memory, or less
// where its cgroup's memory limit (a container's) or its address-space limit
// (ulimit -v) is lower. Allocations alone do not find its end (Linux lends
// memory it does not have, and filling it gets the process killed, in a
// container by its limit on a node with memory to spare), so whatever means to
// hold large buffers checks against this first.
uint64_t UsableMemoryBytes();

// What this process may still take of UsableMemoryBytes: under an
// address-space limit, less the address space it maps already. Thread stacks
// (8 MiB each) reserve address space that holds no memory but counts against
// ulimit -v; a client about to hold a large input and its result checks
// against this.
uint64_t MemoryLeftBytes();

// The address space a new std::thread's stack reserves (glibc's default:
// ulimit -s, or its own where that is unlimited), which a program about to
// start many threads under ulimit -v counts with its buffers.
uint64_t ThreadStackBytes();

// What this process holds now that MemoryLeftBytes has not taken off: its
// resident memory where the machine's or the cgroup's memory bounds it; none
// where an address-space limit does, since MemoryLeftBytes is then already
// less all the process maps.
uint64_t MemoryHeldBytes();

// What `threads` threads yet to start take of MemoryLeftBytes: their stacks'
// address space under an address-space limit; elsewhere nothing worth
// counting, since only the stack pages they touch hold memory.
uint64_t ThreadsAddressSpaceBytes(int threads);

// What MemoryLeftBytes counts from, as messages that quote it say.
inline constexpr char kMemoryLeftSource[] =
    "the machine's, its cgroup's or its ulimit -v, less the address space it "
    "holds";

// Whether a transpose of `bytes` (its input and its result, both held) fits
// the memory this process may use when nothing else holds any: whether a
// server running out of memory for it should tell its client to try again.
// (A client about to read a large file checks MemoryLeftBytes instead.)
bool FitsHostMemory(uint64_t bytes);

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_PROCESS_H_
