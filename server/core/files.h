// Whole-file reads and writes, for the binaries' file arguments (matrices,
// certificates, tokens).
#ifndef TRANSPOSE_SERVER_CORE_FILES_H_
#define TRANSPOSE_SERVER_CORE_FILES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace transpose {

// The whole file: a regular file, or a pipe or device read to its end; or
// its first `max_bytes`. The error names the path: NOT_FOUND,
// PERMISSION_DENIED and so on from errno, or INVALID_ARGUMENT for a directory.
absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     size_t max_bytes = SIZE_MAX);

// A file, pipe or device read in steps, so that a caller can look at its start
// before deciding how much more to take: a pipe cannot be read again.
class FileReader {
 public:
  // Opens `path`; the errors are ReadFile's. With `regular_only`, anything but
  // a regular file is INVALID_ARGUMENT, and a FIFO is refused at once, not
  // waited on.
  static absl::StatusOr<FileReader> Open(const std::string& path,
                                         bool regular_only = false);
  FileReader(FileReader&& other) noexcept;
  FileReader& operator=(FileReader&& other) noexcept;
  ~FileReader();

  // A regular file's size when it was opened; none for a pipe or device.
  std::optional<uint64_t> regular_size() const { return regular_size_; }
  // Reads on, appending to `contents`, until it holds `max_bytes` or the input
  // ends.
  absl::Status ReadUpTo(size_t max_bytes, std::string& contents);
  // Whether a read has met the input's end.
  bool ended() const { return ended_; }

 private:
  FileReader(std::string path, int descriptor,
             std::optional<uint64_t> regular_size)
      : path_(std::move(path)),
        descriptor_(descriptor),
        regular_size_(regular_size) {}

  std::string path_;
  int descriptor_ = -1;
  std::optional<uint64_t> regular_size_;
  bool ended_ = false;
};

// Whether `path` names a regular file (through symbolic links): one that can
// be read again, unlike a pipe.
bool IsRegularFile(const std::string& path);

// Writes a file whole or not at all. A regular file (new, or replacing one, or
// what a symbolic link points to) is written to a temporary file beside it,
// flushed to disk and renamed over it, keeping the old file's permissions; a
// failed write leaves the old file as it was. Anything else (a pipe, a
// device) is written in place, as is a file whose directory cannot be
// written. A path that names one of the process's open descriptors
// (/dev/stdout, /dev/stderr, /dev/fd/N, /proc/self/fd/N) is written through
// that descriptor, as the shell opened it: `>> log` appends, and what the
// program wrote there before stays. See RemoveTemporaryFilesOnSignal for a
// write cut short by a signal.
class FileWriter {
 public:
  // Checks that `path` can be written, and touches nothing: check before the
  // work whose result it will hold, so that an unwritable path fails first.
  static absl::StatusOr<FileWriter> Create(const std::string& path);

  // Writes `parts` one after another and puts the file in place.
  absl::Status Commit(absl::Span<const absl::string_view> parts) const;

 private:
  FileWriter(std::string path, bool in_place, int descriptor = -1)
      : path_(std::move(path)), in_place_(in_place), descriptor_(descriptor) {}

  std::string path_;  // Symbolic links resolved, when written through one.
  bool in_place_;
  int descriptor_;  // The open descriptor the path names, or -1.
};

// For programs (call it from main): SIGHUP, SIGINT, SIGQUIT or SIGTERM, where
// the program leaves them at their default action, first removes the temporary
// files of commits under way, then ends the process as before. Without it,
// Ctrl-C during a large write leaves a "NAME.partial-XXXXXX" file behind.
void RemoveTemporaryFilesOnSignal();

// Files a program reads again while it runs, to take changes to them (a
// token list, a certificate) without a restart. Not thread-safe.
class WatchedFiles {
 public:
  // Reads `paths` whole: what they hold now is what the first Poll compares
  // with. Each must be a regular file: a pipe cannot be read again, and
  // reading a FIFO with no writer would block the poller (and, in a server,
  // its start-up and drain); others read as INVALID_ARGUMENT.
  explicit WatchedFiles(std::vector<std::string> paths);

  // Reads the files again; true when what any of them holds, or why it cannot
  // be read, differs from the last read.
  bool Poll();

  const std::vector<std::string>& paths() const { return paths_; }
  // At the last read, in the order of paths(): each file's contents or, for a
  // file that could not be read, ReadFile's error.
  const std::vector<absl::StatusOr<std::string>>& contents() const {
    return contents_;
  }

 private:
  std::vector<absl::StatusOr<std::string>> ReadAll() const;

  const std::vector<std::string> paths_;
  std::vector<absl::StatusOr<std::string>> contents_;
};

// FileWriter::Create, then Commit.
absl::Status WriteFile(const std::string& path,
                       absl::Span<const absl::string_view> parts);

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_FILES_H_
