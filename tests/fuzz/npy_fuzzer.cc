// Fuzzes the .npy header parser the CLI runs on files it is handed.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "client/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view file(reinterpret_cast<const char*>(data + 1),
                               size - 1);
  // The first byte picks how much of the file the parser is handed: the CLI
  // parses a large file's header from its first bytes.
  const absl::string_view start = file.substr(0, file.size() * data[0] / 255);
  absl::StatusOr<transpose::NpyHeader> header =
      transpose::ParseNpyHeader(start, file.size());
  if (header.ok()) {
    // An empty array (a zero dimension) parses with no data; any other
    // header accepted must declare exactly the bytes that follow it, in
    // elements of its type's size.
    const uint64_t elements = header->shape.elements();
    if (header->data_offset > start.size() || header->element_size == 0 ||
        (header->dtype != transpose::DataType::kUnspecified &&
         header->element_size != transpose::ElementSize(header->dtype)) ||
        elements * header->element_size != file.size() - header->data_offset) {
      std::abort();
    }
    // A .npy output repeats the descr: the header written with it, for the
    // transposed shape, parses back to the same elements.
    const transpose::MatrixShape transposed = header->shape.Transposed();
    std::string written =
        transpose::FormatNpyHeader(header->descr, transposed, header->batched);
    const uint64_t data_bytes = file.size() - header->data_offset;
    if (data_bytes > (uint64_t{1} << 20)) return 0;  // Keep runs fast.
    written.append(data_bytes, '\0');
    absl::StatusOr<transpose::NpyHeader> reread =
        transpose::ParseNpyHeader(written);
    if (!reread.ok() || reread->descr != header->descr ||
        reread->dtype != header->dtype ||
        reread->element_size != header->element_size ||
        reread->shape != transposed || reread->batched != header->batched ||
        reread->fortran_order) {
      std::abort();
    }
  }
  return 0;
}
