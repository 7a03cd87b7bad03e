// Runs the real transpose_server binary as a child process on loopback, port 0,
// for end-to-end tests and benchmarks.
#ifndef TRANSPOSE_TESTS_SERVER_PROCESS_H_
#define TRANSPOSE_TESTS_SERVER_PROCESS_H_

#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace transpose::testing {

// A file for a server's log (ServerProcess::Start's stderr_path), removed
// with this object.
class ServerLog {
 public:
  ServerLog() {
    char path[] = "/tmp/transpose-server-log-XXXXXX";
    const int fd = mkstemp(path);
    if (fd >= 0) close(fd);
    path_ = path;
  }
  ~ServerLog() { unlink(path_.c_str()); }
  ServerLog(const ServerLog&) = delete;
  ServerLog& operator=(const ServerLog&) = delete;

  const std::string& path() const { return path_; }
  std::string Read() const {
    std::ifstream file(path_);
    return std::string(std::istreambuf_iterator<char>(file),
                       std::istreambuf_iterator<char>());
  }

 private:
  std::string path_;
};

class ServerProcess {
 public:
  // Starts `binary` with `args` plus --address=127.0.0.1:0 (and
  // --metrics_address=127.0.0.1:0 unless args set it), and waits for its
  // "listening on" line. Its log goes to `stderr_path` when given, else to
  // this process's stderr. The server is killed when the calling thread ends,
  // so call this from the test's own thread, not one that ends before it.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const std::string& binary, const std::vector<std::string>& args,
      absl::Duration timeout = absl::Seconds(60),
      const std::string& stderr_path = "");

  // Starts the server the environment names, on the backend it asks for,
  // logging errors only (a later --log_level in `args` wins), with `args`
  // added.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> StartFromEnvironment(
      std::vector<std::string> args, absl::Duration timeout = absl::Seconds(60),
      const std::string& stderr_path = "");

  // The server binary named by the TRANSPOSE_SERVER environment variable.
  static std::string BinaryFromEnvironment();
  // The --backend the environment asks tests to use (TRANSPOSE_TEST_BACKEND,
  // default cpu).
  static std::string BackendFromEnvironment();
  // That backend as a --backend flag.
  static std::string BackendFlag() {
    return "--backend=" + BackendFromEnvironment();
  }
  // The transpose CLI: TRANSPOSE_CLI, else beside the server in the build tree.
  static std::string CliFromEnvironment();

  // How a run of the server ended, for flag values it must refuse.
  struct Exit {
    int code = -1;  // The exit code, or -signal.
    std::string stderr_text;
  };
  // Runs the environment's server with `args` (on loopback, port 0) until it
  // exits, collecting what it writes to stderr; SIGKILL after `timeout`.
  // `on_stderr`, if given, sees the server's pid and its stderr so far each
  // time more arrives. The server's environment is this process's changed by
  // `environment`: NAME=value sets NAME, a bare NAME unsets it.
  static Exit RunUntilExit(
      const std::vector<std::string>& args,
      absl::Duration timeout = absl::Seconds(20),
      const std::function<void(pid_t, absl::string_view)>& on_stderr = nullptr,
      const std::vector<std::string>& environment = {});

  ~ServerProcess();

  // "127.0.0.1:PORT".
  std::string address() const;
  int port() const { return port_; }
  // 0 when metrics are disabled.
  int metrics_port() const { return metrics_port_; }
  pid_t pid() const { return pid_; }
  // Its resident memory now (VmRSS) and at its peak (VmHWM), in bytes; 0 if
  // /proc cannot tell.
  uint64_t ResidentBytes() const;
  uint64_t PeakResidentBytes() const;
  // Starts the peak over from the resident memory now.
  void ResetPeakResidentBytes() const;
  // One sample of its /metrics page, named as the page writes it (labels in
  // order: `transpose_requests_total{code="OK",method="Transpose"}`); nullopt
  // when the page cannot be read or lacks it.
  std::optional<double> Metric(const std::string& sample) const;
  // Waits up to `timeout` for the sample to read `value` (the server records
  // a call once it is done, which can be just after its client has the
  // status); returns the last reading, -1 for none.
  double AwaitMetric(const std::string& sample, double value,
                     absl::Duration timeout = absl::Seconds(5)) const;

  // Sends `signal` and waits up to `timeout` for the exit; returns the exit
  // code, or -signal when it died of a signal. Kills it (SIGKILL) if it
  // outlives the timeout.
  int Stop(int signal, absl::Duration timeout = absl::Seconds(30));

 private:
  ServerProcess(pid_t pid, int port, int metrics_port);

  pid_t pid_;
  int port_;
  int metrics_port_;
  bool running_ = true;
};

}  // namespace transpose::testing

#endif  // TRANSPOSE_TESTS_SERVER_PROCESS_H_
