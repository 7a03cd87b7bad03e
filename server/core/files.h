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

// The whole file: a regular file, or a pipe or device read to its end. The
// error names the path: NOT_FOUND, PERMISSION_DENIED and so on from errno, or
// INVALID_ARGUMENT for a directory.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes a file whole or not at all. A regular file (or a new one) is written
// to a temporary file beside it that Commit renames over it, so a failed or
// abandoned write leaves the old file as it was; anything else (a pipe,
// /dev/stdout) is written in place. Create it before the work whose result it
// holds, so that an unwritable path fails first.
class FileWriter {
 public:
  static absl::StatusOr<FileWriter> Create(const std::string& path);
  FileWriter(FileWriter&& other) noexcept;
  FileWriter& operator=(FileWriter&&) = delete;
  // Without a Commit, removes the temporary file.
  ~FileWriter();

  // Writes `parts` one after another and puts the file in place.
  absl::Status Commit(absl::Span<const absl::string_view> parts);

 private:
  FileWriter(std::string path, std::string temporary, int fd)
      : path_(std::move(path)), temporary_(std::move(temporary)), fd_(fd) {}

  std::string path_;
  std::string temporary_;  // Empty when writing in place.
  int fd_ = -1;
};

// FileWriter::Create, then Commit.
absl::Status WriteFile(const std::string& path,
                       absl::Span<const absl::string_view> parts);

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_FILES_H_
