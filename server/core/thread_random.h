// A random generator for the calling thread.
#ifndef TRANSPOSE_SERVER_CORE_THREAD_RANDOM_H_
#define TRANSPOSE_SERVER_CORE_THREAD_RANDOM_H_

#include "absl/random/random.h"

namespace transpose {

// One generator per thread: absl::BitGen is not safe to share, and seeding one
// per use would read the OS's entropy each time.
inline absl::BitGen& ThreadRandom() {
  thread_local absl::BitGen random;
  return random;
}

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_THREAD_RANDOM_H_
