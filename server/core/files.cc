#include "server/core/files.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <new>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/core/status_macros.h"

namespace transpose {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(what, " ", path));
}

// Writes all of `data`, through short writes and signals, and waits on a
// non-blocking descriptor (a stdout its parent left so) that is full.
bool WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        struct pollfd writable = {fd, POLLOUT, 0};
        if (::poll(&writable, 1, -1) < 0 && errno != EINTR) return false;
        continue;
      }
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

absl::Status WriteParts(int fd, const std::string& path,
                        absl::Span<const absl::string_view> parts) {
  for (absl::string_view part : parts) {
    if (!WriteAll(fd, part)) return ErrnoError("writing", path);
  }
  return absl::OkStatus();
}

// The process's umask, read without changing it (umask() would, for a moment,
// for every thread).
mode_t Umask() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view rest = line;
    if (absl::ConsumePrefix(&rest, "Umask:")) {
      return static_cast<mode_t>(
          std::strtoul(std::string(rest).c_str(), nullptr, 8) & 0777);
    }
  }
  return 022;
}

// Temporary files being written, for RemoveTemporaryFilesOnSignal: fixed
// buffers, since a signal handler can read neither a string another thread
// may free nor a lock. Slots, since commits may overlap.
struct TemporarySlot {
  std::atomic<bool> taken{false};
  std::atomic<bool> ready{false};  // `path` holds a whole name.
  char path[PATH_MAX];
};
TemporarySlot temporary_slots[8];

void RemoveTemporariesAndDie(int signal) {
  for (TemporarySlot& slot : temporary_slots) {
    if (slot.ready.load()) ::unlink(slot.path);
  }
  std::signal(signal, SIG_DFL);
  ::raise(signal);
}

// A temporary file made from a mkostemp template, listed for removal on a
// terminating signal while this lives. Listed before it exists: mkostemp
// writes each name it tries into the slot's own buffer before it creates the
// file, so a signal at any moment finds the name of the file, or of none
// (which unlink ignores). Listed after its creation, a signal in between left
// the file behind. Names too long for a slot, or past the slots, go unlisted.
class ListedTemporary {
 public:
  explicit ListedTemporary(std::string name_template)
      : path_(std::move(name_template)) {
    if (path_.size() < PATH_MAX) {
      for (TemporarySlot& slot : temporary_slots) {
        bool free = false;
        if (slot.taken.compare_exchange_strong(free, true)) {
          path_.copy(slot.path, path_.size());
          slot.path[path_.size()] = '\0';
          slot.ready.store(true);
          slot_ = &slot;
          break;
        }
      }
    }
    fd_ = ::mkostemp(slot_ != nullptr ? slot_->path : path_.data(), O_CLOEXEC);
    error_ = errno;
    if (slot_ != nullptr) path_ = slot_->path;
  }
  ~ListedTemporary() {
    if (slot_ == nullptr) return;
    slot_->ready.store(false);
    slot_->taken.store(false);
  }
  ListedTemporary(const ListedTemporary&) = delete;
  ListedTemporary& operator=(const ListedTemporary&) = delete;

  // The file's descriptor, or -1 with mkostemp's errno in error().
  int fd() const { return fd_; }
  int error() const { return error_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  TemporarySlot* slot_ = nullptr;
  int fd_ = -1;
  int error_ = 0;
};

// The descriptor `path` names, for the paths that name one of the process's
// own (reopening /dev/stdout through its link would start the file over, or
// replace it); -1 for any other path.
int DescriptorNamedBy(absl::string_view path) {
  if (path == "/dev/stdout") return STDOUT_FILENO;
  if (path == "/dev/stderr") return STDERR_FILENO;
  if (!absl::ConsumePrefix(&path, "/dev/fd/") &&
      !absl::ConsumePrefix(&path, "/proc/self/fd/")) {
    return -1;
  }
  int descriptor = -1;
  if (path.empty() || !absl::c_all_of(path, absl::ascii_isdigit) ||
      !absl::SimpleAtoi(path, &descriptor)) {
    return -1;
  }
  return descriptor;
}

std::string DirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// A mkostemp template beside `path`: its name and ".partial-XXXXXX", the name
// cut short where the whole would pass NAME_MAX bytes (a valid name of up to
// 255 bytes would otherwise fail only once the result is in hand).
std::string TemporaryNameBeside(const std::string& path) {
  constexpr absl::string_view kSuffix = ".partial-XXXXXX";
  const size_t slash = path.rfind('/');
  const size_t name_start = slash == std::string::npos ? 0 : slash + 1;
  const size_t name_length = path.size() - name_start;
  size_t keep = std::min(name_length, NAME_MAX - kSuffix.size());
  // Not inside a UTF-8 character: file systems that check names refuse half
  // of one.
  while (keep > 0 && keep < name_length &&
         (static_cast<unsigned char>(path[name_start + keep]) & 0xC0) == 0x80) {
    --keep;
  }
  return absl::StrCat(path.substr(0, name_start + keep), kSuffix);
}

}  // namespace

bool IsRegularFile(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode);
}

absl::StatusOr<FileReader> FileReader::Open(const std::string& path,
                                            bool regular_only) {
  // Non-blocking, so that a FIFO with no writer is refused, not waited on;
  // it changes nothing for a regular file.
  const int fd = ::open(path.c_str(),
                        O_RDONLY | O_CLOEXEC | (regular_only ? O_NONBLOCK : 0));
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
  if (regular_only && !S_ISREG(info.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        " is not a regular file (a pipe or device cannot be read again when "
        "it changes)"));
  }
  return FileReader(path, fd,
                    S_ISREG(info.st_mode)
                        ? std::optional<uint64_t>(info.st_size)
                        : std::nullopt);
}

FileReader::FileReader(FileReader&& other) noexcept
    : path_(std::move(other.path_)),
      descriptor_(std::exchange(other.descriptor_, -1)),
      regular_size_(other.regular_size_),
      ended_(other.ended_) {}

FileReader& FileReader::operator=(FileReader&& other) noexcept {
  if (this != &other) {
    if (descriptor_ >= 0) ::close(descriptor_);
    path_ = std::move(other.path_);
    descriptor_ = std::exchange(other.descriptor_, -1);
    regular_size_ = other.regular_size_;
    ended_ = other.ended_;
  }
  return *this;
}

FileReader::~FileReader() {
  if (descriptor_ >= 0) ::close(descriptor_);
}

absl::Status FileReader::ReadUpTo(size_t max_bytes, std::string& contents) {
  size_t size = contents.size();
  if (size >= max_bytes || ended_) return absl::OkStatus();
  // A regular file's size is known (one byte more sees its end without
  // growing); a pipe's is not, and the buffer doubles as it comes.
  const size_t guess = regular_size_.has_value() ? *regular_size_ + 1
                                                 : size + (size_t{64} << 10);
  // Out of memory is a status here, as for every other way a read fails.
  const auto grow = [&](size_t bytes) {
    try {
      contents.resize(bytes);
      return absl::OkStatus();
    } catch (const std::bad_alloc&) {
      contents.resize(size);
      return absl::ResourceExhaustedError(
          absl::StrCat("out of memory for ", bytes, " bytes of ", path_,
                       " (the machine's, its cgroup's or its ulimit -v)"));
    }
  };
  TRANSPOSE_RETURN_IF_ERROR(
      grow(std::min(std::max(guess, size + 1), max_bytes)));
  while (size < max_bytes) {
    if (contents.size() == size) {
      TRANSPOSE_RETURN_IF_ERROR(
          grow(std::min(std::max<size_t>(2 * size, 1), max_bytes)));
    }
    const ssize_t n =
        ::read(descriptor_, contents.data() + size, contents.size() - size);
    if (n == 0) {
      ended_ = true;
      break;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status error = ErrnoError("cannot read", path_);
      contents.resize(size);
      return error;
    }
    size += static_cast<size_t>(n);
  }
  contents.resize(size);
  return absl::OkStatus();
}

namespace {

// ReadFile, of regular files only when `regular_only`.
absl::StatusOr<std::string> Read(const std::string& path, size_t max_bytes,
                                 bool regular_only) {
  TRANSPOSE_ASSIGN_OR_RETURN(FileReader reader,
                             FileReader::Open(path, regular_only));
  std::string contents;
  TRANSPOSE_RETURN_IF_ERROR(reader.ReadUpTo(max_bytes, contents));
  return contents;
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path,
                                     size_t max_bytes) {
  return Read(path, max_bytes, /*regular_only=*/false);
}

absl::StatusOr<FileWriter> FileWriter::Create(const std::string& path) {
  struct stat info;
  if (const int descriptor = DescriptorNamedBy(path); descriptor >= 0) {
    const int flags = ::fcntl(descriptor, F_GETFL);
    if (flags < 0) return ErrnoError("cannot write", path);
    if ((flags & O_ACCMODE) == O_RDONLY) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot write ", path, ": it is open for reading only"));
    }
    return FileWriter(path, /*in_place=*/true, descriptor);
  }
  std::string target = path;
  if (::lstat(path.c_str(), &info) == 0 && S_ISLNK(info.st_mode)) {
    // Write what the link points to, and keep the link.
    char resolved[PATH_MAX];
    if (::realpath(path.c_str(), resolved) == nullptr) {
      // A dangling link: open() creates its target.
      return FileWriter(path, /*in_place=*/true);
    }
    target = resolved;
  }
  const bool exists = ::stat(target.c_str(), &info) == 0;
  if (exists && S_ISDIR(info.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is a directory, not a file"));
  }
  if (exists && !S_ISREG(info.st_mode)) {
    return FileWriter(target, /*in_place=*/true);
  }
  if (exists && ::access(target.c_str(), W_OK) != 0) {
    return ErrnoError("cannot write", path);
  }
  const std::string directory = DirectoryOf(target);
  if (::access(directory.c_str(), W_OK | X_OK) == 0) {
    return FileWriter(target, /*in_place=*/false);
  }
  if (exists) return FileWriter(target, /*in_place=*/true);
  return ErrnoError("cannot write", path);
}

absl::Status FileWriter::Commit(
    absl::Span<const absl::string_view> parts) const {
  if (descriptor_ >= 0) return WriteParts(descriptor_, path_, parts);
  if (in_place_) {
    const int fd =
        ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return ErrnoError("cannot write", path_);
    absl::Status status = WriteParts(fd, path_, parts);
    if (::close(fd) != 0 && status.ok()) status = ErrnoError("writing", path_);
    return status;
  }
  // A name no other writer has (O_EXCL, never through a link), with the mode
  // the file has, or a new file would get.
  const ListedTemporary listed(TemporaryNameBeside(path_));
  const int fd = listed.fd();
  if (fd < 0) {
    errno = listed.error();
    return ErrnoError("cannot write", path_);
  }
  const std::string& temporary = listed.path();
  struct stat info;
  const mode_t mode = ::stat(path_.c_str(), &info) == 0 ? info.st_mode & 07777
                                                        : 0666 & ~Umask();
  absl::Status status = WriteParts(fd, path_, parts);
  // On disk before the rename, or a crash could leave an empty file in place.
  if (status.ok() && (::fchmod(fd, mode) != 0 || ::fsync(fd) != 0)) {
    status = ErrnoError("writing", path_);
  }
  if (::close(fd) != 0 && status.ok()) status = ErrnoError("writing", path_);
  if (status.ok() && ::rename(temporary.c_str(), path_.c_str()) != 0) {
    status = ErrnoError("cannot replace", path_);
  }
  if (!status.ok()) ::unlink(temporary.c_str());
  return status;
}

void RemoveTemporaryFilesOnSignal() {
  for (int signal : {SIGHUP, SIGINT, SIGQUIT, SIGTERM}) {
    struct sigaction current {};
    // A signal the program ignores, or handles itself, stays as it is.
    if (::sigaction(signal, nullptr, &current) != 0 ||
        current.sa_handler != SIG_DFL) {
      continue;
    }
    struct sigaction action {};
    action.sa_handler = RemoveTemporariesAndDie;
    sigemptyset(&action.sa_mask);
    ::sigaction(signal, &action, nullptr);
  }
}

absl::Status WriteFile(const std::string& path,
                       absl::Span<const absl::string_view> parts) {
  absl::StatusOr<FileWriter> writer = FileWriter::Create(path);
  if (!writer.ok()) return writer.status();
  return writer->Commit(parts);
}

WatchedFiles::WatchedFiles(std::vector<std::string> paths)
    : paths_(std::move(paths)), contents_(ReadAll()) {}

bool WatchedFiles::Poll() {
  std::vector<absl::StatusOr<std::string>> contents = ReadAll();
  if (contents == contents_) return false;
  contents_ = std::move(contents);
  return true;
}

std::vector<absl::StatusOr<std::string>> WatchedFiles::ReadAll() const {
  std::vector<absl::StatusOr<std::string>> contents;
  contents.reserve(paths_.size());
  for (const std::string& path : paths_) {
    contents.push_back(Read(path, SIZE_MAX, /*regular_only=*/true));
  }
  return contents;
}

}  // namespace transpose
