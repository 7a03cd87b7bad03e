// transpose: the command-line client. Flags live here only.
//
//   transpose transpose --in A.npy --out B.npy
//   transpose transpose --in A.bin --rows R --cols C --dtype float32 --out
//   B.bin transpose info | health | bench --concurrency 8 --duration 10s
//   --shape 1024x1024

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/bench.h"
#include "client/client.h"
#include "client/metrics_scrape.h"
#include "client/npy.h"
#include "client/progress_bar.h"
#include "client/stop_on_signal.h"
#include "proto/convert.h"
#include "server/core/command_line.h"
#include "server/core/files.h"
#include "server/core/log.h"
#include "server/core/process.h"
#include "server/core/status_macros.h"
#include "server/core/tls_files.h"
#include "server/core/token_file.h"

#ifndef TRANSPOSE_VERSION
#define TRANSPOSE_VERSION "dev"
#endif

ABSL_FLAG(std::string, server, "localhost:50051",
          "Server: any gRPC target, e.g. host:port, dns:///svc:50051, "
          "ipv4:10.0.0.1:50051,10.0.0.2:50051 (not an http:// or https:// "
          "URL, nor an IP address without a port; a name without one gets "
          "gRPC's default, 443).");
ABSL_FLAG(std::optional<absl::Duration>, deadline, std::nullopt,
          "Deadline of each call (default: 10m for transposes and bench, 5s "
          "for info and health).");
ABSL_FLAG(std::optional<int>, attempts, std::nullopt,
          "Attempts per transpose when the server is busy, out of memory for "
          "now, or unreachable, "
          "with backoff, within the deadline (default: 4 for transpose; 1 for "
          "bench, so that it counts refusals).");
ABSL_FLAG(int, connections, 4,
          "HTTP/2 connections to the server (1 to 64); a call takes the one "
          "running the fewest calls. One carries 3-4 GB/s, so calls at once "
          "with large matrices go further over several.");
ABSL_FLAG(bool, wait_for_ready, false,
          "Wait, within the deadline, for the server to be reachable (one "
          "restarting, or not up yet) instead of failing UNAVAILABLE at once "
          "(not for health).");
ABSL_FLAG(std::string, token_file, "",
          "File holding the bearer token to send, alone on its line (a "
          "server's --auth_token_file may list several; give a client one).");
ABSL_FLAG(bool, tls, false,
          "Use TLS, trusting the system's roots (implied by --tls_ca).");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM roots to verify the server's certificate: use TLS.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM client certificate, for servers that require one (with "
          "--tls_key).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, in, "",
          "transpose: input file (.npy, or raw with --rows --cols --dtype); "
          "- for standard input.");
ABSL_FLAG(
    std::string, out, "",
    "transpose: output file; .npy if the name ends in .npy, else raw bytes "
    "(--out_format says otherwise); - for standard output.");
ABSL_FLAG(std::string, out_format, "",
          "transpose: npy or raw; empty: by --out's name.");
ABSL_FLAG(std::optional<uint64_t>, rows, std::nullopt,
          "transpose: rows of a raw input matrix.");
ABSL_FLAG(std::optional<uint64_t>, cols, std::nullopt,
          "transpose: columns of a raw input matrix.");
ABSL_FLAG(std::optional<uint64_t>, batch, std::nullopt,
          "transpose: matrices in a raw input file (default 1).");
ABSL_FLAG(std::string, dtype, "",
          "Element type: float32, float64, float16, bfloat16, int8, uint8, "
          "int16, uint16, "
          "int32, uint32, int64, uint64, complex64, complex128. Required for "
          "raw input; for "
          ".npy input, the type its elements (of that size) go to the server "
          "as, the output keeping the file's dtype; bench default float32.");
ABSL_FLAG(std::string, algorithm, "auto",
          "Kernel: auto, naive, shared, padded_32 or padded_64 (the last four "
          "need a GPU "
          "server).");
ABSL_FLAG(bool, stream, false, "Use TransposeStream even for small matrices.");
ABSL_FLAG(bool, progress, true,
          "Show a progress bar on a terminal for long transfers.");
ABSL_FLAG(std::string, service, "",
          "health: the service to check (empty: the whole server).");
ABSL_FLAG(int, concurrency, 1, "bench: requests in flight (1 to 1024).");
// Optional, so that one given with --count can be told from the default.
ABSL_FLAG(std::optional<absl::Duration>, duration, std::nullopt,
          "bench: how long to run (default 10s).");
ABSL_FLAG(std::optional<uint64_t>, count, std::nullopt,
          "bench: run exactly this many requests (1 or more) instead of "
          "--duration.");
ABSL_FLAG(std::string, shape, "1024x1024",
          "bench: ROWSxCOLS or BATCHxROWSxCOLS.");
ABSL_FLAG(std::string, metrics_url, "",
          "bench: the server's /metrics URL (http://HOST:9464/metrics); prints "
          "the change of "
          "its counters over the run.");
ABSL_FLAG(bool, verify, false,
          "bench: check every result against the CPU transpose.");

namespace transpose {
namespace {

constexpr int kUsageError = 2;
// health: no answer (unreachable, refused, TLS that does not work), as against
// 1 for an answer of NOT_SERVING; and neither an answer nor a failure within
// --deadline, which is how a server that hangs looks (a probe may restart it,
// where a certificate that cannot be used must not restart every pod).
constexpr int kHealthUnknown = 3;
constexpr int kHealthNoAnswerInTime = 4;

// Whether the flags ask for TLS (as UsesTls says of the options they make).
bool TlsFlagsGiven() {
  return absl::GetFlag(FLAGS_tls) || !absl::GetFlag(FLAGS_tls_ca).empty() ||
         !absl::GetFlag(FLAGS_tls_cert).empty() ||
         !absl::GetFlag(FLAGS_tls_key).empty();
}

// gRPC names a TLS mismatch only by its symptom: a TLS server closes a
// plaintext client's connection ("Socket closed", or a reset; other failures
// give those too, hence "if"), and a TLS client's handshake with a plaintext
// server fails ("wrong version number" in OpenSSL's words,
// "WRONG_VERSION_NUMBER" in BoringSSL's).
std::string TlsMismatchHint(const absl::Status& status) {
  if (!absl::IsUnavailable(status)) return "";
  const std::string message = absl::AsciiStrToLower(status.message());
  const bool tls = TlsFlagsGiven();
  if (tls && (absl::StrContains(message, "wrong version number") ||
              absl::StrContains(message, "wrong_version_number"))) {
    return "; the server does not speak TLS: leave out --tls, --tls_ca, "
           "--tls_cert and --tls_key";
  }
  if (!tls && (absl::StrContains(message, "socket closed") ||
               absl::StrContains(message, "connection reset by peer"))) {
    return "; if the server serves TLS, give --tls_ca (its CA) or --tls (the "
           "system's roots)";
  }
  return "";
}

// On one line, which scripts may take as the whole error. `moved_data`: the
// call had sent or received part of its matrix, which a client and server
// that disagree on TLS never do: a connection lost then is not a TLS hint.
int Fail(const absl::Status& status, bool moved_data = false) {
  std::fprintf(stderr, "error: %s%s\n", StatusText(status).c_str(),
               moved_data ? "" : TlsMismatchHint(status).c_str());
  return 1;
}

// An error of this machine's (a file, the input's contents), without the
// status code that would read as the server's answer.
int FailHere(const absl::Status& status) {
  std::fprintf(stderr, "error: %s\n",
               StatusText(InThisProcess(status)).c_str());
  return 1;
}

// A buffer of this machine's that it has no memory for.
absl::Status OutOfMemoryFor(absl::string_view buffer, uint64_t bytes,
                            const std::string& in_path) {
  return absl::ResourceExhaustedError(absl::StrFormat(
      "out of memory for the %d-byte %s of %s (the machine's, its cgroup's or "
      "its ulimit -v)",
      bytes, buffer, in_path));
}

int Usage(const std::string& message) {
  std::fprintf(stderr, "usage error: %s\n(see transpose --help)\n",
               message.c_str());
  return kUsageError;
}

// The --deadline for this command: info and health answer at once, so a probe
// of a hung server gives up after seconds rather than the transfers' minutes.
absl::Duration Deadline(bool quick_call) {
  const std::optional<absl::Duration> deadline = absl::GetFlag(FLAGS_deadline);
  if (deadline.has_value()) return *deadline;
  return quick_call ? absl::Seconds(5) : absl::Minutes(10);
}

// The flags every command shares, checked before any work: a message naming
// the flag, or empty.
std::string CommonFlagsError() {
  if (const std::optional<absl::Duration> deadline =
          absl::GetFlag(FLAGS_deadline);
      deadline.has_value() && *deadline <= absl::ZeroDuration()) {
    return absl::StrCat("--deadline=", absl::FormatDuration(*deadline),
                        ": expected a positive duration, e.g. 30s");
  }
  if (const std::optional<int> attempts = absl::GetFlag(FLAGS_attempts);
      attempts.has_value() && *attempts < 1) {
    return absl::StrCat("--attempts=", *attempts, ": expected 1 or more");
  }
  if (const int connections = absl::GetFlag(FLAGS_connections);
      connections < 1 || connections > kMaxConnections) {
    return absl::StrCat("--connections=", connections, ": expected 1 to ",
                        kMaxConnections);
  }
  if (const absl::Status target = CheckTarget(absl::GetFlag(FLAGS_server));
      !target.ok()) {
    return absl::StrCat("--server=", absl::GetFlag(FLAGS_server), ": ",
                        target.message());
  }
  const std::string cert = absl::GetFlag(FLAGS_tls_cert);
  const std::string key = absl::GetFlag(FLAGS_tls_key);
  if (cert.empty() != key.empty()) {
    return cert.empty() ? absl::StrCat("--tls_key=", key,
                                       ": expected --tls_cert with it")
                        : absl::StrCat("--tls_cert=", cert,
                                       ": expected --tls_key with it");
  }
  return "";
}

// A flag given to a command that does not use it (a typo'd command, or a
// flag meant for another) is a mistake, not something to ignore.
std::string FlagForAnotherCommand(absl::string_view command) {
  struct Owner {
    const absl::CommandLineFlag& flag;
    std::vector<absl::string_view> commands;
  };
  const std::vector<absl::string_view> transpose = {"transpose"};
  const std::vector<absl::string_view> bench = {"bench"};
  const std::vector<absl::string_view> both = {"transpose", "bench"};
  const Owner owners[] = {
      {absl::GetFlagReflectionHandle(FLAGS_in), transpose},
      {absl::GetFlagReflectionHandle(FLAGS_out), transpose},
      {absl::GetFlagReflectionHandle(FLAGS_out_format), transpose},
      {absl::GetFlagReflectionHandle(FLAGS_rows), transpose},
      {absl::GetFlagReflectionHandle(FLAGS_cols), transpose},
      {absl::GetFlagReflectionHandle(FLAGS_batch), transpose},
      {absl::GetFlagReflectionHandle(FLAGS_progress), transpose},
      {absl::GetFlagReflectionHandle(FLAGS_dtype), both},
      {absl::GetFlagReflectionHandle(FLAGS_algorithm), both},
      {absl::GetFlagReflectionHandle(FLAGS_stream), both},
      {absl::GetFlagReflectionHandle(FLAGS_service), {"health"}},
      {absl::GetFlagReflectionHandle(FLAGS_concurrency), bench},
      {absl::GetFlagReflectionHandle(FLAGS_duration), bench},
      {absl::GetFlagReflectionHandle(FLAGS_count), bench},
      {absl::GetFlagReflectionHandle(FLAGS_shape), bench},
      {absl::GetFlagReflectionHandle(FLAGS_metrics_url), bench},
      {absl::GetFlagReflectionHandle(FLAGS_verify), bench},
  };
  for (const Owner& owner : owners) {
    // Set to anything but its default (this Abseil keeps "given on the
    // command line" private; a default given explicitly changes nothing).
    if (owner.flag.CurrentValue() != owner.flag.DefaultValue() &&
        !absl::c_linear_search(owner.commands, command)) {
      return absl::StrCat("--", owner.flag.Name(), " is for ",
                          absl::StrJoin(owner.commands, " and "), ", not ",
                          command);
    }
  }
  return "";
}

// `default_attempts` unless --attempts says otherwise.
absl::StatusOr<ClientOptions> ClientOptionsFromFlags(int default_attempts) {
  ClientOptions options;
  options.target = absl::GetFlag(FLAGS_server);
  options.default_timeout = Deadline(/*quick_call=*/false);
  options.max_attempts =
      absl::GetFlag(FLAGS_attempts).value_or(default_attempts);
  options.connections = absl::GetFlag(FLAGS_connections);
  options.wait_for_ready = absl::GetFlag(FLAGS_wait_for_ready);
  options.tls = absl::GetFlag(FLAGS_tls);
  // The PEM files, read whole.
  struct PemFlag {
    const char* flag;
    std::string path;
    std::string* contents;
  };
  const PemFlag pem_flags[] = {
      {"tls_ca", absl::GetFlag(FLAGS_tls_ca), &options.tls_root_certs_pem},
      {"tls_cert", absl::GetFlag(FLAGS_tls_cert), &options.tls_cert_chain_pem},
      {"tls_key", absl::GetFlag(FLAGS_tls_key), &options.tls_private_key_pem}};
  for (const PemFlag& file : pem_flags) {
    if (file.path.empty()) continue;
    absl::StatusOr<std::string> contents = ReadFile(file.path);
    if (!contents.ok()) {
      return absl::Status(
          contents.status().code(),
          absl::StrCat("--", file.flag, ": ", contents.status().message()));
    }
    *file.contents = *std::move(contents);
  }
  // gRPC would take any of them and fail every call with "empty address list",
  // as if the server were out of reach (which the client retries).
  const auto name_file = [](const PemFlag& file, const absl::Status& status) {
    return status.ok()
               ? status
               : absl::Status(status.code(),
                              absl::StrCat("--", file.flag, ": ", file.path,
                                           " ", status.message()));
  };
  const PemFlag& ca = pem_flags[0];
  const PemFlag& cert = pem_flags[1];
  const PemFlag& key = pem_flags[2];
  if (!ca.path.empty()) {
    TRANSPOSE_RETURN_IF_ERROR(
        name_file(ca, CheckPemCertificates(options.tls_root_certs_pem)));
  }
  if (!cert.path.empty()) {
    TRANSPOSE_RETURN_IF_ERROR(
        name_file(cert, CheckPemCertificates(options.tls_cert_chain_pem)));
  }
  if (!cert.path.empty() && !key.path.empty()) {
    TRANSPOSE_RETURN_IF_ERROR(name_file(
        key, CheckPemKeyMatchesCertificate(options.tls_private_key_pem,
                                           options.tls_cert_chain_pem)));
  }
  // Read here to name the flag in its errors; the client reads a file again
  // as it changes, and a pipe (`<(vault read ...)`) cannot be read twice.
  if (const std::string path = absl::GetFlag(FLAGS_token_file); !path.empty()) {
    absl::StatusOr<std::string> token = ReadBearerTokenFile(path);
    if (!token.ok()) {
      return absl::Status(
          token.status().code(),
          absl::StrCat("--token_file: ", token.status().message()));
    }
    if (IsRegularFile(path)) {
      options.bearer_token_file = path;
    } else {
      options.bearer_token = *std::move(token);
    }
  }
  if (!absl::GetFlag(FLAGS_token_file).empty() && !UsesTls(options)) {
    std::fprintf(stderr,
                 "warning: the --token_file token goes to %s in plaintext "
                 "(give --tls or --tls_ca to encrypt it)\n",
                 options.target.c_str());
  }
  return options;
}

// The part of MemoryLeftBytes that gRPC's calls still need: all of
// CallMemoryBytes before a client has called, and less what the process
// mapped meanwhile (gRPC's threads' stacks and buffers) after, as
// MemoryLeftBytes no longer counts that as left. Counting the whole reserve
// again once connected had bench at 64x64 refused under 400 MiB of ulimit -v
// on a 16-core host, where it runs from 300 MiB.
class CallReserve {
 public:
  // Just before the client is created.
  void ClientStarting() { left_before_client_ = MemoryLeftBytes(); }
  // After the client's first call, before this process allocates more.
  void FirstCallMade() {
    const uint64_t left = MemoryLeftBytes();
    mapped_by_calls_ =
        left_before_client_ > left ? left_before_client_ - left : 0;
  }
  // Never below kCallBufferBytes: gRPC may have started more threads than
  // CallMemoryBytes counts (more cores, --connections), and the call's HTTP/2
  // buffers are still to come.
  uint64_t Bytes() const {
    const uint64_t reserve = CallMemoryBytes();
    return std::max(kCallBufferBytes,
                    reserve - std::min(reserve, mapped_by_calls_));
  }

 private:
  uint64_t left_before_client_ = 0;
  uint64_t mapped_by_calls_ = 0;
};

// Whether a call's memory (`call_bytes`, what the reserve says) is left:
// under a ulimit -v that leaves less, gRPC 1.51 cannot start all of its
// threads and then never finishes a call or its shutdown (info and health
// hung at 40 to 100 MiB). `held` says what the process holds already, for the
// message.
absl::Status CheckMemoryForCall(absl::string_view held = "",
                                uint64_t call_bytes = CallMemoryBytes()) {
  const uint64_t left = MemoryLeftBytes();
  if (left >= call_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%sthis process may take %d more bytes of memory (%s), less than the %d "
      "bytes a call needs",
      held, left, kMemoryLeftSource, call_bytes));
}

// For the commands that connect at once (info, health, bench).
absl::StatusOr<std::unique_ptr<Client>> MakeClient(int default_attempts = 4) {
  absl::StatusOr<ClientOptions> options =
      ClientOptionsFromFlags(default_attempts);
  if (!options.ok()) return options.status();
  TRANSPOSE_RETURN_IF_ERROR(CheckMemoryForCall());
  return Client::Create(*options);
}

std::optional<kernels::Algorithm> ParseAlgorithm(absl::string_view name) {
  for (kernels::Algorithm algorithm : kernels::AllAlgorithms()) {
    if (kernels::AlgorithmName(algorithm) == name) return algorithm;
  }
  return std::nullopt;
}

std::string StatsLine(const TransposeStats& stats) {
  return absl::StrFormat(
      "backend %s, kernel %s: %.3f ms, %.2f GB/s, %.1f%% of copy peak; queue "
      "%.3f ms, copy in "
      "%.3f ms, copy out %.3f ms, server total %.3f ms",
      stats.backend, stats.algorithm, stats.kernel_seconds * 1e3,
      stats.bandwidth_bytes_per_second / 1e9, 100 * stats.peak_fraction,
      stats.queue_seconds * 1e3, stats.copy_in_seconds * 1e3,
      stats.copy_out_seconds * 1e3, stats.total_seconds * 1e3);
}

// A type of the API with `size`-byte elements, for a hint; none for sizes
// no type has.
std::optional<DataType> SomeTypeOfSize(size_t size) {
  for (DataType dtype : {DataType::kUInt8, DataType::kUInt16, DataType::kUInt32,
                         DataType::kUInt64, DataType::kComplex128}) {
    if (ElementSize(dtype) == size) return dtype;
  }
  return std::nullopt;
}

// "A.bin holds 12 bytes; float32 2x2 needs 16". `held` bytes of an input read
// to its end, or, when it was read only one byte past `needed`, more than
// needed.
absl::Status WrongInputSize(const std::string& in_path, uint64_t held,
                            bool read_to_end, DataType dtype,
                            const MatrixShape& shape, uint64_t needed) {
  const bool more = !read_to_end && held > needed;
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s holds %s%d bytes; %s %s needs %d", in_path, more ? "more than " : "",
      more ? needed : held, DataTypeName(dtype), ShapeToString(shape), needed));
}

// What an input holds: its elements' type and shape, and where they start.
struct InputLayout {
  DataType dtype = DataType::kUnspecified;
  MatrixShape shape;
  // A 3-D .npy file (a batch of one included), or raw input with --batch
  // over 1: the output has three dimensions too.
  bool batched = false;
  bool fortran_order = false;
  size_t data_offset = 0;
  // How NumPy describes the elements: a .npy input's descr, which a .npy
  // output keeps whatever type they are sent as.
  std::string descr;
};

// The layout of the `input_bytes` bytes at `in_path` (none: not known yet, and
// left to the caller to check), which begin with `start`: from its .npy
// header, or from the raw-input flags. Returns 0, or the exit code of a mistake
// it has reported.
int ReadLayout(const std::string& in_path, absl::string_view start,
               std::optional<uint64_t> input_bytes,
               std::optional<DataType> dtype, InputLayout& layout) {
  if (IsNpy(start)) {
    absl::StatusOr<NpyHeader> header = ParseNpyHeader(start, input_bytes);
    if (!header.ok()) {
      return FailHere(absl::InvalidArgumentError(
          absl::StrCat(in_path, ": ", header.status().message())));
    }
    if (dtype.has_value()) {
      if (ElementSize(*dtype) != header->element_size) {
        return Usage(absl::StrFormat(
            "--dtype=%s has %d-byte elements, but %s holds '%s', %d-byte "
            "elements",
            DataTypeName(*dtype), ElementSize(*dtype), in_path, header->descr,
            header->element_size));
      }
      layout.dtype = *dtype;
    } else if (header->dtype == DataType::kUnspecified) {
      // A transpose moves whole elements: NumPy's other plain types (bool,
      // datetime64, big-endian numbers, ...) go as a type of their size, and
      // the output keeps the file's descr.
      const std::optional<DataType> same_size =
          SomeTypeOfSize(header->element_size);
      if (!same_size.has_value()) {
        return FailHere(absl::InvalidArgumentError(absl::StrFormat(
            "%s: dtype '%s' has %d-byte elements, and none of the service's "
            "types has",
            in_path, header->descr, header->element_size)));
      }
      layout.dtype = *same_size;
    } else {
      layout.dtype = header->dtype;
    }
    layout.descr = header->descr;
    layout.shape = header->shape;
    layout.batched = header->batched;
    layout.fortran_order = header->fortran_order;
    layout.data_offset = header->data_offset;
    // The header gives the shape: a raw-input flag that says otherwise is a
    // mistake, not something to ignore.
    struct ShapeFlag {
      const char* name;
      std::optional<uint64_t> flag;
      uint64_t file;
    };
    const ShapeFlag shape_flags[] = {
        {"rows", absl::GetFlag(FLAGS_rows), layout.shape.rows},
        {"cols", absl::GetFlag(FLAGS_cols), layout.shape.cols},
        {"batch", absl::GetFlag(FLAGS_batch), layout.shape.batch}};
    for (const ShapeFlag& shape_flag : shape_flags) {
      if (shape_flag.flag.has_value() && *shape_flag.flag != shape_flag.file) {
        return Usage(absl::StrFormat(
            "--%s=%d, but %s holds %s by its .npy header (leave the shape "
            "flags out for .npy input)",
            shape_flag.name, *shape_flag.flag, in_path,
            ShapeToString(layout.shape)));
      }
    }
  } else {
    std::vector<absl::string_view> missing;
    if (!absl::GetFlag(FLAGS_rows).has_value()) missing.push_back("--rows");
    if (!absl::GetFlag(FLAGS_cols).has_value()) missing.push_back("--cols");
    if (!dtype.has_value()) missing.push_back("--dtype");
    // A file named .npy that is not one is damaged (an empty or cut-off
    // download), as one whose header does not parse is: an error of this
    // machine, not of the command line.
    if (!missing.empty() && absl::EndsWithIgnoreCase(in_path, ".npy")) {
      return FailHere(absl::InvalidArgumentError(absl::StrCat(
          in_path,
          ": not a usable .npy file: it does not start as one does "
          "(\\x93NUMPY); raw input needs ",
          absl::StrJoin(missing, ", "))));
    }
    if (!missing.empty()) {
      return Usage(absl::StrCat(in_path,
                                " is not a .npy file; raw input needs ",
                                absl::StrJoin(missing, ", ")));
    }
    layout.dtype = *dtype;
    layout.descr = std::string(NpyDescr(*dtype));
    layout.shape = {absl::GetFlag(FLAGS_batch).value_or(1),
                    *absl::GetFlag(FLAGS_rows), *absl::GetFlag(FLAGS_cols)};
    const std::pair<const char*, uint64_t> dims[] = {
        {"rows", layout.shape.rows},
        {"cols", layout.shape.cols},
        {"batch", layout.shape.batch}};
    for (const auto& [name, value] : dims) {
      if (value == 0)
        return Usage(absl::StrCat("--", name, "=0: expected 1 or more"));
    }
    absl::StatusOr<uint64_t> bytes = MatrixBytes(layout.dtype, layout.shape);
    if (!bytes.ok()) {
      return Usage(absl::StrCat("--batch, --rows and --cols give ",
                                ShapeToString(layout.shape), ": ",
                                bytes.status().message()));
    }
    // Here, before a large file is read, rather than in the client library.
    if (input_bytes.has_value() && *bytes != *input_bytes) {
      return FailHere(WrongInputSize(in_path, *input_bytes,
                                     /*read_to_end=*/true, layout.dtype,
                                     layout.shape, *bytes));
    }
    layout.batched = layout.shape.batch > 1;
  }

  return 0;
}

// The transpose command's flags, checked before any file is opened.
struct TransposeOptions {
  std::string in_path, out_path;
  bool npy_out = false;
  std::optional<DataType> dtype;  // For raw input; .npy input names its own.
  kernels::Algorithm algorithm;
};

absl::StatusOr<kernels::Algorithm> AlgorithmFromFlag() {
  std::optional<kernels::Algorithm> algorithm =
      ParseAlgorithm(absl::GetFlag(FLAGS_algorithm));
  if (!algorithm) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--algorithm=", absl::GetFlag(FLAGS_algorithm), " is unknown"));
  }
  return *algorithm;
}

absl::StatusOr<std::optional<DataType>> DataTypeFromFlag() {
  const std::string name = absl::GetFlag(FLAGS_dtype);
  if (name.empty()) return std::nullopt;
  std::optional<DataType> dtype = DataTypeFromName(name);
  if (!dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dtype=", name, " is unknown"));
  }
  return dtype;
}

absl::StatusOr<TransposeOptions> TransposeOptionsFromFlags() {
  TransposeOptions options;
  // "-": standard input and output, as shell tools take it.
  const auto path_of = [](std::string flag, const char* standard) {
    return flag == "-" ? std::string(standard) : flag;
  };
  options.in_path = path_of(absl::GetFlag(FLAGS_in), "/dev/stdin");
  options.out_path = path_of(absl::GetFlag(FLAGS_out), "/dev/stdout");
  if (options.in_path.empty() || options.out_path.empty())
    return absl::InvalidArgumentError("transpose needs --in and --out");
  const std::string out_format = absl::GetFlag(FLAGS_out_format);
  if (!out_format.empty() && out_format != "npy" && out_format != "raw") {
    return absl::InvalidArgumentError(
        absl::StrCat("--out_format=", out_format, ": expected npy or raw"));
  }
  options.npy_out = out_format.empty()
                        ? absl::EndsWithIgnoreCase(options.out_path, ".npy")
                        : out_format == "npy";
  absl::StatusOr<std::optional<DataType>> dtype = DataTypeFromFlag();
  if (!dtype.ok()) return dtype.status();
  options.dtype = *dtype;
  absl::StatusOr<kernels::Algorithm> algorithm = AlgorithmFromFlag();
  if (!algorithm.ok()) return algorithm.status();
  options.algorithm = *algorithm;
  return options;
}

// The bench command's flags; the caller adds the canceller.
absl::StatusOr<BenchOptions> BenchOptionsFromFlags() {
  BenchOptions options;
  options.concurrency = absl::GetFlag(FLAGS_concurrency);
  if (const std::optional<uint64_t> count = absl::GetFlag(FLAGS_count);
      count.has_value()) {
    if (*count == 0) {
      return absl::InvalidArgumentError("--count=0: expected 1 or more");
    }
    options.count = *count;
  }
  if (const std::optional<absl::Duration> duration =
          absl::GetFlag(FLAGS_duration);
      duration.has_value()) {
    if (options.count > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--count=", options.count, " and --duration=",
          absl::FormatDuration(*duration), " contradict each other: give one"));
    }
    options.duration = *duration;
  }
  options.verify = absl::GetFlag(FLAGS_verify);
  options.call.force_stream = absl::GetFlag(FLAGS_stream);
  options.call.timeout = Deadline(/*quick_call=*/false);
  absl::StatusOr<std::optional<DataType>> dtype = DataTypeFromFlag();
  if (!dtype.ok()) return dtype.status();
  if (dtype->has_value()) options.dtype = **dtype;
  absl::StatusOr<kernels::Algorithm> algorithm = AlgorithmFromFlag();
  if (!algorithm.ok()) return algorithm.status();
  options.call.algorithm = *algorithm;
  std::vector<uint64_t> dims;
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_shape), 'x')) {
    uint64_t dim;
    if (!absl::SimpleAtoi(part, &dim)) {
      dims.clear();
      break;
    }
    dims.push_back(dim);
  }
  if (dims.size() == 2) {
    options.shape = {1, dims[0], dims[1]};
  } else if (dims.size() == 3) {
    options.shape = {dims[0], dims[1], dims[2]};
  } else {
    return absl::InvalidArgumentError(
        "--shape must be ROWSxCOLS or BATCHxROWSxCOLS");
  }
  if (absl::Status checked = CheckBenchOptions(options); !checked.ok()) {
    return checked;
  }
  return options;
}

// One known command, only the flags it and every command take, and their
// values as far as they can be checked without the network or the input
// file. Checked before a command runs, and by --only_check_args.
absl::Status CheckArgs(const std::vector<char*>& positional) {
  if (positional.size() != 2) {
    return absl::InvalidArgumentError(
        "expected one command: transpose, info, health or bench");
  }
  if (const std::string error = CommonFlagsError(); !error.empty()) {
    return absl::InvalidArgumentError(error);
  }
  const std::string command = positional[1];
  if (command != "transpose" && command != "info" && command != "health" &&
      command != "bench") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown command '", command, "'"));
  }
  if (const std::string error = FlagForAnotherCommand(command);
      !error.empty()) {
    return absl::InvalidArgumentError(error);
  }
  if (command == "transpose") return TransposeOptionsFromFlags().status();
  if (command == "bench") return BenchOptionsFromFlags().status();
  return absl::OkStatus();
}

int RunTranspose() {
  absl::StatusOr<TransposeOptions> options = TransposeOptionsFromFlags();
  if (!options.ok()) return Usage(std::string(options.status().message()));
  const std::string& in_path = options->in_path;
  const std::string& out_path = options->out_path;
  const bool npy_out = options->npy_out;
  const std::optional<DataType> dtype = options->dtype;
  const kernels::Algorithm algorithm = options->algorithm;

  // Before the input is read, so that an unwritable --out or an unreadable
  // --tls_ca fails at once.
  absl::StatusOr<FileWriter> output = FileWriter::Create(out_path);
  if (!output.ok()) return FailHere(output.status());
  absl::StatusOr<ClientOptions> client_options =
      ClientOptionsFromFlags(/*default_attempts=*/4);
  if (!client_options.ok()) return FailHere(client_options.status());
  // The client, and with it gRPC's threads, starts only once a call is due:
  // under a tight ulimit -v some of those threads cannot start, and gRPC 1.51
  // then never finishes shutting down, so that an input refused here would
  // leave the process hanging at exit.
  std::unique_ptr<Client> client;
  CallReserve reserve;
  const auto connect = [&client, &client_options, &reserve]() -> absl::Status {
    if (client != nullptr) return absl::OkStatus();
    reserve.ClientStarting();
    absl::StatusOr<std::unique_ptr<Client>> created =
        Client::Create(*client_options);
    if (!created.ok()) return created.status();
    client = *std::move(created);
    return absl::OkStatus();
  };

  // A large input is checked against the server's limit and this machine's
  // memory (it and the result are both held here) from its start, before the
  // rest is read: a regular file from its first MiB, a pipe from its first
  // 64 MiB (a pipe's size shows only at its end). Smaller inputs are read
  // whole at once.
  constexpr uint64_t kCheckAbove = 64 << 20;
  constexpr size_t kHeaderBytes = 1 << 20;
  absl::StatusOr<FileReader> reader = FileReader::Open(in_path);
  if (!reader.ok()) return FailHere(reader.status());
  std::string contents;
  const std::optional<uint64_t> regular_size = reader->regular_size();
  if (absl::Status read = reader->ReadUpTo(
          regular_size.value_or(0) > kCheckAbove ? kHeaderBytes
                                                 : kCheckAbove + 1,
          contents);
      !read.ok()) {
    return FailHere(read);
  }
  const bool large = !reader->ended();
  // A large pipe's layout is read without its size, and the size is checked
  // once it has been read.
  const std::optional<uint64_t> input_bytes =
      large ? regular_size : std::optional<uint64_t>(contents.size());

  InputLayout layout;
  if (const int mistake =
          ReadLayout(in_path, contents, input_bytes, dtype, layout);
      mistake != 0) {
    return mistake;
  }
  MatrixView input;
  input.dtype = layout.dtype;
  input.shape = layout.shape;

  // A Fortran-order file (np.save of a transposed view writes one) stores
  // element (b, r, c) at b + B * (r + R * c). One matrix's elements are then
  // already its transpose in C order, and need no call; a batch's form a
  // (C * R) x B matrix in C order, whose transpose is the result.
  const bool no_call =
      input.shape.empty() || (layout.fortran_order && input.shape.batch == 1);
  if (large) {
    // The layout has checked that the shape's bytes add up.
    const uint64_t expected_bytes =
        layout.data_offset +
        (input.shape.empty() ? 0 : *MatrixBytes(input.dtype, input.shape));
    // A server that does not answer here is left to the transpose call,
    // which retries; this check waits for it 5 s at most, not a --deadline
    // meant for the transfer (a hung server would take twice that). Where not
    // even a call's memory is left, the memory check below refuses without
    // starting gRPC, which would then never finish shutting down.
    if (!no_call && MemoryLeftBytes() >= CallMemoryBytes()) {
      if (absl::Status connected = connect(); !connected.ok()) {
        return FailHere(connected);
      }
      absl::StatusOr<v1::ServerInfo> info = client->GetServerInfo(
          std::min(Deadline(/*quick_call=*/true), absl::Seconds(5)));
      reserve.FirstCallMade();
      if (info.ok()) {
        if (absl::Status under =
                CheckMatrixUnderLimit(info->limits(), input.dtype, input.shape);
            !under.ok()) {
          return Fail(under);
        }
      }
    }
    // A file that holds its transpose already is only read and written.
    const uint64_t call_bytes = no_call ? 0 : reserve.Bytes();
    const uint64_t buffers = no_call ? 1 : 2;
    if (const uint64_t left = MemoryLeftBytes();
        left < call_bytes || expected_bytes > (left - call_bytes) / buffers) {
      return FailHere(absl::ResourceExhaustedError(absl::StrFormat(
          "%s holds %s %s, %d bytes; %sthat is more than the %d bytes of "
          "memory this process may still take (%s)",
          in_path, DataTypeName(input.dtype), ShapeToString(input.shape),
          expected_bytes,
          no_call ? ""
                  : absl::StrFormat("with its result and the %d bytes a call "
                                    "needs ",
                                    call_bytes),
          left, kMemoryLeftSource)));
    }
    // One byte more shows an input longer than its shape without reading all
    // of an endless pipe.
    try {
      contents.reserve(expected_bytes + 1);
    } catch (const std::bad_alloc&) {
      return FailHere(OutOfMemoryFor("input", expected_bytes, in_path));
    }
    if (absl::Status read = reader->ReadUpTo(expected_bytes + 1, contents);
        !read.ok()) {
      return FailHere(read);
    }
    if (contents.size() != expected_bytes) {
      if (regular_size.has_value()) {
        return FailHere(absl::AbortedError(
            absl::StrCat(in_path, " changed size while it was read")));
      }
      return FailHere(WrongInputSize(in_path, contents.size(),
                                     /*read_to_end=*/false, input.dtype,
                                     input.shape, expected_bytes));
    }
  }
  input.data = absl::Span<const uint8_t>(
      reinterpret_cast<const uint8_t*>(contents.data()) + layout.data_offset,
      contents.size() - layout.data_offset);

  const auto write = [&](const MatrixShape& shape,
                         absl::Span<const uint8_t> data,
                         const std::string& how) {
    const std::string npy_header =
        npy_out ? FormatNpyHeader(layout.descr, shape, layout.batched) : "";
    const absl::string_view parts[] = {
        npy_header,
        absl::string_view(reinterpret_cast<const char*>(data.data()),
                          data.size())};
    if (absl::Status written = output->Commit(parts); !written.ok())
      return FailHere(written);
    // As the file's dimensions: a batch of one keeps its batch.
    const auto dims = [&layout](const MatrixShape& s) {
      return layout.batched ? absl::StrCat(s.batch, "x", s.rows, "x", s.cols)
                            : ShapeToString(s);
    };
    // Elements of another NumPy type say what they were sent as.
    const std::string elements =
        layout.descr == NpyDescr(input.dtype)
            ? std::string(DataTypeName(input.dtype))
            : absl::StrFormat("'%s' as %s", layout.descr,
                              DataTypeName(input.dtype));
    std::fprintf(stderr, "%s %s -> %s written to %s\n%s\n", elements.c_str(),
                 dims(input.shape).c_str(), dims(shape).c_str(),
                 out_path.c_str(), how.c_str());
    return 0;
  };
  // NumPy transposes empty arrays too; the service takes none, and none is
  // needed.
  if (input.shape.empty()) {
    return write(input.shape.Transposed(), {},
                 "empty: no data, no call to the server");
  }

  MatrixView sent = input;
  if (layout.fortran_order) {
    if (no_call) {
      return write(input.shape.Transposed(), input.data,
                   "Fortran order: the file holds the transpose already, no "
                   "call to the server");
    }
    sent.shape = {1, input.shape.cols * input.shape.rows, input.shape.batch};
  }

  ProgressBar bar(absl::GetFlag(FLAGS_progress) &&
                  ProgressBar::StderrIsTerminal());
  CallOptions call;
  call.algorithm = algorithm;
  call.force_stream = absl::GetFlag(FLAGS_stream);
  bool moved_data = false;
  call.on_progress = [&bar, &moved_data](const TransferProgress& p) {
    moved_data = moved_data || p.sent_bytes > 0 || p.received_bytes > 0;
    bar.Update(p);
  };
  // The result's buffer is the CLI's, so that running out of memory for it
  // reads as this machine's failure, not as a status from the server.
  const uint64_t result_bytes = input.data.size();
  std::unique_ptr<uint8_t[]> result_data(new (std::nothrow)
                                             uint8_t[result_bytes]);
  if (result_data == nullptr) {
    return FailHere(OutOfMemoryFor("result", result_bytes, in_path));
  }
  if (absl::Status memory = CheckMemoryForCall(
          absl::StrFormat("with the input and the result of %s held (%d "
                          "bytes each), ",
                          in_path, result_bytes),
          reserve.Bytes());
      !memory.ok()) {
    return FailHere(memory);
  }
  if (absl::Status connected = connect(); !connected.ok()) {
    return FailHere(connected);
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<TransposeStats> result = client->TransposeInto(
      sent, absl::MakeSpan(result_data.get(), result_bytes), call);
  bar.Done();
  // The hint only when this call's own deadline ran out (the library names
  // it): the server ends a stalled stream with the same code, and a longer
  // deadline does not help there, nor to reach a server out of reach.
  if (absl::IsDeadlineExceeded(result.status()) &&
      absl::Now() - start >= Deadline(/*quick_call=*/false) &&
      !MadeNoConnection(result.status())) {
    return Fail(absl::DeadlineExceededError(absl::StrCat(
        result.status().message(),
        "; a longer --deadline gives large matrices and slow links their "
        "time")));
  }
  if (!result.ok()) return Fail(result.status(), moved_data);
  return write(input.shape.Transposed(),
               absl::MakeConstSpan(result_data.get(), result_bytes),
               StatsLine(*result));
}

// Servers that predate a limit's field leave it out.
std::string StreamIdleTimeoutText(const v1::Limits& limits) {
  if (!limits.has_stream_idle_seconds()) {
    return "stream idle timeout not reported";
  }
  if (limits.stream_idle_seconds() == 0) return "no stream idle timeout";
  return absl::StrFormat("stream idle timeout %g s",
                         limits.stream_idle_seconds());
}

// In the largest binary unit that leaves at least 1 of it, rounded, so that
// neither 1000 bytes reads "0.0 MiB" nor 6 GiB "6144.0 MiB" (nor 2^30 - 1
// bytes "1024.0 MiB").
std::string BytesText(uint64_t bytes) {
  if (bytes < 1024) return absl::StrCat(bytes, bytes == 1 ? " byte" : " bytes");
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  double value = bytes / 1024.0;
  size_t unit = 0;
  while (value >= 1023.95 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

std::string AdmissionText(uint64_t bytes, uint32_t requests) {
  return absl::StrCat(bytes == 0
                          ? "no limit on bytes"
                          : absl::StrCat(BytesText(bytes), " of matrices"),
                      " and ",
                      requests == 0 ? "no limit on requests"
                                    : absl::StrCat(requests, " requests"));
}

std::string PerPeerAdmissionText(const v1::Limits& limits) {
  if (!limits.has_max_inflight_bytes_per_peer() ||
      !limits.has_max_inflight_requests_per_peer()) {
    return "not reported by this server";
  }
  if (limits.max_inflight_bytes_per_peer() == 0 &&
      limits.max_inflight_requests_per_peer() == 0) {
    return "no share of its own";
  }
  return AdmissionText(limits.max_inflight_bytes_per_peer(),
                       limits.max_inflight_requests_per_peer());
}

int RunInfo() {
  absl::StatusOr<std::unique_ptr<Client>> client = MakeClient();
  if (!client.ok()) return FailHere(client.status());
  absl::StatusOr<v1::ServerInfo> info =
      (*client)->GetServerInfo(Deadline(/*quick_call=*/true));
  if (!info.ok()) return Fail(info.status());
  std::printf("server %s at %s\n", info->version().c_str(),
              absl::GetFlag(FLAGS_server).c_str());
  for (const v1::Backend& backend : info->backends()) {
    std::vector<std::string> algorithms;
    for (int a : backend.algorithms()) {
      algorithms.emplace_back(
          kernels::AlgorithmName(static_cast<kernels::Algorithm>(a)));
    }
    std::printf(
        "backend %s: %s, %s, %u streams, %.1f GiB memory, copy bandwidth %.1f "
        "GB/s, "
        "algorithms %s\n",
        backend.name().c_str(), backend.device_name().c_str(),
        backend.healthy() ? "healthy" : "UNHEALTHY", backend.streams(),
        backend.total_memory_bytes() / 1073741824.0,
        backend.calibrated_copy_bandwidth_bytes_per_second() / 1e9,
        absl::StrJoin(algorithms, ", ").c_str());
  }
  const v1::Limits& limits = info->limits();
  std::printf("limits: unary message %s, matrix %s, response chunk %s, %s\n",
              BytesText(limits.max_message_bytes()).c_str(),
              BytesText(limits.max_matrix_bytes()).c_str(),
              BytesText(limits.response_chunk_bytes()).c_str(),
              StreamIdleTimeoutText(limits).c_str());
  // Past these, requests are refused busy (RESOURCE_EXHAUSTED) until others
  // finish.
  std::printf(
      "admission: %s at once; each client host: %s\n",
      AdmissionText(limits.max_inflight_bytes(), limits.max_inflight_requests())
          .c_str(),
      PerPeerAdmissionText(limits).c_str());
  return 0;
}

int RunHealth() {
  absl::StatusOr<std::unique_ptr<Client>> client = MakeClient();
  if (!client.ok()) {
    FailHere(client.status());
    return kHealthUnknown;
  }
  const std::string service = absl::GetFlag(FLAGS_service);
  absl::StatusOr<bool> serving =
      (*client)->CheckHealth(service, Deadline(/*quick_call=*/true));
  // The server answered, for a service it does not serve: not serving it,
  // as a Kubernetes gRPC probe would take it.
  if (absl::IsNotFound(serving.status())) {
    std::printf("NOT_SERVING (%s: the server has no such service)\n",
                service.c_str());
    return 1;
  }
  if (!serving.ok()) {
    Fail(serving.status());
    return absl::IsDeadlineExceeded(serving.status()) ? kHealthNoAnswerInTime
                                                      : kHealthUnknown;
  }
  std::printf("%s%s\n", *serving ? "SERVING" : "NOT_SERVING",
              service.empty() ? "" : absl::StrCat(" (", service, ")").c_str());
  return *serving ? 0 : 1;
}

int RunBenchCommand() {
  absl::StatusOr<BenchOptions> parsed = BenchOptionsFromFlags();
  if (!parsed.ok()) return Usage(std::string(parsed.status().message()));
  BenchOptions options = *std::move(parsed);
  // Where not even the calls fit, before any thread starts: under so tight a
  // ulimit -v Ctrl-C's watcher or some of gRPC's threads cannot start, and
  // gRPC 1.51 then never finishes shutting down. Otherwise the server's limit
  // is checked first. The watcher's stack counts with the calls': without it,
  // MakeClient refused where this check passed, with a message that did not
  // name the bench's buffers.
  if (const uint64_t watcher_and_calls = CallMemoryBytes() + ThreadStackBytes();
      MemoryLeftBytes() < watcher_and_calls) {
    if (absl::Status memory = CheckBenchMemory(options, watcher_and_calls);
        !memory.ok()) {
      return FailHere(memory);
    }
  }
  // Before the client starts gRPC's threads, which inherit the blocked
  // signals. Armed around the run: Ctrl-C then ends it early, with its
  // report; before and after, Ctrl-C ends the process as usual.
  CallCanceller stop;
  StopOnSignal stop_on_signal(stop);
  options.call.canceller = &stop;

  CallReserve reserve;
  reserve.ClientStarting();
  absl::StatusOr<std::unique_ptr<Client>> client =
      MakeClient(/*default_attempts=*/1);
  if (!client.ok()) return FailHere(client.status());
  const absl::Status fits =
      CheckBenchFits(**client, options, Deadline(/*quick_call=*/true));
  reserve.FirstCallMade();
  if (!fits.ok()) return Fail(fits);
  if (absl::Status memory = CheckBenchMemory(options, reserve.Bytes());
      !memory.ok()) {
    return FailHere(memory);
  }
  const std::string metrics_url = absl::GetFlag(FLAGS_metrics_url);
  absl::StatusOr<MetricSamples> before;
  if (!metrics_url.empty()) {
    absl::StatusOr<std::string> text = FetchUrl(metrics_url);
    before = text.ok() ? ParseMetricsText(*text) : text.status();
    if (!before.ok()) return FailHere(before.status());
  }
  stop_on_signal.Arm();
  std::fprintf(
      stderr, "bench running%s; Ctrl-C stops it early\n",
      options.count > 0
          ? ""
          : absl::StrCat(" for ", absl::FormatDuration(options.duration))
                .c_str());
  absl::StatusOr<BenchReport> report = RunBench(**client, options);
  stop_on_signal.Disarm();
  if (!report.ok()) return Fail(report.status());
  std::printf("%s", FormatBenchReport(options, *report).c_str());
  // Out before a signal can end the process.
  std::fflush(stdout);
  // 128 + the signal, as a shell reports a command the signal ended; no
  // metrics delta for a run cut short.
  if (report->stopped) return 128 + stop_on_signal.signal();
  if (!metrics_url.empty()) {
    // The server counts a unary call once gRPC is done with it, which can be
    // just after its client has the result: scrape until the run's successes
    // are counted, for a while. (Its failures may never be: some are refused
    // before the service sees them.) Other clients' requests in the interval
    // show up too.
    const double succeeded = static_cast<double>(report->requests);
    const absl::Time give_up = absl::Now() + absl::Seconds(2);
    absl::StatusOr<MetricSamples> after;
    while (true) {
      absl::StatusOr<std::string> text = FetchUrl(metrics_url);
      after = text.ok() ? ParseMetricsText(*text) : text.status();
      if (!after.ok()) return FailHere(after.status());
      if (OkRequestsCounted(*before, *after) >= succeeded ||
          absl::Now() > give_up) {
        break;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    std::printf("server metrics delta (%s):\n%s", metrics_url.c_str(),
                FormatMetricsDelta(*before, *after).c_str());
  }
  return report->errors == 0 ? 0 : 1;
}

}  // namespace
}  // namespace transpose

int main(int argc, char** argv) {
  transpose::SetUpProcess();
  transpose::RemoveTemporaryFilesOnSignal();
  transpose::ProgramUsage usage;
  usage.name = "transpose";
  usage.version = TRANSPOSE_VERSION;
  usage.main_source_suffix = "client/cli_main.cc";
  usage.usage_message =
      "Client of the transpose service.\n"
      "Usage: transpose COMMAND [flags], where COMMAND is one of\n"
      "  transpose --in A.npy --out B.npy       transpose a matrix (or a 3-D "
      "batch)\n"
      "  info                                    show the server's devices and "
      "limits\n"
      "  health [--service NAME]                 exit 0 when the server is "
      "SERVING\n"
      "  bench [--concurrency N] [--duration D | --count N] [--shape RxC] "
      "[--dtype T]\n"
      "Common flags: --server TARGET --deadline D --token_file F --tls "
      "[--tls_ca F --tls_cert F --tls_key F]";
  usage.check_args = transpose::CheckArgs;
  usage.report_refusal = [](const absl::Status& refusal) {
    transpose::Usage(std::string(refusal.message()));
  };
  // "--in -" as shell tools take it: Abseil would warn that a value starting
  // with "-" may be a flag; "--in=-" it takes quietly.
  std::vector<std::string> joined;
  std::vector<char*> args;
  joined.reserve(argc);
  for (int i = 0; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (i + 1 < argc && absl::string_view(argv[i + 1]) == "-" &&
        (arg == "--in" || arg == "-in" || arg == "--out" || arg == "-out")) {
      joined.push_back(absl::StrCat(arg, "=-"));
      args.push_back(joined.back().data());
      ++i;
    } else {
      args.push_back(argv[i]);
    }
  }
  const std::vector<char*> positional = transpose::ParseCommandLine(
      static_cast<int>(args.size()), args.data(), usage);
  // gRPC's own error lines repeat what the CLI's "error:" line says; gRPC's
  // GRPC_VERBOSITY shows them, and with "info" or "debug" more.
  transpose::RouteGrpcLogs();
  transpose::SetLogLevel(std::getenv("GRPC_VERBOSITY") != nullptr
                             ? transpose::LogLevel::kDebug
                             : transpose::LogLevel::kError);
  if (const absl::Status status = transpose::CheckArgs(positional);
      !status.ok()) {
    return transpose::Usage(std::string(status.message()));
  }
  const std::string command = positional[1];
  if (command == "info") return transpose::RunInfo();
  if (command == "health") return transpose::RunHealth();
  // The memory checks above the large allocations cannot foresee every limit
  // (another process's use, overcommit turned off): running out is an error
  // line, not an abort, and the output's temporary file goes with the stack.
  try {
    return command == "transpose" ? transpose::RunTranspose()
                                  : transpose::RunBenchCommand();
  } catch (const std::bad_alloc&) {
    return transpose::FailHere(absl::ResourceExhaustedError(
        "out of memory: this process may not allocate what the matrix and "
        "its result need"));
  }
}
