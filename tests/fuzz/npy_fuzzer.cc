// Fuzzes the .npy header parser the CLI runs on files it is handed.
#include <cstdint>
#include <cstdlib>
#include <optional>

#include "client/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks a --dtype override (or none).
  const absl::Span<const transpose::DataType> types = transpose::AllDataTypes();
  std::optional<transpose::DataType> dtype;
  if (data[0] < types.size()) dtype = types[data[0]];
  const absl::string_view file(reinterpret_cast<const char*>(data + 1),
                               size - 1);
  absl::StatusOr<transpose::NpyHeader> header =
      transpose::ParseNpyHeader(file, dtype);
  if (header.ok()) {
    // An empty array (a zero dimension) parses with no data; any other
    // header accepted must declare exactly the bytes that follow it.
    absl::StatusOr<uint64_t> bytes =
        header->shape.empty()
            ? uint64_t{0}
            : transpose::MatrixBytes(header->dtype, header->shape);
    if (header->data_offset > file.size() || !bytes.ok() ||
        *bytes != file.size() - header->data_offset) {
      std::abort();
    }
  }
  return 0;
}
