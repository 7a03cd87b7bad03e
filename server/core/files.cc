#include "server/core/files.h"

#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace transpose {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  const std::streamsize size = in.tellg();
  std::string contents(static_cast<size_t>(size), '\0');
  in.seekg(0);
  if (!in.read(contents.data(), size)) {
    return absl::DataLossError(absl::StrCat("cannot read ", path));
  }
  return contents;
}

absl::Status WriteFile(const std::string& path,
                       absl::Span<const absl::string_view> parts) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  for (absl::string_view part : parts)
    out.write(part.data(), static_cast<std::streamsize>(part.size()));
  out.close();
  if (!out)
    return absl::DataLossError(absl::StrCat("writing ", path, " failed"));
  return absl::OkStatus();
}

}  // namespace transpose
