#include "server/core/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"

namespace transpose {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(what, " ", path));
}

// Writes all of `data`, through short writes and signals.
bool WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path);
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    absl::Status error = ErrnoError("cannot stat", path);
    ::close(fd);
    return error;
  }
  if (S_ISDIR(info.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is a directory, not a file"));
  }
  std::string contents;
  // A regular file's size is known; a pipe's is not, and grows as it comes.
  if (S_ISREG(info.st_mode)) contents.reserve(info.st_size);
  size_t size = 0;
  while (true) {
    if (contents.size() == size) {
      contents.resize(std::max<size_t>(size * 2, size + (64 << 10)));
    }
    const ssize_t n =
        ::read(fd, contents.data() + size, contents.size() - size);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status error = ErrnoError("cannot read", path);
      ::close(fd);
      return error;
    }
    size += static_cast<size_t>(n);
  }
  ::close(fd);
  contents.resize(size);
  return contents;
}

absl::StatusOr<FileWriter> FileWriter::Create(const std::string& path) {
  struct stat info;
  if (::stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode)) {
    if (S_ISDIR(info.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " is a directory, not a file"));
    }
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) return ErrnoError("cannot write", path);
    return FileWriter(path, "", fd);
  }
  // Beside the target, so that the rename stays on one file system. Mode 0666
  // less the umask, as the file itself would have had.
  const std::string temporary = absl::StrCat(path, ".partial-", ::getpid());
  const int fd =
      ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return ErrnoError("cannot write", path);
  return FileWriter(path, temporary, fd);
}

FileWriter::FileWriter(FileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      temporary_(std::move(other.temporary_)),
      fd_(std::exchange(other.fd_, -1)) {}

FileWriter::~FileWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  if (!temporary_.empty()) ::unlink(temporary_.c_str());
}

absl::Status FileWriter::Commit(absl::Span<const absl::string_view> parts) {
  if (fd_ < 0) return absl::FailedPreconditionError("already committed");
  absl::Status status;
  for (absl::string_view part : parts) {
    if (!WriteAll(fd_, part)) {
      status = ErrnoError("writing", path_);
      break;
    }
  }
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0 && status.ok()) status = ErrnoError("writing", path_);
  if (temporary_.empty()) return status;
  if (status.ok() && ::rename(temporary_.c_str(), path_.c_str()) != 0) {
    status = ErrnoError("cannot replace", path_);
  }
  if (!status.ok()) ::unlink(temporary_.c_str());
  return status;
}

absl::Status WriteFile(const std::string& path,
                       absl::Span<const absl::string_view> parts) {
  absl::StatusOr<FileWriter> writer = FileWriter::Create(path);
  if (!writer.ok()) return writer.status();
  return writer->Commit(parts);
}

}  // namespace transpose
