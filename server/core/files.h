// Whole-file reads and writes, for the binaries' file arguments (matrices,
// certificates, tokens).
#ifndef TRANSPOSE_SERVER_CORE_FILES_H_
#define TRANSPOSE_SERVER_CORE_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace transpose {

// NOT_FOUND when the file cannot be opened, DATA_LOSS when it cannot be read.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes `parts` one after another, replacing the file.
absl::Status WriteFile(const std::string& path,
                       absl::Span<const absl::string_view> parts);

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_FILES_H_
