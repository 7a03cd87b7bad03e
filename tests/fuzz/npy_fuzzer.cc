// Fuzzes the .npy header parser the CLI runs on files it is handed.
#include <cstdint>
#include <cstdlib>

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
  }
  return 0;
}
