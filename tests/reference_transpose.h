// The definition of the transpose, independent of the server's code, for the
// end-to-end tests to check results against.
#ifndef TRANSPOSE_TESTS_REFERENCE_TRANSPOSE_H_
#define TRANSPOSE_TESTS_REFERENCE_TRANSPOSE_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "server/core/matrix.h"

namespace transpose::testing {

// Each matrix of the batch, elements of `element_size` bytes, transposed.
inline std::vector<uint8_t> ReferenceTranspose(const std::vector<uint8_t>& in,
                                               size_t element_size,
                                               const MatrixShape& s) {
  std::vector<uint8_t> out(in.size());
  for (uint64_t b = 0; b < s.batch; ++b)
    for (uint64_t r = 0; r < s.rows; ++r)
      for (uint64_t c = 0; c < s.cols; ++c)
        std::memcpy(&out[((b * s.cols + c) * s.rows + r) * element_size],
                    &in[((b * s.rows + r) * s.cols + c) * element_size],
                    element_size);
  return out;
}

inline std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::vector<uint8_t> bytes(n);
  std::mt19937 rng(seed);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  return bytes;
}

}  // namespace transpose::testing

#endif  // TRANSPOSE_TESTS_REFERENCE_TRANSPOSE_H_
