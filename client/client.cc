#include "client/client.h"

#include <arpa/inet.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/generic/generic_stub.h>

#include <algorithm>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "client/retry_advice.h"
#include "proto/convert.h"
#include "proto/wire.h"
#include "server/core/files.h"
#include "server/core/notification.h"
#include "server/core/process.h"
#include "server/core/retry.h"
#include "server/core/status_macros.h"
#include "server/core/thread_random.h"
#include "server/core/token_file.h"

namespace transpose {
namespace {

// The one token of the token file at `path`, which holds `contents`.
absl::StatusOr<std::string> OneToken(absl::string_view path,
                                     absl::string_view contents) {
  absl::StatusOr<std::vector<std::string>> tokens = ParseTokenFile(contents);
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " ", tokens.status().message()));
  }
  // A server's file may list two while one replaces the other; a client
  // sends one, and which one is for its owner to say.
  if (tokens->size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " holds ", tokens->size(),
        " tokens; a client sends one (a server's --auth_token_file may list "
        "several)"));
  }
  return std::move(tokens->front());
}

void FillHeader(const MatrixView& input, const CallOptions& call,
                v1::TransposeRequest& request) {
  request.set_dtype(api::ToProto(input.dtype));
  api::ToProto(input.shape, *request.mutable_shape());
  request.set_algorithm(api::ToProto(call.algorithm));
}

// Checks that a response header describes the transpose of `input`.
absl::Status CheckResponseHeader(const MatrixView& input,
                                 const v1::TransposeResponse& response) {
  const MatrixShape want = input.shape.Transposed();
  const MatrixShape got = api::FromProto(response.shape());
  if (api::FromProto(response.dtype()) != input.dtype || got != want) {
    return absl::DataLossError(absl::StrFormat(
        "server answered %s %s, expected %s %s",
        DataTypeName(api::FromProto(response.dtype())), ShapeToString(got),
        DataTypeName(input.dtype), ShapeToString(want)));
  }
  return absl::OkStatus();
}

// A wait drawn from half to all of `backoff`, so that clients refused together
// do not come back together.
absl::Duration Jittered(absl::Duration backoff) {
  return backoff * absl::Uniform(ThreadRandom(), 0.5, 1.0);
}

// The last attempt's error, saying that it was not the first, and marked
// for IsRetryable: the failure was worth another try.
absl::Status GaveUp(const absl::Status& last, int attempts,
                    absl::string_view why) {
  if (attempts == 1) return RetryLater(last);
  return RetryLater(
      absl::Status(last.code(), absl::StrCat(last.message(), " (gave up after ",
                                             attempts, " ", why, ")")));
}

// `status` with " [request ID]" after its message, its payloads (the retry
// mark) kept.
absl::Status WithRequestId(const absl::Status& status,
                           absl::string_view request_id) {
  absl::Status named(status.code(), absl::StrCat(status.message(), " [request ",
                                                 request_id, "]"));
  status.ForEachPayload(
      [&named](absl::string_view type, const absl::Cord& payload) {
        named.SetPayload(type, payload);
      });
  return named;
}

absl::Status CancelledByCaller() {
  return absl::CancelledError("the call was cancelled by its caller");
}

constexpr char kNoConnectionPayload[] =
    "type.googleapis.com/transpose.NoConnection";

// `status` with the mark MadeNoConnection reads where `unconnected`
// (Client::UnconnectedNote's) is not empty.
absl::Status MarkNoConnection(absl::Status status,
                              absl::string_view unconnected) {
  if (!unconnected.empty()) status.SetPayload(kNoConnectionPayload, {});
  return status;
}

// A call out of time, its message followed by `unconnected`
// (Client::UnconnectedNote's), and marked when that is not empty.
absl::Status OutOfTime(const absl::Status& status,
                       absl::string_view unconnected) {
  return MarkNoConnection(
      absl::DeadlineExceededError(absl::StrCat(status.message(), unconnected)),
      unconnected);
}

// gRPC says only "Deadline Exceeded"; this says it was the call's own (the
// server ends a stalled stream with the same code) and how long it was.
// `unconnected`: Client::UnconnectedNote's.
absl::Status OwnDeadlinePassed(const absl::Status& last, absl::Duration timeout,
                               int attempts, absl::string_view unconnected) {
  return MarkNoConnection(
      absl::DeadlineExceededError(absl::StrCat(
          last.message(), " (the call's timeout of ",
          absl::FormatDuration(timeout), " passed",
          attempts > 1 ? absl::StrCat(", in attempt ", attempts) : "",
          unconnected, ")")),
      unconnected);
}

// Whether `host` is an IP address: gRPC dials an IP address without a port on
// port 0, and resolves a name without one on 443. An IPv6 address may carry a
// zone ("fe80::1%eth0"), which inet_pton does not take.
bool IsIpAddress(absl::string_view host) {
  const std::string text(host.substr(0, host.find('%')));
  in6_addr address;
  return inet_pton(AF_INET, text.c_str(), &address) == 1 ||
         inet_pton(AF_INET6, text.c_str(), &address) == 1;
}

// Whether a call on `channel` may have reached the server, from the channel's
// state as the call began (the watch's construction) and as it ended: ready
// at either end, it carried the call. gRPC gives no surer sign for a unary
// call (its peer stays unset until the server answers; a stream whose headers
// went out knows, but one queued for a stream slot sent none). It can err both
// ways: a call whose connection the server retired as it ran (a GOAWAY at the
// connection's age, or in a drain), and whose channel is still reconnecting
// when its deadline passes, is taken for one that never reached the server;
// one that began on a ready connection just as it was lost, and then waited
// for another, for one that did.
class ReachWatch {
 public:
  explicit ReachWatch(grpc::Channel& channel)
      : channel_(channel), ready_at_start_(Ready()) {}

  bool MayHaveReached() const { return ready_at_start_ || Ready(); }

 private:
  bool Ready() const {
    return channel_.GetState(/*try_to_connect=*/false) == GRPC_CHANNEL_READY;
  }

  grpc::Channel& channel_;
  const bool ready_at_start_;
};

}  // namespace

bool IsRetryable(const absl::Status& status) { return IsRetryLater(status); }

bool UsesTls(const ClientOptions& options) {
  return options.tls || !options.tls_root_certs_pem.empty() ||
         !options.tls_cert_chain_pem.empty() ||
         !options.tls_private_key_pem.empty();
}

bool MadeNoConnection(const absl::Status& status) {
  return status.GetPayload(kNoConnectionPayload).has_value();
}

uint64_t CallMemoryBytes() {
  const uint64_t cores = std::max(1u, std::thread::hardware_concurrency());
  return kCallBufferBytes + (cores + 6) * ThreadStackBytes();
}

constexpr char kInThisProcessPayload[] =
    "type.googleapis.com/transpose.InThisProcess";

absl::Status InThisProcess(absl::Status status) {
  status.SetPayload(kInThisProcessPayload, {});
  return status;
}

bool IsInThisProcess(const absl::Status& status) {
  return status.GetPayload(kInThisProcessPayload).has_value();
}

std::string StatusText(const absl::Status& status) {
  if (status.ok()) return "OK";
  if (IsInThisProcess(status)) return std::string(status.message());
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ",
                      status.message());
}

void CallCanceller::Cancel() {
  std::lock_guard<std::mutex> lock(mutex_);
  cancelled_ = true;
  for (grpc::ClientContext* context : contexts_) context->TryCancel();
  cancelled_changed_.notify_all();
}

bool CallCanceller::cancelled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cancelled_;
}

bool CallCanceller::SleepUnlessCancelled(absl::Duration wait) {
  // A server's pushback can ask for centuries; past a year, steady_clock's
  // now() + wait could overflow.
  wait = std::min(wait, absl::Hours(24 * 365));
  std::unique_lock<std::mutex> lock(mutex_);
  return !cancelled_changed_.wait_for(lock, absl::ToChronoNanoseconds(wait),
                                      [this] { return cancelled_; });
}

CallCanceller::Scope::Scope(CallCanceller* canceller,
                            grpc::ClientContext& context)
    : canceller_(canceller), context_(&context) {
  if (canceller_ == nullptr) return;
  std::lock_guard<std::mutex> lock(canceller_->mutex_);
  canceller_->contexts_.push_back(context_);
  if (canceller_->cancelled_) context_->TryCancel();
}

CallCanceller::Scope::~Scope() {
  if (canceller_ == nullptr) return;
  std::lock_guard<std::mutex> lock(canceller_->mutex_);
  std::vector<grpc::ClientContext*>& contexts = canceller_->contexts_;
  contexts.erase(std::find(contexts.begin(), contexts.end(), context_));
}

absl::Status CheckTarget(absl::string_view target) {
  const auto invalid = [target](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("target ", target, ": ", why));
  };
  if (target.empty()) {
    return absl::InvalidArgumentError(
        "no target given; expected one such as localhost:50051");
  }
  absl::string_view rest = target;
  for (absl::string_view scheme : {"unix:", "unix-abstract:", "vsock:"}) {
    if (absl::ConsumePrefix(&rest, scheme)) {
      return rest.empty() ? invalid("names no address") : absl::OkStatus();
    }
  }
  bool listed = false;
  if (absl::ConsumePrefix(&rest, "dns:")) {
    // "dns://AUTHORITY/NAME": the authority is the resolver's, not the name.
    if (absl::ConsumePrefix(&rest, "//")) {
      const size_t slash = rest.find('/');
      rest = slash == absl::string_view::npos ? "" : rest.substr(slash + 1);
    }
  } else if (absl::ConsumePrefix(&rest, "ipv4:") ||
             absl::ConsumePrefix(&rest, "ipv6:")) {
    listed = true;  // Addresses separated by commas.
  } else if (absl::StartsWithIgnoreCase(target, "http://") ||
             absl::StartsWithIgnoreCase(target, "https://")) {
    // gRPC would take "http" for a resolver and fail every call on DNS.
    return invalid(
        "a URL; expected host:port (use TLS for what https:// would mean)");
  } else if (absl::StrContains(target, "://")) {
    return absl::OkStatus();  // Another resolver's ("xds:///svc"): its rules.
  }
  // gRPC would fail every call with "Failed to create secure client channel"
  // (TLS or not), "empty address list" or "unparseable host:port".
  if (rest.empty()) return invalid("names no address");
  const std::vector<absl::string_view> addresses =
      listed ? absl::StrSplit(rest, ',') : std::vector<absl::string_view>{rest};
  for (absl::string_view address : addresses) {
    absl::string_view host = address;
    absl::string_view port;
    bool has_port = false;
    if (absl::StartsWith(address, "[")) {
      const size_t close = address.find(']');
      if (close == absl::string_view::npos) {
        return invalid(absl::StrCat(address, " has no closing ]"));
      }
      host = address.substr(1, close - 1);
      absl::string_view after = address.substr(close + 1);
      has_port = absl::ConsumePrefix(&after, ":");
      if (!has_port && !after.empty()) {
        return invalid(absl::StrCat(address, " does not parse as [HOST]:PORT"));
      }
      port = after;
    } else {
      const size_t colon = address.rfind(':');
      // A bare IPv6 address ("::1") names no port.
      has_port = colon != absl::string_view::npos && address.find(':') == colon;
      if (has_port) {
        host = address.substr(0, colon);
        port = address.substr(colon + 1);
      }
    }
    if (host.empty()) return invalid(absl::StrCat(address, " names no host"));
    if (!has_port) {
      // A name takes gRPC's default port, 443. gRPC would dial an address
      // on port 0, and fail every call of an ipv4: or ipv6: list ("Failed to
      // create secure client channel").
      if (listed || IsIpAddress(host)) {
        return invalid(
            absl::StrCat(address,
                         " names no port (the server listens on 50051 unless "
                         "told otherwise)"));
      }
      continue;
    }
    if (port.empty() ||
        !std::all_of(port.begin(), port.end(), absl::ascii_isdigit)) {
      return invalid(absl::StrCat("port '", port, "' is not a number"));
    }
    // gRPC would take it modulo 65536 (":107951" reaching port 42415).
    if (port.size() > 5 || std::stoi(std::string(port)) > 65535) {
      return invalid(absl::StrCat("port ", port, " is past 65535"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckMatrixUnderLimit(const v1::Limits& limits, DataType dtype,
                                   const MatrixShape& shape) {
  TRANSPOSE_ASSIGN_OR_RETURN(const uint64_t bytes, MatrixBytes(dtype, shape));
  if (bytes > limits.max_matrix_bytes()) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s %s: matrix of %d bytes exceeds the server's limit of %d bytes",
        DataTypeName(dtype), ShapeToString(shape), bytes,
        limits.max_matrix_bytes()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadBearerTokenFile(const std::string& path) {
  TRANSPOSE_ASSIGN_OR_RETURN(const std::string contents, ReadFile(path));
  return OneToken(path, contents);
}

class Client::TokenFile {
 public:
  static absl::StatusOr<std::unique_ptr<TokenFile>> Open(
      const std::string& path) {
    auto file = std::unique_ptr<TokenFile>(new TokenFile(path));
    if (!file->watched_.has_value()) {
      TRANSPOSE_ASSIGN_OR_RETURN(file->token_, ReadBearerTokenFile(path));
      return file;
    }
    TRANSPOSE_RETURN_IF_ERROR(file->watched_->contents().front().status());
    TRANSPOSE_ASSIGN_OR_RETURN(
        file->token_, OneToken(path, *file->watched_->contents().front()));
    return file;
  }

  // The token to send now: the file's, read again when a second has passed
  // since the last read (a read costs a system call or two; calls can come
  // thousands a second), or the last good one while the file holds none. A
  // pipe is read once.
  std::string Token() {
    std::lock_guard<std::mutex> lock(mutex_);
    const absl::Time now = absl::Now();
    if (watched_.has_value() && now >= next_read_) {
      next_read_ = now + absl::Seconds(1);
      if (watched_->Poll() && watched_->contents().front().ok()) {
        absl::StatusOr<std::string> token =
            OneToken(watched_->paths().front(), *watched_->contents().front());
        if (token.ok()) token_ = *std::move(token);
      }
    }
    return token_;
  }

 private:
  explicit TokenFile(const std::string& path)
      : next_read_(absl::Now() + absl::Seconds(1)) {
    if (IsRegularFile(path)) watched_.emplace(std::vector<std::string>{path});
  }

  std::mutex mutex_;
  // None for a pipe, read once.
  std::optional<WatchedFiles> watched_;  // Guarded by mutex_.
  std::string token_;                    // Guarded by mutex_.
  absl::Time next_read_;                 // Guarded by mutex_.
};

absl::StatusOr<std::unique_ptr<Client>> Client::Create(
    const ClientOptions& options) {
  TRANSPOSE_RETURN_IF_ERROR(CheckTarget(options.target));
  for (const auto& [name, bytes] :
       {std::pair{"chunk_bytes", options.chunk_bytes},
        std::pair{"unary_max_bytes", options.unary_max_bytes}}) {
    if (bytes > api::kMaxMessageDataBytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s is %d; expected at most %d (gRPC's messages are under 2 GiB)",
          name, bytes, api::kMaxMessageDataBytes));
    }
  }
  if (options.chunk_bytes == 0)
    return absl::InvalidArgumentError("chunk_bytes is 0");
  const bool keepalive = options.keepalive_time != absl::InfiniteDuration();
  if (keepalive && (options.keepalive_time < absl::Seconds(10) ||
                    options.keepalive_timeout <= absl::ZeroDuration())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "keepalive every ", absl::FormatDuration(options.keepalive_time),
        " with a timeout of ", absl::FormatDuration(options.keepalive_timeout),
        "; expected at least 10s (servers refuse more frequent pings) and a "
        "positive timeout, or InfiniteDuration for none"));
  }
  // A default that has always passed would fail every call; unset, a call's
  // own timeout means the default, so "none" is said explicitly.
  if (options.default_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "default_timeout is ", absl::FormatDuration(options.default_timeout),
        "; expected a positive one (InfiniteDuration for none)"));
  }
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_attempts is ", options.max_attempts, "; expected 1 or more"));
  }
  if (options.initial_backoff < absl::ZeroDuration() ||
      options.max_backoff < options.initial_backoff) {
    return absl::InvalidArgumentError(absl::StrCat(
        "backoff from ", absl::FormatDuration(options.initial_backoff), " to ",
        absl::FormatDuration(options.max_backoff),
        "; expected 0 <= initial_backoff <= max_backoff"));
  }
  if (!options.bearer_token.empty() && !options.bearer_token_file.empty()) {
    return absl::InvalidArgumentError(
        "bearer_token and bearer_token_file are both set; expected one");
  }
  std::unique_ptr<TokenFile> token_file;
  if (!options.bearer_token_file.empty()) {
    TRANSPOSE_ASSIGN_OR_RETURN(token_file,
                               TokenFile::Open(options.bearer_token_file));
  }
  // gRPC would refuse the header on every call instead.
  if (!options.bearer_token.empty() && !IsSendableToken(options.bearer_token)) {
    return absl::InvalidArgumentError(
        "bearer_token holds a character that is not visible ASCII (a space, "
        "a line break, a control character or a non-ASCII byte)");
  }
  if (options.connections < 1 || options.connections > kMaxConnections) {
    return absl::InvalidArgumentError(
        absl::StrCat("connections is ", options.connections, "; expected 1 to ",
                     kMaxConnections));
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  if (!options.load_balancing_policy.empty()) {
    args.SetLoadBalancingPolicyName(options.load_balancing_policy);
  }
  // gRPC's reconnection backoff grows to 2 minutes while a server is down, so
  // calls could fail (or, with wait_for_ready, wait) that long more once it
  // is back; servers restart in seconds, and a connection attempt every 5 s
  // (jittered) per client costs a server little.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
  if (keepalive) {
    const auto milliseconds = [](absl::Duration d) {
      return static_cast<int>(
          std::min<int64_t>(absl::ToInt64Milliseconds(d), INT32_MAX));
    };
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS,
                milliseconds(options.keepalive_time));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                milliseconds(options.keepalive_timeout));
    // gRPC's default stops after two pings while no data flows: a call that
    // waits long for its result would then go unwatched.
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::InsecureChannelCredentials();
  if (UsesTls(options)) {
    if (options.tls_cert_chain_pem.empty() !=
        options.tls_private_key_pem.empty()) {
      return absl::InvalidArgumentError(
          "a client certificate needs its key, and the other way round");
    }
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls_root_certs_pem;
    ssl.pem_cert_chain = options.tls_cert_chain_pem;
    ssl.pem_private_key = options.tls_private_key_pem;
    credentials = grpc::SslCredentials(ssl);
  }
  // Channels alike, of this client or another, would share their
  // connections through gRPC's global subchannel pool; each its own pool,
  // each its own connections.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::vector<Connection> connections;
  for (int i = 0; i < options.connections; ++i) {
    std::shared_ptr<grpc::Channel> channel =
        grpc::CreateCustomChannel(options.target, credentials, args);
    if (channel == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot use target ", options.target));
    }
    std::unique_ptr<v1::TransposeService::Stub> stub =
        v1::TransposeService::NewStub(channel);
    connections.push_back({std::move(channel), std::move(stub)});
  }
  return std::unique_ptr<Client>(
      new Client(options, std::move(token_file), std::move(connections)));
}

Client::Client(const ClientOptions& options,
               std::unique_ptr<TokenFile> token_file,
               std::vector<Connection> connections)
    : options_(options),
      token_file_(std::move(token_file)),
      connections_(std::move(connections)),
      calls_running_(connections_.size(), 0) {}

Client::~Client() = default;

class Client::ConnectionLease {
 public:
  explicit ConnectionLease(Client& client) : client_(client) {
    std::lock_guard<std::mutex> lock(client_.connections_mutex_);
    const std::vector<int>& running = client_.calls_running_;
    index_ = std::min_element(running.begin(), running.end()) - running.begin();
    ++client_.calls_running_[index_];
  }
  ~ConnectionLease() {
    std::lock_guard<std::mutex> lock(client_.connections_mutex_);
    --client_.calls_running_[index_];
  }
  ConnectionLease(const ConnectionLease&) = delete;
  ConnectionLease& operator=(const ConnectionLease&) = delete;

  const Connection* operator->() const { return &client_.connections_[index_]; }

 private:
  Client& client_;
  size_t index_;
};

absl::Time Client::DeadlineAfter(std::optional<absl::Duration> timeout) const {
  const absl::Duration after = timeout.value_or(options_.default_timeout);
  return after == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                           : absl::Now() + after;
}

void Client::PrepareContext(grpc::ClientContext& context, absl::Time deadline,
                            absl::string_view request_id) const {
  if (deadline != absl::InfiniteFuture()) {
    context.set_deadline(absl::ToChronoTime(deadline));
  }
  // Only when asked: unset, a service config's waitForReady still applies.
  if (options_.wait_for_ready) context.set_wait_for_ready(true);
  if (!request_id.empty()) {
    context.AddMetadata(api::kRequestIdKey, std::string(request_id));
  }
  const std::string token =
      token_file_ != nullptr ? token_file_->Token() : options_.bearer_token;
  if (!token.empty()) {
    context.AddMetadata("authorization", absl::StrCat("Bearer ", token));
  }
}

absl::StatusOr<uint64_t> Client::CheckCall(const MatrixView& input,
                                           const CallOptions& call) const {
  if (call.cancelled()) return CancelledByCaller();
  TRANSPOSE_ASSIGN_OR_RETURN(const uint64_t bytes,
                             MatrixBytes(input.dtype, input.shape));
  if (input.data.size() != bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "input holds %d bytes; %s %s needs %d", input.data.size(),
        DataTypeName(input.dtype), ShapeToString(input.shape), bytes));
  }
  if (!call.request_id.empty()) {
    TRANSPOSE_RETURN_IF_ERROR(api::CheckRequestId(call.request_id));
  }
  const absl::Duration timeout =
      call.timeout.value_or(options_.default_timeout);
  if (timeout <= absl::ZeroDuration()) {
    return OwnDeadlinePassed(absl::DeadlineExceededError("Deadline Exceeded"),
                             timeout, 1, "");
  }
  return bytes;
}

absl::StatusOr<TransposeResult> Client::Transpose(const MatrixView& input,
                                                  const CallOptions& call) {
  // Everything that would refuse the call is checked before the allocation,
  // which for a large matrix takes a while and may fail.
  TRANSPOSE_ASSIGN_OR_RETURN(const uint64_t bytes, CheckCall(input, call));
  TransposeResult result;
  result.dtype = input.dtype;
  result.shape = input.shape.Transposed();
  try {
    result.data.resize(bytes);
  } catch (const std::bad_alloc&) {
    // A status, as every other failure: a caller that sizes its work by what
    // the machine holds must not have to catch.
    return InThisProcess(absl::ResourceExhaustedError(absl::StrFormat(
        "out of memory for the %d-byte result (TransposeInto writes into a "
        "buffer of the caller's)",
        bytes)));
  }
  TRANSPOSE_ASSIGN_OR_RETURN(
      result.stats, TransposeInto(input, absl::MakeSpan(result.data), call));
  return result;
}

absl::StatusOr<TransposeStats> Client::TransposeInto(const MatrixView& input,
                                                     absl::Span<uint8_t> output,
                                                     const CallOptions& call) {
  TRANSPOSE_ASSIGN_OR_RETURN(const uint64_t bytes, CheckCall(input, call));
  if (output.size() != bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "output holds %d bytes; the result needs %d", output.size(), bytes));
  }
  CallOptions named = call;
  if (named.request_id.empty()) named.request_id = api::NewRequestId();
  absl::StatusOr<TransposeStats> stats =
      TransposeAttempts(input, output, named, bytes);
  // The caller's own cancel needs no id: the server saw nothing worth finding.
  if (stats.ok() || (absl::IsCancelled(stats.status()) && call.cancelled())) {
    return stats;
  }
  return WithRequestId(stats.status(), named.request_id);
}

std::string Client::UnconnectedNote(bool may_have_reached,
                                    bool waited_for_ready) const {
  if (may_have_reached) return "";
  // Without wait_for_ready, a call fails at once on a connection that failed,
  // so one out of time met an attempt still under way.
  return absl::StrCat("; no connection to ", options_.target, " was made",
                      waited_for_ready ? " (wait_for_ready)"
                                       : ": still connecting (name lookup, "
                                         "TCP, TLS or HTTP/2 handshake "
                                         "unfinished)");
}

absl::StatusOr<TransposeStats> Client::TransposeAttempts(
    const MatrixView& input, absl::Span<uint8_t> output,
    const CallOptions& call, uint64_t bytes) {
  const bool unary = !call.force_stream && bytes <= options_.unary_max_bytes;
  const bool messages_within_every_limit =
      (unary ? bytes : std::min(options_.chunk_bytes, bytes)) <=
      api::kMinMessageDataBytes;
  const absl::Duration timeout =
      call.timeout.value_or(options_.default_timeout);
  const absl::Time deadline = DeadlineAfter(timeout);
  const auto own_deadline_passed = [&](const absl::Status& status) {
    return absl::IsDeadlineExceeded(status) && absl::Now() >= deadline;
  };
  if (absl::Now() >= deadline) {
    return OwnDeadlinePassed(absl::DeadlineExceededError("Deadline Exceeded"),
                             timeout, 1, "");
  }
  // The result written over the input (TransposeInto into the input's own
  // buffer): once part of it has arrived, the input is gone.
  const bool in_place = input.data.data() < output.data() + output.size() &&
                        output.data() < input.data.data() + input.data.size();
  absl::Duration backoff = options_.initial_backoff;
  for (int attempt = 1;; ++attempt) {
    if (call.cancelled()) return CancelledByCaller();
    // A progress display can then time the attempt from its start, not from
    // the failed one's last chunk.
    if (attempt > 1 && call.on_progress) {
      call.on_progress({0, 0, output.size(), attempt});
    }
    RetryAdvice advice;
    absl::StatusOr<TransposeStats> stats =
        unary ? Unary(input, output, call, attempt, deadline, advice)
              : Stream(input, output, call, attempt, deadline, advice);
    if (stats.ok()) return stats;
    advice.messages_within_every_limit = messages_within_every_limit;
    // Whatever the failed attempt reported (CANCELLED from gRPC, or a write
    // refused on the cancelled stream), the caller ended it.
    if (call.cancelled()) return CancelledByCaller();
    if (own_deadline_passed(stats.status())) {
      return OwnDeadlinePassed(stats.status(), timeout, attempt,
                               UnconnectedNote(advice.may_have_reached_server,
                                               options_.wait_for_ready));
    }
    if (!Retriable(stats.status(), advice)) return stats;
    if (in_place && advice.result_arrived) {
      return absl::Status(
          stats.status().code(),
          absl::StrCat(stats.status().message(),
                       " (not sent again: part of the result had already been "
                       "written over the input)"));
    }
    if (attempt >= options_.max_attempts) {
      return GaveUp(stats.status(), attempt, "attempts");
    }
    const absl::Duration wait = std::max(
        Jittered(backoff), advice.pushback.value_or(absl::ZeroDuration()));
    if (absl::Now() + wait >= deadline) {
      return GaveUp(stats.status(), attempt, "attempts, at the deadline");
    }
    if (!call.SleepUnlessCancelled(wait)) return CancelledByCaller();
    backoff = std::min(2 * backoff, options_.max_backoff);
  }
}

absl::StatusOr<TransposeStats> Client::Unary(const MatrixView& input,
                                             absl::Span<uint8_t> output,
                                             const CallOptions& call,
                                             int attempt, absl::Time deadline,
                                             RetryAdvice& advice) {
  v1::TransposeRequest request;
  FillHeader(input, call, request);
  request.set_data(input.data.data(), input.data.size());
  v1::TransposeResponse response;
  grpc::ClientContext context;
  PrepareContext(context, deadline, call.request_id);
  const CallCanceller::Scope cancel_scope(call.canceller, context);
  const ConnectionLease connection(*this);
  const ReachWatch reach(*connection->channel);
  const grpc::Status status =
      connection->stub->Transpose(&context, request, &response);
  if (!status.ok()) {
    advice = ReadRetryAdvice(context.GetServerTrailingMetadata());
    advice.may_have_reached_server = reach.MayHaveReached();
    return api::FromGrpcStatus(status);
  }
  TRANSPOSE_RETURN_IF_ERROR(CheckResponseHeader(input, response));
  if (response.data().size() != output.size()) {
    return absl::DataLossError(
        absl::StrFormat("server returned %d bytes, expected %d",
                        response.data().size(), output.size()));
  }
  std::memcpy(output.data(), response.data().data(), output.size());
  if (call.on_progress) {
    call.on_progress({output.size(), output.size(), output.size(), attempt});
  }
  return api::FromProto(response.stats());
}

// TransposeStream through the generic stub with the wire framing: each request
// chunk is copied once, into a buffer gRPC owns (below), and response data
// once, from the transport's slices into `output`. One completion queue per
// call, so calls from many threads never meet.
absl::StatusOr<TransposeStats> Client::Stream(const MatrixView& input,
                                              absl::Span<uint8_t> output,
                                              const CallOptions& call,
                                              int attempt, absl::Time deadline,
                                              RetryAdvice& advice) {
  grpc::ClientContext context;
  PrepareContext(context, deadline, call.request_id);
  const CallCanceller::Scope cancel_scope(call.canceller, context);
  grpc::CompletionQueue queue;
  // Waits for the one operation in flight; false when it failed (the call is
  // over).
  auto await = [&queue] {
    void* tag;
    bool ok = false;
    return queue.Next(&tag, &ok) && ok;
  };
  const ConnectionLease connection(*this);
  grpc::GenericStub stub(connection->channel);
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> stream =
      stub.PrepareCall(
          &context,
          absl::StrCat("/", v1::TransposeService::service_full_name(),
                       "/TransposeStream"),
          &queue);
  // StartCall is done once the call's headers went out on a connection. Not
  // done, the call may still have had one: one queued behind the server's
  // limit on concurrent streams waits on a live connection.
  const ReachWatch reach(*connection->channel);
  stream->StartCall(nullptr);
  const bool started = await();
  bool open = started;

  TransferProgress progress;
  progress.total_bytes = input.data.size();
  progress.attempt = attempt;
  v1::TransposeRequest header;
  FillHeader(input, call, header);
  // Each chunk goes out as a copy that gRPC owns. gRPC's HTTP/2 transport
  // reports a closed stream's pending writes as done at once, so a call that
  // ends early (cancelled, refused, out of time) might return while the
  // transport still writes what it took to the socket, from memory that is
  // the caller's to free by then (read in gRPC's source; a relay that stopped
  // reading, a cancel, the input freed and the relay reading again showed
  // nothing under ASan with chunks that were the input itself). The copy costs
  // nothing measurable (docs/BENCHMARKS.md) and overlaps this chunk's write.
  // Two chunks live at once: the one being written and the next.
  const auto chunk_size = [&](uint64_t offset) {
    return std::min<uint64_t>(options_.chunk_bytes, input.data.size() - offset);
  };
  const auto copy_chunk =
      [&](uint64_t offset) -> absl::StatusOr<grpc::ByteBuffer> {
    const uint64_t n = chunk_size(offset);
    std::shared_ptr<uint8_t[]> copy(new (std::nothrow) uint8_t[n]);
    if (copy == nullptr) {
      return InThisProcess(absl::ResourceExhaustedError(absl::StrFormat(
          "out of memory for a %d-byte chunk (ClientOptions::chunk_bytes)",
          n)));
    }
    std::memcpy(copy.get(), input.data.data() + offset, n);
    return wire::Encode(offset == 0 ? header : v1::TransposeRequest(),
                        absl::MakeConstSpan(copy.get(), n), copy);
  };
  absl::StatusOr<grpc::ByteBuffer> chunk;
  if (open && !input.data.empty()) chunk = copy_chunk(0);
  absl::Status out_of_memory;
  for (uint64_t offset = 0; open && offset < input.data.size();) {
    if (!chunk.ok()) {
      out_of_memory = chunk.status();
      context.TryCancel();
      break;
    }
    stream->Write(*chunk, nullptr);
    offset += chunk_size(offset);
    if (offset < input.data.size()) chunk = copy_chunk(offset);
    open = await();
    progress.sent_bytes = offset;
    if (open && call.on_progress) call.on_progress(progress);
  }

  // The server answers once it has the whole matrix (a failed write above
  // means it already ended the call, and reading then finds the end at once),
  // and ends the call at this side's half-close. That waits for the whole
  // result: once a connection's last call has ended, the server may close the
  // connection (at its age, or in a drain), which resets it under any bytes
  // not read here yet.
  bool half_closed = !open;
  TransposeStats stats;
  bool have_header = false;
  bool have_stats = false;
  absl::Status protocol = absl::OkStatus();
  grpc::ByteBuffer buffer;
  wire::ResponseView response;
  // A response this side cannot use: the call is cancelled, since the server
  // would wait for a half-close that only a whole result brings.
  const auto refuse = [&](absl::Status status) {
    protocol = std::move(status);
    context.TryCancel();
  };
  while (true) {
    stream->Read(&buffer, nullptr);
    if (!await()) break;
    if (!protocol.ok()) continue;  // Drain so Finish returns.
    if (absl::Status parsed = wire::Parse(buffer, response); !parsed.ok()) {
      refuse(std::move(parsed));
      continue;
    }
    if (!have_header) {
      have_header = true;
      // Its data is not this result's.
      if (absl::Status header = CheckResponseHeader(input, response.header);
          !header.ok()) {
        refuse(std::move(header));
        continue;
      }
    }
    if (response.data_size() > output.size() - progress.received_bytes) {
      refuse(absl::DataLossError(
          "server returned more bytes than the result holds"));
      continue;
    }
    for (absl::string_view piece : response.data) {
      std::memcpy(output.data() + progress.received_bytes, piece.data(),
                  piece.size());
      progress.received_bytes += piece.size();
    }
    if (response.header.has_stats()) {
      stats = api::FromProto(response.header.stats());
      have_stats = true;
    }
    if (call.on_progress && response.data_size() > 0)
      call.on_progress(progress);
    if (have_stats && !half_closed) {
      stream->WritesDone(nullptr);
      half_closed = true;
      await();  // A failure shows in the next read.
    }
  }
  grpc::Status status;
  stream->Finish(&status, nullptr);
  await();
  queue.Shutdown();
  void* tag;
  bool ok;
  while (queue.Next(&tag, &ok)) {
  }
  if (!status.ok()) {
    advice = ReadRetryAdvice(context.GetServerTrailingMetadata());
    advice.result_arrived = progress.received_bytes > 0;
    advice.may_have_reached_server = started || reach.MayHaveReached();
  }
  // First: why this side cancelled the call, if it did.
  TRANSPOSE_RETURN_IF_ERROR(out_of_memory);
  TRANSPOSE_RETURN_IF_ERROR(protocol);
  // The stats come with the last chunk, once the server's job has succeeded:
  // with them and every byte here, the call is done, whatever ended the stream
  // after that (the connection lost before the trailers, the deadline, a
  // cancel). Sending it again would only repeat it, and could not be done at
  // all over its own input.
  if (have_stats && progress.received_bytes == output.size()) return stats;
  TRANSPOSE_RETURN_IF_ERROR(api::FromGrpcStatus(status));
  if (progress.received_bytes != output.size() || !have_stats) {
    return absl::DataLossError(
        absl::StrFormat("server ended the stream after %d of %d bytes%s",
                        progress.received_bytes, output.size(),
                        have_stats ? "" : " without stats"));
  }
  return stats;
}

absl::StatusOr<v1::ServerInfo> Client::GetServerInfo(absl::Duration timeout) {
  grpc::ClientContext context;
  const std::string request_id = api::NewRequestId();
  PrepareContext(context, DeadlineAfter(timeout), request_id);
  v1::ServerInfo info;
  const Connection& connection = connections_.front();
  const ReachWatch reach(*connection.channel);
  const absl::Status status =
      api::FromGrpcStatus(connection.stub->GetServerInfo(
          &context, v1::GetServerInfoRequest(), &info));
  if (absl::IsDeadlineExceeded(status)) {
    return WithRequestId(
        OutOfTime(status, UnconnectedNote(reach.MayHaveReached(),
                                          options_.wait_for_ready)),
        request_id);
  }
  if (!status.ok()) return WithRequestId(status, request_id);
  return info;
}

absl::StatusOr<bool> Client::CheckHealth(const std::string& service,
                                         absl::Duration timeout) {
  // grpc.health.v1.HealthCheckRequest{string service = 1}, encoded by hand:
  // Debian's gRPC ships no generated health stub, and the message is one field.
  std::string request_bytes;
  {
    google::protobuf::io::StringOutputStream raw(&request_bytes);
    google::protobuf::io::CodedOutputStream out(&raw);
    if (!service.empty()) {
      out.WriteTag(1 << 3 | 2);
      out.WriteVarint32(static_cast<uint32_t>(service.size()));
      out.WriteString(service);
    }
  }
  grpc::Slice slice(request_bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext context;
  PrepareContext(context, DeadlineAfter(timeout), "");
  // A probe answers for now: a server out of reach is UNAVAILABLE at once.
  context.set_wait_for_ready(false);
  const Connection& connection = connections_.front();
  const ReachWatch reach(*connection.channel);
  grpc::GenericStub stub(connection.channel);
  Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    return OutOfTime(api::FromGrpcStatus(status),
                     UnconnectedNote(reach.MayHaveReached(),
                                     /*waited_for_ready=*/false));
  }
  TRANSPOSE_RETURN_IF_ERROR(api::FromGrpcStatus(status));

  // HealthCheckResponse{ServingStatus status = 1}; SERVING is 1.
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok())
    return absl::DataLossError("unreadable health response");
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  google::protobuf::io::CodedInputStream in(
      reinterpret_cast<const uint8_t*>(bytes.data()),
      static_cast<int>(bytes.size()));
  uint32_t serving_status = 0;
  while (uint32_t tag = in.ReadTag()) {
    if (tag == (1 << 3 | 0)) {
      if (!in.ReadVarint32(&serving_status)) break;
    } else if (!google::protobuf::internal::WireFormatLite::SkipField(&in,
                                                                      tag)) {
      return absl::DataLossError("malformed health response");
    }
  }
  return serving_status == 1;
}

}  // namespace transpose
