// The C++ client library of the transpose service. A Client is cheap to share:
// every method is safe to call from many threads at once, over its channels
// (ClientOptions::connections).
#ifndef TRANSPOSE_CLIENT_CLIENT_H_
#define TRANSPOSE_CLIENT_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "kernels/transpose_args.h"
#include "server/core/matrix.h"
#include "server/core/stats.h"
#include "transpose/v1/transpose.grpc.pb.h"

namespace transpose {

// Checks a gRPC target before gRPC takes it: INVALID_ARGUMENT, naming the
// target, for an empty target, no address ("dns:///", "unix:"), an address with
// no host
// (":50051"), a port that is not a number ("localhost:abc", "localhost:") or
// one past 65535, which gRPC would quietly take modulo 65536, an IP address
// without a port ("10.0.0.1", "[::1]", an ipv4: or ipv6: entry), which gRPC
// would dial on port 0, and an http:// or https:// URL, which gRPC would take
// for a resolver's name. A name without a port takes gRPC's default, 443.
// Targets of other resolvers ("xds:///svc") pass unchecked.
absl::Status CheckTarget(absl::string_view target);

// RESOURCE_EXHAUSTED, in the server's own words, for a `dtype` `shape` matrix
// over `limits.max_matrix_bytes()`: what the server would answer, before the
// matrix is read or allocated here.
absl::Status CheckMatrixUnderLimit(const v1::Limits& limits, DataType dtype,
                                   const MatrixShape& shape);

// Whether a failed Transpose or TransposeInto is worth sending again later:
// its attempts (ClientOptions::max_attempts) ran out, or its deadline came,
// on failures that a later try may not meet (the service busy or out of
// memory for now, draining, out of reach). False for refusals a repeat meets
// again (a matrix over the server's limit, bad input), for the call's own
// deadline passing in an attempt, and for a cancel. Callers with a queue of
// their own can put such a call back instead of reading the message, and
// should bound how often: "out of reach" (UNAVAILABLE) is also what a target
// that does not resolve, or TLS roots that do not verify the server, give.
bool IsRetryable(const absl::Status& status);

// True for a call whose deadline passed with its connection to the server
// never made: its message says "no connection to TARGET was made", then, with
// ClientOptions::wait_for_ready, " (wait_for_ready)" (gRPC waited for one),
// else ": still connecting (...)": a name lookup, or a TCP, TLS or HTTP/2
// handshake, went unanswered, as from a host that drops packets, a process
// that accepts and never speaks gRPC, or a proxy without a backend. A longer
// deadline helps only if the server comes up meanwhile; without
// wait_for_ready, gRPC gives a connection attempt 20 s, and the call then
// fails UNAVAILABLE with gRPC's reason.
bool MadeNoConnection(const absl::Status& status);

// `status` marked as a failure of this process's own, such as no memory for a
// buffer the library allocates, rather than an answer from the server.
absl::Status InThisProcess(absl::Status status);

// True for a failure InThisProcess marked: its code is absl's, not a gRPC
// status the server sent, and repeating the call elsewhere does not help.
bool IsInThisProcess(const absl::Status& status);

// "CODE: message" for people: what absl::Status::ToString gives, without the
// payloads (the retry mark IsRetryable reads), so a failed call's text ends
// with its request id. A failure IsInThisProcess is its message alone, whose
// code would read as the server's answer.
std::string StatusText(const absl::Status& status);

// ClientOptions::connections at most.
inline constexpr int kMaxConnections = 64;

// Memory a process needs for its calls beyond their matrices: gRPC's threads'
// stacks and buffers. gRPC 1.51 hangs or crashes, rather than failing the
// call, when it runs out of memory for those. Its threads grow with the cores:
// 7 on the 2-core machine, where calls ended that way with up to about 70 MiB
// left, and 21 on a 16-core host, where they did with up to 165 MiB and ran
// from 185 MiB (docs/RELIABILITY.md). So 64 MiB, and a thread stack
// (ThreadStackBytes, server/core/process.h) for each core and six more: 128 MiB
// on the 2-core machine, 240 MiB with 16 cores. A program about to hold
// matrices that large keeps this much of MemoryLeftBytes for the calls.
uint64_t CallMemoryBytes();

// The part of CallMemoryBytes for gRPC's buffers rather than its threads.
inline constexpr uint64_t kCallBufferBytes = uint64_t{64} << 20;

struct ClientOptions {
  // Any gRPC target: "host:port", "dns:///svc:50051",
  // "ipv4:10.0.0.1:50051,10.0.0.2:50051".
  std::string target;
  // Load-balancing policy across the target's addresses, within each of the
  // `connections`. A server runs at most --max_concurrent_streams (100 by
  // default) of one connection's calls at once, and further calls wait in
  // gRPC for one to end, their deadlines running.
  std::string load_balancing_policy = "round_robin";
  // HTTP/2 connections to the target (1 to kMaxConnections), each of its own
  // to each address the target resolves to. A call takes the connection
  // running the fewest calls, so calls made one at a time keep to the first,
  // and the k-th is made once k calls run at once. One connection carries
  // 3-4 GB/s of matrices (in + out) on a 16-core host, whatever the calls on
  // it; 8 calls at once over 4 connections made about 10-11 GB/s, over 8
  // about 12 (docs/BENCHMARKS.md). Each connection runs up to the server's
  // --max_concurrent_streams calls.
  int connections = 4;
  // Requests up to this size go in one unary message; larger ones stream.
  // Keep it and chunk_bytes within the server's --max_message_bytes
  // (ServerInfo's limits.max_message_bytes, at least 1 MiB): the server
  // refuses a larger message with RESOURCE_EXHAUSTED only once it has it all.
  // A unary request is copied whole into its message (and its result out of
  // one), where a stream copies two chunks at a time (the one being sent and
  // the next), so larger unary requests cost memory and time. At most
  // api::kMaxMessageDataBytes (2 GiB - 1 MiB), as is chunk_bytes.
  uint64_t unary_max_bytes = uint64_t{1} << 20;
  // Data bytes per TransposeStream request message; not 0.
  uint64_t chunk_bytes = uint64_t{1} << 20;
  // TLS, on when `tls` is set or any PEM below is given; without roots, the
  // system's are trusted.
  bool tls = false;
  std::string tls_root_certs_pem;
  // Client certificate and key, for servers that require mutual TLS.
  std::string tls_cert_chain_pem;
  std::string tls_private_key_pem;
  // Sent as "authorization: Bearer <token>" with every call: readable by
  // anyone on the path unless `tls` is on (or the network is otherwise
  // encrypted).
  std::string bearer_token;
  // Or a file that holds it, alone on its line (a mounted Secret, a
  // Kubernetes projected service-account token): read at Create, and again
  // when calls start at least a second after the last read, so a token
  // rotated there goes out from the next call on, without a new Client. A
  // change that leaves no single valid token there keeps the last one. Not
  // with bearer_token.
  std::string bearer_token_file;
  // While calls run, the connection is pinged every keepalive_time, and
  // closed when an answer takes longer than keepalive_timeout: its calls end
  // UNAVAILABLE (and are sent again, within their deadlines) instead of
  // waiting out their deadlines when the server or the network died without
  // closing the connection. keepalive_time is at least 10 s (servers of this
  // version take a ping every 5 s; older ones, which take one every 5 minutes
  // while they send nothing, close a connection after its third such ping: a
  // long upload's) or absl::InfiniteDuration() for none.
  absl::Duration keepalive_time = absl::Seconds(30);
  absl::Duration keepalive_timeout = absl::Seconds(10);
  // Calls wait, within their deadlines, for a connection to the target (a
  // server restarting, a pod not up yet) instead of ending UNAVAILABLE at once
  // while there is none, as gRPC's wait_for_ready. Their deadline is then all
  // that bounds the wait for a server that never comes. Health checks never
  // wait for a connection. (Whether or not it is set, the client tries to
  // reconnect to a server that went away about every 5 s at most, where
  // gRPC's own backoff grows to 2 minutes.)
  bool wait_for_ready = false;
  // Deadline for calls that do not set their own: positive, or
  // absl::InfiniteDuration() for none.
  absl::Duration default_timeout = absl::Minutes(10);
  // Attempts per Transpose call. A call that did not reach the service or
  // that the service could not take (UNAVAILABLE: draining, out of reach,
  // connection lost), that the server cancelled (CANCELLED not from the
  // caller's canceller: a server shutting down cancels the calls that arrive
  // as it closes), or that the service refused as busy or out of memory for
  // now and said to retry (RESOURCE_EXHAUSTED with a retry pushback), or
  // whose stream the server's transport quota reset (RESOURCE_EXHAUSTED
  // "Received RST_STREAM with error code 11": the quota resets calls that did
  // not use its memory too) while its messages were within every server's
  // limit (unary_max_bytes and chunk_bytes at their default of 1 MiB, or the
  // call smaller), is sent again, whole, after a backoff. Other refusals are
  // final. All attempts share the call's deadline. 1: no retries.
  int max_attempts = 4;
  // The wait before the second attempt; each later one doubles, up to
  // max_backoff. Each wait is drawn at random from half to all of that, and
  // is at least what the server's pushback asks.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
};

// A matrix in the caller's memory: `data` holds exactly shape's elements of
// dtype, row-major.
struct MatrixView {
  DataType dtype = DataType::kUnspecified;
  MatrixShape shape;
  absl::Span<const uint8_t> data;
};

// How far a call has got, in bytes each way.
struct TransferProgress {
  uint64_t sent_bytes = 0;
  uint64_t received_bytes = 0;
  uint64_t total_bytes = 0;  // Each way.
  // The attempt these bytes belong to, from 1: a call sent again starts over
  // from zero bytes with the next number (ClientOptions::max_attempts).
  int attempt = 1;
};

// Ends Transpose calls before they are done, from any thread (a progress
// callback included). Cancelling is final: the calls given this canceller, the
// one running and any made later, end CANCELLED. The attempt in flight is
// cancelled through gRPC (the server frees what the call held), a wait between
// attempts is cut short, and no attempt follows. A call whose whole result has
// already arrived (a progress report with received_bytes == total_bytes: a
// unary call's one report of an attempt, a stream's last) returns it, so
// cancelling from that callback changes nothing; a report of zero bytes
// begins a retried attempt. Several calls may share one canceller.
class CallCanceller {
 public:
  CallCanceller() = default;
  CallCanceller(const CallCanceller&) = delete;
  CallCanceller& operator=(const CallCanceller&) = delete;

  void Cancel();
  // Whether Cancel has been called.
  bool cancelled() const;
  // Waits `wait`; false, at once, when cancelled before or during it.
  bool SleepUnlessCancelled(absl::Duration wait);

 private:
  friend class Client;

  // Lets Cancel reach `context` while an attempt runs; the context is
  // cancelled at once (before its call starts, gRPC cancels it when it does)
  // when the canceller already is.
  class Scope {
   public:
    Scope(CallCanceller* canceller, grpc::ClientContext& context);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    CallCanceller* const canceller_;
    grpc::ClientContext* const context_;
  };

  mutable std::mutex mutex_;
  std::condition_variable cancelled_changed_;
  bool cancelled_ = false;
  // The contexts of the attempts running now; Scope removes its own before
  // the context dies, under the mutex Cancel holds while it cancels them.
  std::vector<grpc::ClientContext*> contexts_;
};

struct CallOptions {
  kernels::Algorithm algorithm = kernels::Algorithm::kAuto;
  // The call's deadline, from its start: unset for the client's
  // default_timeout, absl::InfiniteDuration() for none. Zero or less has
  // passed already: the call ends DEADLINE_EXCEEDED without sending anything.
  std::optional<absl::Duration> timeout;
  // Streams even when the matrix would fit a unary message.
  bool force_stream = false;
  // Called after each chunk sent or received (a unary call: once, with its
  // result), on the calling thread, between the transfer's steps: keep it
  // quick (it holds up the transfer) and do not throw. A retried call starts
  // again from zero: each attempt after the first is reported, with zero
  // bytes, as it begins.
  std::function<void(const TransferProgress&)> on_progress;
  // Ends the call CANCELLED when cancelled; must outlive the call.
  CallCanceller* canceller = nullptr;
  // Names the call in the server's log lines about it (sent as
  // api::kRequestIdKey, the same for each attempt), and ends the message of a
  // failed call as " [request ID]", so that a failure reported by a user can
  // be found in the server's log. 1 to 128 printable ASCII characters without
  // spaces (a UUID, a W3C traceparent); empty: a random one.
  std::string request_id;

  bool cancelled() const {
    return canceller != nullptr && canceller->cancelled();
  }
  // Waits `wait`; false, at once, when the canceller is cancelled before or
  // during it.
  bool SleepUnlessCancelled(absl::Duration wait) const {
    if (canceller != nullptr) return canceller->SleepUnlessCancelled(wait);
    absl::SleepFor(wait);
    return true;
  }
};

struct TransposeResult {
  DataType dtype = DataType::kUnspecified;
  MatrixShape shape;  // (batch, cols, rows) of the input.
  std::vector<uint8_t> data;
  TransposeStats stats;
};

// Whether a client of `options` talks TLS: `tls` set, or any PEM given.
bool UsesTls(const ClientOptions& options);

// The one token of a bearer-token file (ClientOptions::bearer_token_file):
// INVALID_ARGUMENT, naming `path`, for a file with none, with a line a header
// cannot carry, or with several (a server's token file may list two while one
// replaces the other; a client sends one); ReadFile's error for a file that
// cannot be read.
absl::StatusOr<std::string> ReadBearerTokenFile(const std::string& path);

// What a failed attempt says about another (the library's own header,
// client/retry_advice.h).
struct RetryAdvice;

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Create(
      const ClientOptions& options);
  ~Client();

  // Transposes `input`; the server's status on failure (INVALID_ARGUMENT,
  // RESOURCE_EXHAUSTED, ...), INVALID_ARGUMENT before sending anything when
  // `input` is inconsistent, CANCELLED when `call.canceller` ends it,
  // DEADLINE_EXCEEDED, naming the timeout, when the call's own deadline passes,
  // RESOURCE_EXHAUSTED when allocating the result fails. The result is
  // zero-filled before it arrives; TransposeInto saves that pass.
  absl::StatusOr<TransposeResult> Transpose(const MatrixView& input,
                                            const CallOptions& call = {});

  // As Transpose, writing the result into `output` (exactly as many bytes as
  // the input). `output` may be `input.data` itself: the input is sent whole
  // before any of the result arrives. Such a call is not sent again once part
  // of its result has overwritten the input. After a failure, `output` holds
  // what arrived of the result, if anything: use none of it (nor, in place,
  // the input, once the call may have got that far).
  absl::StatusOr<TransposeStats> TransposeInto(const MatrixView& input,
                                               absl::Span<uint8_t> output,
                                               const CallOptions& call = {});

  // The server's version, backends and limits, over the first connection
  // (as CheckHealth), not one a transfer would take. `timeout` as
  // CallOptions::timeout, but always set.
  absl::StatusOr<v1::ServerInfo> GetServerInfo(
      absl::Duration timeout = absl::Seconds(10));

  // The standard gRPC health check: true when `service` ("" for the whole
  // server) is SERVING, false when it is not; NOT_FOUND for a service the
  // server does not know.
  absl::StatusOr<bool> CheckHealth(const std::string& service = "",
                                   absl::Duration timeout = absl::Seconds(5));

  // The first connection's channel, for calls of a caller's own (the
  // client's other connections are not seen through it).
  const std::shared_ptr<grpc::Channel>& channel() const {
    return connections_.front().channel;
  }

 private:
  // ClientOptions::bearer_token_file, read again as it changes.
  class TokenFile;
  // One of ClientOptions::connections.
  struct Connection {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::TransposeService::Stub> stub;
  };

  Client(const ClientOptions& options, std::unique_ptr<TokenFile> token_file,
         std::vector<Connection> connections);

  // One attempt's hold on a connection: the one running the fewest calls,
  // the first of those on a tie, so calls made one at a time keep to one
  // connection, and the next is made only when that many calls run at once.
  class ConnectionLease;

  absl::StatusOr<TransposeStats> Unary(const MatrixView& input,
                                       absl::Span<uint8_t> output,
                                       const CallOptions& call, int attempt,
                                       absl::Time deadline,
                                       RetryAdvice& advice);
  absl::StatusOr<TransposeStats> Stream(const MatrixView& input,
                                        absl::Span<uint8_t> output,
                                        const CallOptions& call, int attempt,
                                        absl::Time deadline,
                                        RetryAdvice& advice);
  // What a call out of time adds to say that it never reached the server
  // (MadeNoConnection's text) when it cannot have; else "".
  // `waited_for_ready`: whether the call waited for a connection (gRPC's
  // wait_for_ready) rather than failing at once without one.
  std::string UnconnectedNote(bool may_have_reached,
                              bool waited_for_ready) const;
  // What refuses a call before anything is allocated or sent: a cancelled
  // canceller, an inconsistent input, a bad request id, no time. The
  // matrix's size in bytes otherwise.
  absl::StatusOr<uint64_t> CheckCall(const MatrixView& input,
                                     const CallOptions& call) const;
  // A call's deadline: `timeout` from now, or the client's default.
  absl::Time DeadlineAfter(std::optional<absl::Duration> timeout) const;
  // TransposeInto's attempts, under `call.request_id`.
  absl::StatusOr<TransposeStats> TransposeAttempts(const MatrixView& input,
                                                   absl::Span<uint8_t> output,
                                                   const CallOptions& call,
                                                   uint64_t bytes);
  // Sets the call's deadline, credentials and request id (when not empty).
  void PrepareContext(grpc::ClientContext& context, absl::Time deadline,
                      absl::string_view request_id) const;

  const ClientOptions options_;
  const std::unique_ptr<TokenFile> token_file_;  // Null without one.
  const std::vector<Connection> connections_;
  std::mutex connections_mutex_;
  // Per connection, the attempts on it now. Guarded by connections_mutex_.
  std::vector<int> calls_running_;
};

}  // namespace transpose

#endif  // TRANSPOSE_CLIENT_CLIENT_H_
