// Whole-file reads and writes, for the binaries' file arguments (matrices,
// certificates, tokens).
#ifndef TRANSPOSE_SERVER_CORE_FILES_H_
#define TRANSPOSE_SERVER_CORE_FILES_H_

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace transpose {

// The whole file: a regular file, or a pipe or device read to its end. The
// error names the path: NOT_FOUND, PERMISSION_DENIED and so on from errno, or
// INVALID_ARGUMENT for a directory.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes a file whole or not at all. A regular file (new, or replacing one, or
// what a symbolic link points to) is written to a temporary file beside it,
// flushed to disk and renamed over it, keeping the old file's permissions; a
// failed write leaves the old file as it was. Anything else (a pipe,
// /dev/stdout) is written in place, as is a file whose directory cannot be
// written. See RemoveTemporaryFilesOnSignal for a write cut short by a signal.
class FileWriter {
 public:
  // Checks that `path` can be written, and touches nothing: check before the
  // work whose result it will hold, so that an unwritable path fails first.
  static absl::StatusOr<FileWriter> Create(const std::string& path);

  // Writes `parts` one after another and puts the file in place.
  absl::Status Commit(absl::Span<const absl::string_view> parts) const;

 private:
  FileWriter(std::string path, bool in_place)
      : path_(std::move(path)), in_place_(in_place) {}

  std::string path_;  // Symbolic links resolved, when written through one.
  bool in_place_;
};

// For programs (call it from main): SIGHUP, SIGINT or SIGTERM, where the
// program leaves them at their default action, first removes the temporary
// files of commits under way, then ends the process as before. Without it,
// Ctrl-C during a large write leaves a "NAME.partial-XXXXXX" file behind.
void RemoveTemporaryFilesOnSignal();

// FileWriter::Create, then Commit.
absl::Status WriteFile(const std::string& path,
                       absl::Span<const absl::string_view> parts);

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_FILES_H_
