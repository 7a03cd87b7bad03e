#include "server/core/files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace transpose {
namespace {

using ::testing::HasSubstr;

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/files_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::system(absl::StrCat("rm -rf ", dir_).c_str());
  }
  std::string Path(const std::string& name) const {
    return absl::StrCat(dir_, "/", name);
  }
  // The directory's entries, sorted.
  std::string Listing() const {
    std::string out;
    FILE* ls = popen(absl::StrCat("ls -A ", dir_).c_str(), "r");
    char line[256];
    while (fgets(line, sizeof(line), ls) != nullptr) out += line;
    pclose(ls);
    return out;
  }

  std::string dir_;
};

TEST_F(FilesTest, ReadsWhatWasWritten) {
  const std::string big(3 << 20, 'x');
  ASSERT_TRUE(WriteFile(Path("a"), {"head:", big}).ok());
  absl::StatusOr<std::string> read = ReadFile(Path("a"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "head:" + big);
  ASSERT_TRUE(WriteFile(Path("empty"), {}).ok());
  EXPECT_EQ(ReadFile(Path("empty")).value(), "");
}

// A header is read without the rest of a large file.
TEST_F(FilesTest, ReadsTheStartOfAFile) {
  const std::string big(3 << 20, 'x');
  ASSERT_TRUE(WriteFile(Path("a"), {"head:", big}).ok());
  EXPECT_EQ(ReadFile(Path("a"), 5).value(), "head:");
  EXPECT_EQ(ReadFile(Path("a"), 0).value(), "");
  EXPECT_EQ(ReadFile(Path("a"), 100 << 20).value(), "head:" + big);
  ASSERT_TRUE(WriteFile(Path("short"), {"abc"}).ok());
  EXPECT_EQ(ReadFile(Path("short"), 1 << 20).value(), "abc");
}

TEST_F(FilesTest, ReadErrorsNameThePathAndTheCause) {
  absl::StatusOr<std::string> missing = ReadFile(Path("missing"));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(Path("missing")));
  // A directory used to abort the process (a size of -1).
  absl::StatusOr<std::string> directory = ReadFile(dir_);
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(directory.status().message(), HasSubstr("is a directory"));
}

// A pipe that a thread fills with `data`, 4 KiB at a time, and then closes;
// read through its read end's path.
class FilledPipe {
 public:
  explicit FilledPipe(std::string data) : data_(std::move(data)) {
    if (pipe(fds_) != 0) {
      ADD_FAILURE() << "pipe() failed";
      return;
    }
    writer_ = std::thread([this] {
      // A reader that stops early (a failed assertion) makes the writes fail
      // with EPIPE instead of killing the test.
      sigset_t pipe_signal;
      sigemptyset(&pipe_signal);
      sigaddset(&pipe_signal, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
      for (size_t at = 0; at < data_.size();) {
        const ssize_t n = write(fds_[1], data_.data() + at, 4096);
        if (n <= 0) break;
        at += n;
      }
      close(fds_[1]);
    });
  }
  ~FilledPipe() {
    close(fds_[0]);
    if (writer_.joinable()) writer_.join();
  }
  std::string path() const { return absl::StrCat("/proc/self/fd/", fds_[0]); }
  const std::string& data() const { return data_; }

 private:
  const std::string data_;
  int fds_[2] = {-1, -1};
  std::thread writer_;
};

TEST_F(FilesTest, ReadsAPipeToItsEnd) {
  const FilledPipe filled(std::string(1 << 20, 'p'));
  absl::StatusOr<std::string> read = ReadFile(filled.path());
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, filled.data());
}

// A pipe read in steps goes on where the last step stopped, and says when it
// has met the end; a pipe that never ends is read no further than asked.
TEST_F(FilesTest, AReaderTakesAPipeInSteps) {
  std::string bytes(300 << 10, '\0');
  for (size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<char>(i % 251);
  const FilledPipe filled(bytes);
  const std::string& data = filled.data();
  absl::StatusOr<FileReader> reader = FileReader::Open(filled.path());
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->regular_size(), std::nullopt);
  std::string contents;
  ASSERT_TRUE(reader->ReadUpTo(100 << 10, contents).ok());
  EXPECT_EQ(contents, data.substr(0, 100 << 10));
  EXPECT_FALSE(reader->ended());
  ASSERT_TRUE(reader->ReadUpTo(300 << 10, contents).ok());
  EXPECT_EQ(contents, data);
  EXPECT_FALSE(reader->ended());  // Exactly what was asked: the end unseen.
  ASSERT_TRUE(reader->ReadUpTo(SIZE_MAX, contents).ok());
  EXPECT_TRUE(reader->ended());
  EXPECT_EQ(contents, data);

  absl::StatusOr<FileReader> zeros = FileReader::Open("/dev/zero");
  ASSERT_TRUE(zeros.ok()) << zeros.status();
  std::string some;
  ASSERT_TRUE(zeros->ReadUpTo(5 << 20, some).ok());
  EXPECT_EQ(some, std::string(5 << 20, '\0'));
  EXPECT_FALSE(zeros->ended());
}

TEST_F(FilesTest, AReaderKnowsARegularFilesSize) {
  ASSERT_TRUE(WriteFile(Path("a"), {"0123456789"}).ok());
  absl::StatusOr<FileReader> reader = FileReader::Open(Path("a"));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->regular_size(), 10);
  std::string contents;
  ASSERT_TRUE(reader->ReadUpTo(4, contents).ok());
  EXPECT_EQ(contents, "0123");
  FileReader moved = *std::move(reader);
  ASSERT_TRUE(moved.ReadUpTo(100, contents).ok());
  EXPECT_EQ(contents, "0123456789");
  EXPECT_TRUE(moved.ended());
  EXPECT_EQ(FileReader::Open(Path("missing")).status().code(),
            absl::StatusCode::kNotFound);
}

// Create touches nothing (a writer abandoned mid-transfer, even by a killed
// process, leaves no trace); Commit replaces the file and leaves nothing else.
TEST_F(FilesTest, OnlyCommitWrites) {
  ASSERT_TRUE(WriteFile(Path("out"), {"old"}).ok());
  absl::StatusOr<FileWriter> writer = FileWriter::Create(Path("out"));
  ASSERT_TRUE(writer.ok()) << writer.status();
  absl::StatusOr<FileWriter> fresh = FileWriter::Create(Path("new"));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  EXPECT_EQ(ReadFile(Path("out")).value(), "old");
  EXPECT_EQ(Listing(), "out\n");
  ASSERT_TRUE(writer->Commit({"new"}).ok());
  EXPECT_EQ(ReadFile(Path("out")).value(), "new");
  EXPECT_EQ(Listing(), "out\n");  // No temporary file left behind.
}

// Whether `dir` holds a file whose name starts with `prefix`.
bool HasEntry(const std::string& dir, const std::string& prefix) {
  DIR* listing = opendir(dir.c_str());
  if (listing == nullptr) return false;
  bool found = false;
  while (const dirent* entry = readdir(listing)) {
    found = found || absl::StartsWith(entry->d_name, prefix);
  }
  closedir(listing);
  return found;
}

TEST_F(FilesTest, ASignalDuringCommitLeavesNoTemporaryFile) {
  const std::string chunk(16 << 20, 'x');
  const std::vector<absl::string_view> parts(32, chunk);  // 512 MiB.
  EXPECT_EXIT(
      {
        RemoveTemporaryFilesOnSignal();
        // Ctrl-C once the temporary file is there, while it is written.
        std::thread interrupt([this] {
          while (!HasEntry(dir_, "out.partial-")) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          kill(getpid(), SIGINT);
        });
        interrupt.detach();
        (void)WriteFile(Path("out"), parts);
        std::this_thread::sleep_for(std::chrono::seconds(10));
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGINT), "");
  EXPECT_EQ(Listing(), "");
}

TEST_F(FilesTest, AReplacedFileKeepsItsModeAndLinksStayLinks) {
  ASSERT_TRUE(WriteFile(Path("private"), {"old"}).ok());
  ASSERT_EQ(chmod(Path("private").c_str(), 0600), 0);
  ASSERT_EQ(symlink("private", Path("link").c_str()), 0);
  ASSERT_TRUE(WriteFile(Path("link"), {"new"}).ok());
  struct stat info;
  ASSERT_EQ(lstat(Path("link").c_str(), &info), 0);
  EXPECT_TRUE(S_ISLNK(info.st_mode));
  ASSERT_EQ(stat(Path("private").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600);
  EXPECT_EQ(ReadFile(Path("private")).value(), "new");
}

TEST_F(FilesTest, UnwritablePathsFailAtCreate) {
  absl::StatusOr<FileWriter> no_dir = FileWriter::Create(Path("no/such"));
  EXPECT_EQ(no_dir.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(no_dir.status().message(), HasSubstr(Path("no/such")));
  EXPECT_EQ(FileWriter::Create(dir_).status().code(),
            absl::StatusCode::kInvalidArgument);
  if (geteuid() != 0) {  // Root writes read-only files regardless.
    ASSERT_TRUE(WriteFile(Path("read-only"), {"x"}).ok());
    ASSERT_EQ(chmod(Path("read-only").c_str(), 0444), 0);
    EXPECT_EQ(FileWriter::Create(Path("read-only")).status().code(),
              absl::StatusCode::kPermissionDenied);
  }
}

TEST_F(FilesTest, ANameOfTheLongestLengthIsWritten) {
  // 255 bytes: ASCII, and two-byte UTF-8 characters after one ASCII byte (so
  // that a cut at a fixed length would split one).
  std::string accented = "a";
  while (accented.size() + 2 <= NAME_MAX) accented += "\xc3\xa9";
  for (const std::string& name : {std::string(NAME_MAX, 'n'), accented}) {
    ASSERT_TRUE(WriteFile(Path(name), {"first"}).ok());
    ASSERT_TRUE(WriteFile(Path(name), {"second"}).ok());
    EXPECT_EQ(ReadFile(Path(name)).value_or(""), "second");
    EXPECT_EQ(Listing(), name + "\n");  // No temporary file left behind.
    ASSERT_EQ(unlink(Path(name).c_str()), 0);
  }
}

TEST_F(FilesTest, NewFilesGetTheUsualMode) {
  const mode_t old_mask = umask(022);
  ASSERT_TRUE(WriteFile(Path("mode"), {"x"}).ok());
  umask(old_mask);
  struct stat info;
  ASSERT_EQ(stat(Path("mode").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0644);
}

TEST_F(FilesTest, APipeIsWrittenInPlace) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  ASSERT_TRUE(
      WriteFile(absl::StrCat("/proc/self/fd/", fds[1]), {"to ", "a pipe"})
          .ok());
  close(fds[1]);
  char buffer[64] = {};
  EXPECT_EQ(read(fds[0], buffer, sizeof(buffer)), 9);
  EXPECT_STREQ(buffer, "to a pipe");
  close(fds[0]);
}

// `transpose ... --out /dev/stdout >> log`: the descriptor is written as the
// shell opened it. Reopened through its link, the file would be started over
// (or, written beside and renamed, replaced), losing what was there.
TEST_F(FilesTest, ADescriptorPathIsWrittenThroughTheDescriptor) {
  ASSERT_TRUE(WriteFile(Path("log"), {"before\n"}).ok());
  struct stat before;
  ASSERT_EQ(stat(Path("log").c_str(), &before), 0);
  const int fd = open(Path("log").c_str(), O_WRONLY | O_APPEND);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(WriteFile(absl::StrCat("/dev/fd/", fd), {"one\n"}).ok());
  ASSERT_TRUE(
      WriteFile(absl::StrCat("/proc/self/fd/", fd), {"two", "\n"}).ok());
  ASSERT_EQ(write(fd, "after\n", 6), 6);  // Still open, where it was.
  close(fd);
  EXPECT_EQ(ReadFile(Path("log")).value(), "before\none\ntwo\nafter\n");
  struct stat after;
  ASSERT_EQ(stat(Path("log").c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);
  EXPECT_EQ(Listing(), "log\n");

  const int reading = open(Path("log").c_str(), O_RDONLY);
  ASSERT_GE(reading, 0);
  absl::StatusOr<FileWriter> read_only =
      FileWriter::Create(absl::StrCat("/dev/fd/", reading));
  EXPECT_EQ(read_only.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(read_only.status().message(), HasSubstr("reading only"));
  close(reading);
  // Closed now.
  EXPECT_FALSE(FileWriter::Create(absl::StrCat("/dev/fd/", reading)).ok());
}

// A parent may hand its child a non-blocking stdout: a full pipe is waited
// for, not a write cut short with EAGAIN.
TEST_F(FilesTest, ANonBlockingDescriptorIsWrittenWhole) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  ASSERT_EQ(fcntl(fds[1], F_SETFL, fcntl(fds[1], F_GETFL) | O_NONBLOCK), 0);
  const std::string data(4 << 20, 'x');  // Far more than a pipe holds.
  std::string read_back;
  std::thread reader([&] {
    char buffer[1 << 16];
    ssize_t n;
    while ((n = read(fds[0], buffer, sizeof(buffer))) > 0) {
      read_back.append(buffer, n);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
  const absl::Status written =
      WriteFile(absl::StrCat("/dev/fd/", fds[1]), {data});
  close(fds[1]);
  reader.join();
  close(fds[0]);
  EXPECT_TRUE(written.ok()) << written;
  EXPECT_EQ(read_back.size(), data.size());
}

TEST_F(FilesTest, WatchedFilesSayWhenAnyChanged) {
  ASSERT_TRUE(WriteFile(Path("a"), {"one"}).ok());
  WatchedFiles files({Path("a"), Path("b")});
  ASSERT_EQ(files.contents().size(), 2u);
  EXPECT_EQ(files.contents()[0].value_or(""), "one");
  EXPECT_EQ(files.contents()[1].status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(files.Poll());
  ASSERT_TRUE(WriteFile(Path("b"), {"two"}).ok());
  EXPECT_TRUE(files.Poll());
  EXPECT_EQ(files.contents()[1].value_or(""), "two");
  EXPECT_FALSE(files.Poll());
  // The same bytes written again are no change; other bytes, or none, are.
  ASSERT_TRUE(WriteFile(Path("a"), {"one"}).ok());
  EXPECT_FALSE(files.Poll());
  ASSERT_TRUE(WriteFile(Path("a"), {""}).ok());
  EXPECT_TRUE(files.Poll());
  EXPECT_EQ(files.contents()[0].value_or("x"), "");
  ASSERT_EQ(std::remove(Path("b").c_str()), 0);
  EXPECT_TRUE(files.Poll());
  EXPECT_THAT(std::string(files.contents()[1].status().message()),
              HasSubstr(Path("b")));
  EXPECT_FALSE(files.Poll());
}

// A watched path that is, or becomes, a FIFO is refused at once: reading one
// with no writer would block the poller for good (and with it a server's
// start-up, health and drain).
TEST_F(FilesTest, WatchedFilesRefuseFifosWithoutWaitingOnThem) {
  ASSERT_EQ(mkfifo(Path("fifo").c_str(), 0600), 0);
  WatchedFiles fifo({Path("fifo")});
  EXPECT_EQ(fifo.contents()[0].status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(fifo.contents()[0].status().message()),
              HasSubstr(Path("fifo") + " is not a regular file"));
  ASSERT_TRUE(WriteFile(Path("token"), {"secret"}).ok());
  WatchedFiles token({Path("token")});
  ASSERT_EQ(token.contents()[0].value_or(""), "secret");
  ASSERT_EQ(std::rename(Path("fifo").c_str(), Path("token").c_str()), 0);
  EXPECT_TRUE(token.Poll());
  EXPECT_EQ(token.contents()[0].status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace transpose
