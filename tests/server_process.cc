#include "tests/server_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/metrics_scrape.h"

namespace transpose::testing {
namespace {

int PortOf(absl::string_view line) {
  int port = 0;
  const size_t colon = line.rfind(':');
  if (colon == absl::string_view::npos ||
      !absl::SimpleAtoi(line.substr(colon + 1), &port)) {
    return 0;
  }
  return port;
}

// Forks and execs `argv` with the child's `fd` (stdout or stderr) written into
// a pipe, whose read end goes to *read_end, and its stderr into `stderr_path`
// when that is given. The child has this process's environment changed by
// `environment`: NAME=value sets NAME, a bare NAME unsets it.
absl::StatusOr<pid_t> Spawn(std::vector<std::string> argv, int fd,
                            int* read_end, const std::string& stderr_path = "",
                            const std::vector<std::string>& environment = {}) {
  // Built before the fork: the child of a threaded process may not allocate.
  const auto name_of = [](absl::string_view entry) {
    return entry.substr(0, entry.find('='));
  };
  std::vector<std::string> child_environment;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (!absl::c_any_of(environment, [&](const std::string& change) {
          return name_of(change) == name_of(*entry);
        })) {
      child_environment.emplace_back(*entry);
    }
  }
  for (const std::string& change : environment) {
    if (absl::StrContains(change, '=')) child_environment.push_back(change);
  }
  std::vector<char*> c_environment;
  for (std::string& entry : child_environment) {
    c_environment.push_back(entry.data());
  }
  c_environment.push_back(nullptr);
  std::vector<char*> c_argv;
  for (std::string& arg : argv) c_argv.push_back(arg.data());
  c_argv.push_back(nullptr);
  // What the child says if exec fails (strerror is not safe to call there).
  const std::string exec_failed =
      absl::StrCat("cannot exec ", argv[0], " (not there, or not runnable)\n");

  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError("pipe failed");
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    return absl::InternalError("fork failed");
  }
  if (pid == 0) {
    // A test binary that crashes or aborts takes its servers with it, instead
    // of leaving them to hold ports and ctest's output pipe. (The signal comes
    // when the forking thread ends: servers are started from the test's own
    // thread.)
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    dup2(pipe_fds[1], fd);
    if (!stderr_path.empty()) {
      const int log = open(stderr_path.c_str(),
                           O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (log >= 0) dup2(log, STDERR_FILENO);
    }
    execve(c_argv[0], c_argv.data(), c_environment.data());
    // write(), not fprintf: only async-signal-safe calls are safe in the
    // child of a threaded process.
    const ssize_t written =
        write(STDERR_FILENO, exec_failed.data(), exec_failed.size());
    (void)written;  // Nothing more to do if stderr is gone.
    _exit(127);
  }
  close(pipe_fds[1]);
  *read_end = pipe_fds[0];
  return pid;
}

// Waits for the child to exit until `deadline`, then kills it (SIGKILL);
// returns its exit code, or -signal when a signal ended it.
int WaitForExit(pid_t pid, absl::Time deadline) {
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return -WTERMSIG(status);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ServerProcess>>
ServerProcess::StartFromEnvironment(std::vector<std::string> args,
                                    absl::Duration timeout,
                                    const std::string& stderr_path) {
  args.insert(args.begin(), {BackendFlag(), "--log_level=error"});
  return Start(BinaryFromEnvironment(), args, timeout, stderr_path);
}

std::string ServerProcess::BinaryFromEnvironment() {
  const char* binary = std::getenv("TRANSPOSE_SERVER");
  return binary == nullptr ? "transpose_server" : binary;
}

std::string ServerProcess::CliFromEnvironment() {
  if (const char* cli = std::getenv("TRANSPOSE_CLI")) return cli;
  const std::string server = BinaryFromEnvironment();
  return server.substr(0, server.rfind("/server/")) + "/client/transpose";
}

std::string ServerProcess::BackendFromEnvironment() {
  const char* backend = std::getenv("TRANSPOSE_TEST_BACKEND");
  return backend == nullptr ? "cpu" : backend;
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(
    const std::string& binary, const std::vector<std::string>& args,
    absl::Duration timeout, const std::string& stderr_path) {
  std::vector<std::string> argv = {binary, "--address=127.0.0.1:0"};
  bool metrics_set = false;
  for (const std::string& arg : args) {
    if (absl::StartsWith(arg, "--metrics_address")) metrics_set = true;
  }
  if (!metrics_set) argv.push_back("--metrics_address=127.0.0.1:0");
  argv.insert(argv.end(), args.begin(), args.end());
  const bool expect_metrics =
      !absl::c_linear_search(argv, "--metrics_address=");

  int out = -1;
  absl::StatusOr<pid_t> spawned = Spawn(argv, STDOUT_FILENO, &out, stderr_path);
  if (!spawned.ok()) return spawned.status();
  const pid_t pid = *spawned;

  // Read stdout until the port lines arrive.
  std::string text;
  int port = 0, metrics_port = 0;
  const absl::Time deadline = absl::Now() + timeout;
  while (port == 0 || (expect_metrics && metrics_port == 0)) {
    const int64_t ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    pollfd fd{out, POLLIN, 0};
    char buffer[512];
    ssize_t n = 0;
    if (ms <= 0 || poll(&fd, 1, static_cast<int>(ms)) <= 0 ||
        (n = read(out, buffer, sizeof(buffer))) <= 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      close(out);
      return absl::UnavailableError(
          absl::StrCat(binary, " did not report its ports; stdout: ", text));
    }
    text.append(buffer, n);
    for (absl::string_view line : absl::StrSplit(text, '\n')) {
      if (absl::StartsWith(line, "listening on ")) port = PortOf(line);
      if (absl::StartsWith(line, "metrics on ")) metrics_port = PortOf(line);
    }
  }
  // The server writes nothing more to stdout; closing our end is safe.
  close(out);
  return std::unique_ptr<ServerProcess>(
      new ServerProcess(pid, port, metrics_port));
}

ServerProcess::ServerProcess(pid_t pid, int port, int metrics_port)
    : pid_(pid), port_(port), metrics_port_(metrics_port) {}

ServerProcess::~ServerProcess() {
  if (running_) Stop(SIGKILL);
}

namespace {

// A "Name:   N kB" line of /proc/PID/status, in bytes.
uint64_t StatusBytes(pid_t pid, absl::string_view name) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (!absl::StartsWith(line, name) || line.size() <= name.size() ||
        line[name.size()] != ':') {
      continue;
    }
    uint64_t kib = 0;
    absl::string_view value = absl::StripAsciiWhitespace(absl::StripSuffix(
        absl::string_view(line).substr(name.size() + 1), "kB"));
    return absl::SimpleAtoi(value, &kib) ? kib << 10 : 0;
  }
  return 0;
}

}  // namespace

uint64_t ServerProcess::ResidentBytes() const {
  return StatusBytes(pid_, "VmRSS");
}

uint64_t ServerProcess::PeakResidentBytes() const {
  return StatusBytes(pid_, "VmHWM");
}

void ServerProcess::ResetPeakResidentBytes() const {
  std::ofstream(absl::StrCat("/proc/", pid_, "/clear_refs")) << "5";
}

std::string ServerProcess::address() const {
  return absl::StrCat("127.0.0.1:", port_);
}

int ServerProcess::Stop(int signal, absl::Duration timeout) {
  if (!running_) return -1;
  kill(pid_, signal);
  running_ = false;
  return WaitForExit(pid_, absl::Now() + timeout);
}

ServerProcess::Exit ServerProcess::RunUntilExit(
    const std::vector<std::string>& args, absl::Duration timeout,
    const std::function<void(pid_t, absl::string_view)>& on_stderr,
    const std::vector<std::string>& environment) {
  std::vector<std::string> argv = {BinaryFromEnvironment(),
                                   "--address=127.0.0.1:0",
                                   "--metrics_address=127.0.0.1:0"};
  argv.insert(argv.end(), args.begin(), args.end());
  int err = -1;
  absl::StatusOr<pid_t> pid =
      Spawn(argv, STDERR_FILENO, &err, /*stderr_path=*/"", environment);
  if (!pid.ok()) return {-1, pid.status().ToString()};
  Exit exit;
  const absl::Time deadline = absl::Now() + timeout;
  char buffer[512];
  while (absl::Now() < deadline) {
    pollfd fd{err, POLLIN, 0};
    if (poll(&fd, 1, 100) <= 0) continue;
    const ssize_t n = read(err, buffer, sizeof(buffer));
    if (n <= 0) break;  // The server closed stderr: it is exiting.
    exit.stderr_text.append(buffer, n);
    if (on_stderr) on_stderr(*pid, exit.stderr_text);
  }
  close(err);
  exit.code = WaitForExit(*pid, deadline);
  return exit;
}

std::optional<double> ServerProcess::Metric(const std::string& sample) const {
  if (metrics_port_ == 0) return std::nullopt;
  absl::StatusOr<std::string> text =
      FetchUrl(absl::StrCat("http://127.0.0.1:", metrics_port_, "/metrics"));
  if (!text.ok()) return std::nullopt;
  absl::StatusOr<MetricSamples> samples = ParseMetricsText(*text);
  if (!samples.ok()) return std::nullopt;
  const auto it = samples->find(sample);
  if (it == samples->end()) return std::nullopt;
  return it->second;
}

double ServerProcess::AwaitMetric(const std::string& sample, double value,
                                  absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  double last = Metric(sample).value_or(-1);
  while (last != value && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(20));
    last = Metric(sample).value_or(-1);
  }
  return last;
}

}  // namespace transpose::testing
