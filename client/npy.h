// NumPy .npy files (format versions 1.0 to 3.0) holding a 2-D matrix or a 3-D
// batch of them, for every data type of the API. bfloat16, which NumPy lacks,
// is written as 2-byte void ('|V2'), the form ml_dtypes arrays take, and such
// files read back as bfloat16.
#ifndef TRANSPOSE_CLIENT_NPY_H_
#define TRANSPOSE_CLIENT_NPY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/core/matrix.h"

namespace transpose {

struct NpyHeader {
  // kUnspecified for plain elements of none of the API's types ('|b1',
  // '<M8[s]', '|V4', big-endian '>f4', ...), which a caller may move as a type
  // of `element_size`.
  DataType dtype = DataType::kUnspecified;
  // The file's descr, as NumPy wrote it.
  std::string descr;
  size_t element_size = 0;
  MatrixShape shape;
  // True when the file's shape was 3-D; a 2-D file reads as batch 1.
  bool batched = false;
  // The elements are stored in Fortran order (the first index varies
  // fastest), as np.save writes a transposed view; `shape` is the array's.
  bool fortran_order = false;
  // Where the elements start in the file.
  size_t data_offset = 0;
};

// The descr NumPy writes for `dtype` ("<f4", "|u1", ...).
absl::string_view NpyDescr(DataType dtype);

// Parses the header of a .npy file of `file_size` bytes, from `start`, its
// first bytes (the whole header at least), and checks the data size against
// it (none: a pipe not yet read to its end, and its size left to the caller to
// check; the declared size must still be addressable). INVALID_ARGUMENT names
// what is wrong: bad magic, a header that does not parse, structured or object
// dtypes, other than 2 or 3 dimensions, or a data size that does not match. An
// array with a zero dimension parses, with no data. Big-endian elements parse
// as kUnspecified, with their size.
absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view start,
                                         std::optional<uint64_t> file_size);
// The same for a whole file in memory.
inline absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view file) {
  return ParseNpyHeader(file, file.size());
}

// The header bytes of a .npy file holding `shape` of elements NumPy describes
// as `descr` ("<f4", or NpyDescr of a type), 2-D when !batched; the elements
// follow it.
std::string FormatNpyHeader(absl::string_view descr, const MatrixShape& shape,
                            bool batched);

// Whether `file` starts with the .npy magic.
bool IsNpy(absl::string_view file);

}  // namespace transpose

#endif  // TRANSPOSE_CLIENT_NPY_H_
