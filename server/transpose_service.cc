#include "server/transpose_service.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/convert.h"
#include "proto/wire.h"
#include "server/core/host_port.h"
#include "server/core/log.h"
#include "server/core/retry.h"
#include "server/core/status_macros.h"
#include "server/request_assembler.h"

namespace transpose {
namespace {

// How long a refused client should wait at least before it tries again: the
// server cannot tell when room frees up, so this only spaces out retries from
// clients whose own policies follow the pushback to the letter.
constexpr int kRetryPushbackMs = 100;

// How log lines quote the request id a client sent (api::kRequestIdKey): as
// it is, or escaped, cut short and marked where the client library would not
// send it, so no caller can forge or flood a log line.
std::string QuoteInvalidRequestId(absl::string_view sent) {
  return absl::StrCat("\"",
                      absl::CHexEscape(sent.substr(0, api::kMaxRequestIdBytes)),
                      "\", not a valid id");
}

std::string QuoteClientRequestId(absl::string_view sent) {
  if (api::CheckRequestId(sent).ok()) return std::string(sent);
  return QuoteInvalidRequestId(sent);
}

// The client's request id from `metadata`, if it sent one.
template <typename Metadata>
std::optional<absl::string_view> SentRequestId(const Metadata& metadata) {
  const auto found = metadata.find(api::kRequestIdKey);
  if (found == metadata.end()) return std::nullopt;
  return absl::string_view(found->second.data(), found->second.size());
}

// The id that names a call in the server's log and goes back to the client
// in the trailers: the client's own, or a new one where the client sent none
// or one that is not valid.
struct RequestId {
  std::string id;
  // " [request ID]" for the call's log lines, with the client's invalid id
  // quoted beside a new one.
  std::string log_suffix;
};

RequestId NameCall(std::optional<absl::string_view> sent) {
  if (sent.has_value() && api::CheckRequestId(*sent).ok()) {
    return {std::string(*sent), absl::StrCat(" [request ", *sent, "]")};
  }
  std::string id = api::NewRequestId();
  std::string log_suffix =
      sent.has_value() ? absl::StrCat(" [request ", id, "; the client sent ",
                                      QuoteInvalidRequestId(*sent), "]")
                       : absl::StrCat(" [request ", id, "]");
  return {std::move(id), std::move(log_suffix)};
}

// The warning line of a failed call, up to `failure_log`'s rate; the next line
// that goes out counts those held back.
// `outcome`: "failed after 0.5s", or "was refused at its headers".
// `request`: RequestId::log_suffix.
void LogFailedCall(LogRateLimiter& failure_log, absl::string_view method,
                   absl::string_view peer, absl::string_view outcome,
                   const absl::Status& status, absl::string_view request) {
  uint64_t held_back = 0;
  if (!LogEnabled(LogLevel::kWarning) ||
      !failure_log.Allow(absl::Now(), &held_back)) {
    return;
  }
  Log(LogLevel::kWarning, "%s from %s %s: %s: %s%s%s", method, peer, outcome,
      absl::StatusCodeToString(status.code()), status.message(), request,
      held_back == 0
          ? ""
          : absl::StrCat(" (and ", held_back,
                         " failed calls not logged since the last "
                         "line; transpose_requests_total counts all)"));
}

// Why a call that gRPC ended is over, as the client saw it: the server's drain
// ended before it did (gRPC cancels what is left then), its deadline passed, or
// it was cancelled (by the client, or by gRPC, e.g. for a message over
// --max_message_bytes). The server's deadline runs from when the header
// arrived, so the client's own timer fires first and its cancellation can
// arrive a little before the server's deadline: within kDeadlineSlack of it,
// the deadline is taken to be the cause.
// `when`, if not empty, says at what point of the call.
absl::Status EndedByTransport(const grpc::CallbackServerContext& context,
                              const CallGate& calls, absl::string_view when) {
  constexpr auto kDeadlineSlack = std::chrono::milliseconds(100);
  const absl::string_view space = when.empty() ? "" : " ";
  if (calls.DrainOver()) {
    // A server-side failure, counted as one: a drain too short for the calls
    // it should let finish.
    return absl::UnavailableError(absl::StrCat(
        "the server's drain (--drain_seconds) ended before the call did", space,
        when));
  }
  if (context.deadline() - kDeadlineSlack <= std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError(
        absl::StrCat("the call's deadline passed", space, when));
  }
  return absl::CancelledError(absl::StrCat(
      "the call was cancelled, or its connection lost", space, when));
}

// One RPC's accounting: the in-flight gauge while it runs, then its count,
// duration and, when it failed, a log line and the retry advice for the
// client; and its place in the drain's count until it is destroyed.
class RpcScope {
 public:
  RpcScope(Metrics& metrics, CallGate& calls, LogRateLimiter& failure_log,
           RpcMethod method, grpc::CallbackServerContext& context)
      : metrics_(metrics),
        calls_(calls),
        failure_log_(failure_log),
        context_(context),
        entered_(calls.TryEnter()),
        method_(method),
        peer_(context.peer()),
        caller_(PeerHost(peer_)),
        request_(NameCall(SentRequestId(context.client_metadata()))),
        start_(absl::Now()) {
    metrics_.inflight_requests().Increment();
  }
  // The drain's count is left only here, with the reactor, which gRPC lets
  // go once its status is out: a drain that ends as the count does may then
  // stop the process without cutting off a status still being sent.
  ~RpcScope() {
    if (entered_) calls_.Leave();
  }
  RpcScope(const RpcScope&) = delete;
  RpcScope& operator=(const RpcScope&) = delete;

  // OK if the caller may make this call: it is allowed in and the server is
  // not draining.
  absl::Status Admit(const AccessControl& access,
                     const grpc::ServerContextBase& context) const {
    TRANSPOSE_RETURN_IF_ERROR(access.Check(context));
    if (!entered_) return absl::UnavailableError("the server is shutting down");
    return absl::OkStatus();
  }

  // Whose share of the admission limits the call takes: its client's host.
  const std::string& caller() const { return caller_; }

  // Reply, then Record: returns the status to hand to gRPC.
  grpc::Status Finish(const absl::Status& status) {
    grpc::Status reply = Reply(status);
    Record(status);
    return reply;
  }

  // The status to hand to gRPC, with the retry advice a refusal carries: when
  // to come back, or (for the codes that also mean "busy" or "broken for
  // now", which gRPC retry policies may list) not to, so that a client's
  // policy repeats neither an oversized upload nor a query that faulted a GPU.
  // The call's request id goes in the trailers, not the response headers: a
  // failure with custom headers is no longer the Trailers-Only response that
  // gRPC retry policies need, and a policy takes any headers as the call
  // committed to its first attempt.
  grpc::Status Reply(const absl::Status& status) {
    context_.AddTrailingMetadata(api::kRequestIdKey, request_.id);
    if (IsRetryLater(status)) {
      context_.AddTrailingMetadata(api::kRetryPushbackKey,
                                   absl::StrCat(kRetryPushbackMs));
    } else if (absl::IsResourceExhausted(status) || absl::IsInternal(status)) {
      context_.AddTrailingMetadata(api::kRetryPushbackKey, "-1");
    }
    return api::ToGrpcStatus(status);
  }

  // How a call whose reply went to gRPC with `replied` ended for its client:
  // an OK reply it never got (it cancelled, its deadline passed, its
  // connection went, it did not read it) did not succeed; and in a cancelled
  // call, a request that never arrived whole (`request_whole` false) was cut
  // off, not malformed. gRPC's cancelled mark is final only once it lets the
  // reactor go (OnDone).
  absl::Status DeliveredStatus(const absl::Status& replied,
                               bool request_whole) const {
    if (!context_.IsCancelled()) return replied;
    if (!request_whole) {
      return EndedByTransport(context_, calls_, "during the upload");
    }
    if (!replied.ok()) return replied;
    return EndedByTransport(context_, calls_, "before the reply was delivered");
  }

  // The call is over, with `status`: counts, times and logs it, and leaves
  // the in-flight gauge. Once only.
  void Record(const absl::Status& status) {
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    // Counted before it leaves the gauge: a scrape that finds the gauge at 0
    // finds every call counted.
    metrics_.RecordRequest(method_, status.code(), seconds);
    metrics_.inflight_requests().Decrement();
    if (!status.ok()) {
      LogFailedCall(failure_log_, RpcMethodName(method_), peer_,
                    absl::StrFormat("failed after %.6fs", seconds), status,
                    request_.log_suffix);
    } else {
      Log(LogLevel::kDebug, "%s from %s ok in %.6fs%s", RpcMethodName(method_),
          peer_, seconds, request_.log_suffix);
    }
  }

 private:
  Metrics& metrics_;
  CallGate& calls_;
  LogRateLimiter& failure_log_;
  grpc::CallbackServerContext& context_;
  const bool entered_;
  const RpcMethod method_;
  const std::string peer_;
  const std::string caller_;
  const RequestId request_;
  const absl::Time start_;
};

void FillHeader(const TransposeSpec& spec, v1::TransposeResponse& response) {
  response.set_dtype(api::ToProto(spec.dtype));
  api::ToProto(spec.shape.Transposed(), *response.mutable_shape());
}

}  // namespace

RequestPart PartOf(const v1::TransposeRequest& header,
                   absl::Span<const absl::string_view> data,
                   std::shared_ptr<const void> owner) {
  RequestPart part;
  part.has_header = header.dtype() != v1::DATA_TYPE_UNSPECIFIED ||
                    header.has_shape() ||
                    header.algorithm() != v1::ALGORITHM_AUTO;
  part.header.dtype = api::FromProto(header.dtype());
  part.header.shape = api::FromProto(header.shape());
  part.header.algorithm = api::FromProto(header.algorithm());
  part.data = data;
  part.owner = std::move(owner);
  return part;
}

namespace {

// Parses one received TransposeRequest into the assembler. The job may hold on
// to the message's slices instead of copying them. gRPC's own size check
// leaves room for the header fields on top of `max_data_bytes`, so the data's
// limit is checked here, where the refusal is counted and logged like any
// other.
absl::Status AddMessage(const grpc::ByteBuffer& message,
                        uint64_t max_data_bytes, RequestAssembler& assembler,
                        bool whole_request = false) {
  wire::RequestView view;
  TRANSPOSE_RETURN_IF_ERROR(wire::Parse(message, view));
  if (view.data_size() > max_data_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "a message with %d bytes of data exceeds the server's limit of %d "
        "bytes per message",
        view.data_size(), max_data_bytes));
  }
  auto slices =
      std::make_shared<std::vector<grpc::Slice>>(std::move(view.slices));
  const RequestPart part = PartOf(view.header, view.data, std::move(slices));
  return whole_request ? assembler.AddWhole(part) : assembler.Add(part);
}

}  // namespace

TransposeService::TransposeService(Engine& engine, Metrics& metrics,
                                   const AccessControl& access,
                                   ServiceOptions options)
    : engine_(engine),
      metrics_(metrics),
      access_(access),
      options_(std::move(options)),
      prefix_(
          absl::StrCat("/", v1::TransposeService::service_full_name(), "/")) {
  if (options_.stream_idle_timeout > absl::ZeroDuration()) {
    // Checks often enough that a stall ends within a quarter of the limit of
    // it, but no more than every 10 ms.
    stall_watchdog_ = std::make_unique<StallWatchdog>(
        std::clamp(options_.stream_idle_timeout / 4, absl::Milliseconds(10),
                   absl::Seconds(1)));
  }
}

// A unary call's end: its status, and the reply with it, handed to gRPC once
// (End), and the call recorded only once gRPC lets the reactor go (OnDone), so
// that an OK reply the client never got (it cancelled, its deadline passed,
// its connection went, it did not read it) is not counted OK. The reactor
// holds the call's scope, so the call is in flight, and in the drain's count,
// until then. A reply the client does not read (its process stopped, a proxy
// stalled, with the connection alive) would hold the call, and all its reply
// refers to, for good: the stall watchdog cancels a reply not delivered within
// the idle limit, and the call counts as DEADLINE_EXCEEDED. The reactor
// deletes itself in OnDone.
class TransposeService::UnaryReply : public grpc::ServerUnaryReactor,
                                     private StallWatchdog::Watched {
 protected:
  UnaryReply(TransposeService& service, grpc::CallbackServerContext& context,
             RpcMethod method)
      : service_(service),
        scope_(service.metrics_, service.calls_, service.failure_log_, method,
               context),
        context_(context) {}

  RpcScope& scope() { return scope_; }

  // Hands gRPC the call's status, and the reply with it when OK. Once, from
  // any thread, the derived constructor's too; the caller touches nothing of
  // the call afterwards (OnDone may already have deleted it).
  void End(const absl::Status& status) {
    status_ = status;
    // A refusal's trailers fit any socket's buffers; a reply may not.
    if (status.ok() && service_.stall_watchdog_ != nullptr) {
      reply_ready_ = StallWatchdog::Clock::now();
      watched_ = true;
      service_.stall_watchdog_->Add(this);
    }
    Finish(scope_.Reply(status));
  }

  // Ends a call whose request's message never arrived whole, which gRPC 1.51
  // hands the handler as a ByteBuffer that is not Valid(): the call was cut
  // off (by the client, its deadline, its connection), or the client
  // half-closed short of the message. Only OnDone knows which.
  void EndIncompleteRequest() {
    request_whole_ = false;
    End(absl::InvalidArgumentError(
        "the request's message did not arrive whole"));
  }

 private:
  void OnDone() final {
    // No check runs after this, and the last one's marks are visible.
    if (watched_) service_.stall_watchdog_->Remove(this);
    // A reply cancelled after the watchdog found it stalled was cancelled by
    // the watchdog.
    if (status_.ok() && stalled_for_.has_value() && context_.IsCancelled()) {
      scope_.Record(absl::DeadlineExceededError(absl::StrCat(
          "the client did not read the reply for ",
          absl::FormatDuration(*stalled_for_),
          ", past the server's limit for an idle call (",
          absl::FormatDuration(service_.options_.stream_idle_timeout), ")")));
    } else {
      scope_.Record(scope_.DeliveredStatus(status_, request_whole_));
    }
    delete this;
  }

  // Runs on the watchdog's thread until OnDone removes this call.
  void CheckForStall(StallWatchdog::Clock::time_point now) final {
    const absl::Duration waiting = absl::FromChrono(now - reply_ready_);
    if (waiting < service_.options_.stream_idle_timeout ||
        stalled_for_.has_value()) {
      return;
    }
    stalled_for_ = waiting;
    // OnDone follows on gRPC's threads, and waits for this check to return.
    context_.TryCancel();
  }

  TransposeService& service_;
  RpcScope scope_;
  grpc::CallbackServerContext& context_;
  absl::Status status_;
  bool request_whole_ = true;  // False: EndIncompleteRequest.
  // Set before the reply goes out; read by the watchdog's checks after Add.
  bool watched_ = false;
  StallWatchdog::Clock::time_point reply_ready_;
  // Written by a check, read in OnDone after Remove.
  std::optional<absl::Duration> stalled_for_;
};

// Transpose: the request's data goes to the job as the transport's slices,
// which the job keeps; the reply's data is the job's output, which the reply
// keeps. So the job, its buffers and its admission last until gRPC has sent
// the reply (UnaryReply): a reply to a slow reader is still counted against
// the budget.
class TransposeService::UnaryCall final : public UnaryReply {
 public:
  UnaryCall(TransposeService& service, grpc::CallbackServerContext& context,
            const grpc::ByteBuffer& request, grpc::ByteBuffer& response)
      : UnaryReply(service, context, RpcMethod::kTranspose),
        response_(response) {
    if (absl::Status allowed = scope().Admit(service.access_, context);
        !allowed.ok()) {
      End(allowed);
      return;
    }
    if (!request.Valid()) {
      EndIncompleteRequest();
      return;
    }
    absl::Status status;
    std::shared_ptr<TransposeJob> job;
    {
      RequestAssembler assembler([&service, this](const TransposeSpec& spec) {
        return service.engine_.CreateJob(spec, scope().caller());
      });
      status = AddMessage(request, service.options_.max_message_bytes,
                          assembler, /*whole_request=*/true);
      if (status.ok()) {
        spec_ = assembler.spec();
        job = assembler.job();
      }
    }  // A refused job, and any band still reading the request, ends here.
    if (!status.ok()) {
      End(status);
      return;
    }
    TransposeJob& job_ref = *job;
    job_ref.Run([this, job = std::move(job)](absl::Status status) mutable {
      if (status.ok()) {
        v1::TransposeResponse header;
        FillHeader(spec_, header);
        api::ToProto(job->stats(), *header.mutable_stats());
        response_ = wire::Encode(header, job->output(), job);
      }
      job.reset();  // The reply holds it now, or nothing does.
      End(status);
    });
  }

 private:
  grpc::ByteBuffer& response_;
  TransposeSpec spec_;
};

grpc::ServerUnaryReactor* TransposeService::Transpose(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return new UnaryCall(*this, *context, *request, *response);
}

// TransposeStream: reads the request into a job, runs it as soon as the last
// byte arrives, then writes the result in chunks that refer to the job's output
// (the job lives until gRPC drops the last chunk). Reading goes on meanwhile,
// to catch data past the declared size and the client's half-close; the call
// ends OK only after both the result and the half-close, since until the
// client half-closes more data may follow. The reactor
// deletes itself once gRPC is done with it (OnDone) and the job's callback has
// run, whichever comes last.
class TransposeService::StreamCall final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
      private StallWatchdog::Watched {
 public:
  StreamCall(TransposeService& service, grpc::CallbackServerContext& context)
      : service_(service),
        context_(context),
        scope_(service.metrics_, service.calls_, service.failure_log_,
               RpcMethod::kTransposeStream, context),
        assembler_([this](const TransposeSpec& spec) {
          return service_.engine_.CreateJob(spec, scope_.caller());
        }) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (absl::Status allowed = scope_.Admit(service.access_, context);
        !allowed.ok()) {
      FinishLocked(allowed);
      return;
    }
    // Under the lock, so that no check can finish the call before its first
    // read is started.
    if (service_.stall_watchdog_ != nullptr) {
      service_.stall_watchdog_->Add(this);
    }
    StartRead(&request_);
  }

  // Leaves the watchdog before any member goes: a check may be running.
  ~StreamCall() override {
    if (service_.stall_watchdog_ != nullptr) {
      service_.stall_watchdog_->Remove(this);
    }
  }

  void OnReadDone(bool ok) override {
    TransposeJob* job_to_run = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (finished_) return;
      if (!ok) {
        last_progress_ = StallWatchdog::Clock::now();
        // No more data will come: the client half-closed, or the call is over.
        if (context_.IsCancelled()) {
          FinishLocked(
              EndedByTransport(context_, service_.calls_, PhaseLocked()));
        } else if (!job_started_) {
          // A short upload, or a cancellation gRPC has not marked yet: OnDone
          // tells them apart, and records the call.
          upload_ended_short_ = true;
          short_upload_status_ = assembler_.Finish();
          finished_ = true;
          Finish(scope_.Reply(short_upload_status_));
        } else {
          half_closed_ = true;
          if (ResultSentLocked()) FinishLocked(absl::OkStatus());
        }
        return;
      }
      if (absl::Status status = AddMessage(
              request_, service_.options_.max_message_bytes, assembler_);
          !status.ok()) {
        FinishLocked(status);
        return;
      }
      // Only the matrix's bytes count: repeated headers and empty messages,
      // before the upload's end or after it, are no progress.
      const bool completes_upload = assembler_.complete() && !job_started_;
      if (assembler_.received_bytes() - progress_at_bytes_ >= kProgressBytes ||
          completes_upload) {
        last_progress_ = StallWatchdog::Clock::now();
        progress_at_bytes_ = assembler_.received_bytes();
      }
      if (completes_upload) {
        job_started_ = job_running_ = true;
        job_to_run = assembler_.job().get();
      }
      StartRead(&request_);
    }
    // Outside the lock: a small job may call back before Run returns.
    if (job_to_run != nullptr) {
      job_to_run->Run(
          [this](absl::Status status) { OnJobDone(std::move(status)); });
    }
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mutex_);
    write_pending_ = false;
    if (finished_) return;
    last_progress_ = StallWatchdog::Clock::now();
    if (!ok) {
      FinishLocked(EndedByTransport(context_, service_.calls_,
                                    "while the response was being sent"));
      return;
    }
    if (!ResultSentLocked()) {
      WriteNextLocked();
      return;
    }
    // The result is out: the job, its buffers and its admission are not
    // needed to finish, and are given back before the status goes out, so a
    // client that sends its next call as soon as it has this one's status
    // finds the room this one held (its own last call does not refuse it).
    // The last chunk's slices keep the output until gRPC drops them.
    response_.Clear();  // Its data is the job's.
    assembler_.ReleaseJob();
    // Only the client's half-close can show that no data follows the
    // declared bytes.
    if (half_closed_) FinishLocked(absl::OkStatus());
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!finished_)
      FinishLocked(EndedByTransport(context_, service_.calls_, PhaseLocked()));
  }

  void OnDone() override {
    bool destroy;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      destroy = !job_running_;
      // gRPC's cancelled mark is final only here: an upload's read can fail
      // for a cancellation (by the client, its deadline, a drain's end or the
      // transport) before the mark is set, and look merely short.
      if (upload_ended_short_) {
        scope_.Record(context_.IsCancelled()
                          ? EndedByTransport(context_, service_.calls_,
                                             "during the upload")
                          : short_upload_status_);
      }
    }
    if (destroy) delete this;
  }

 private:
  // A stalled peer: a client that stopped sending mid-upload, or stopped
  // reading the response, with its connection alive (keepalive catches dead
  // ones). Time its own job takes is not a stall.
  void CheckForStall(StallWatchdog::Clock::time_point now) override {
    bool write_pending;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const absl::Duration limit = service_.options_.stream_idle_timeout;
      const absl::Duration idle = absl::FromChrono(now - last_progress_);
      if (finished_ || job_running_ || idle < limit) return;
      FinishLocked(absl::DeadlineExceededError(absl::StrCat(
          ResultSentLocked()
              ? "the result was sent, but the client did not half-close "
                "its side of the stream (ending the upload) for "
              : "the call moved less than 64 KiB either way in ",
          absl::FormatDuration(idle),
          ", past the server's limit for an idle stream (",
          absl::FormatDuration(limit), ")")));
      write_pending = write_pending_;
    }
    // The status would wait behind a write the client never reads, and that
    // write's data holds the job (buffers and admission): cancelling drops
    // both. OnCancel and OnDone then run on gRPC's threads; OnDone may delete
    // this call, which waits in the destructor for this check to return.
    if (write_pending) context_.TryCancel();
  }

  void OnJobDone(absl::Status status) {
    bool destroy = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_running_ = false;
      last_progress_ = StallWatchdog::Clock::now();
      if (finished_) {
        destroy = done_;
      } else if (!status.ok()) {
        FinishLocked(status);
      } else {
        output_ = assembler_.job()->output();
        WriteNextLocked();
      }
    }
    if (destroy) delete this;
  }

  bool ResultSentLocked() const {
    return stats_sent_ && written_ == output_.size() && !write_pending_;
  }

  // Where the call has got, for the line that says where it ended.
  absl::string_view PhaseLocked() const {
    if (!job_started_) return "during the upload";
    if (ResultSentLocked())
      return "after its result, before the client half-closed";
    if (job_running_) return "while its job ran";
    return "while the response was being sent";
  }

  void WriteNextLocked() {
    v1::TransposeResponse header;
    if (written_ == 0) FillHeader(assembler_.spec(), header);
    const size_t chunk = std::min<size_t>(
        service_.options_.response_chunk_bytes, output_.size() - written_);
    const absl::Span<const uint8_t> data = output_.subspan(written_, chunk);
    written_ += chunk;
    if (written_ == output_.size()) {
      api::ToProto(assembler_.job()->stats(), *header.mutable_stats());
      stats_sent_ = true;
    }
    // The chunk refers to the job's output and keeps the job alive until gRPC
    // drops it.
    response_ = wire::Encode(header, data, assembler_.job());
    write_pending_ = true;
    StartWrite(&response_);
  }

  void FinishLocked(const absl::Status& status) {
    finished_ = true;
    Finish(scope_.Finish(status));
  }

  TransposeService& service_;
  grpc::CallbackServerContext& context_;
  RpcScope scope_;
  std::mutex mutex_;
  RequestAssembler assembler_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  absl::Span<const uint8_t> output_;
  size_t written_ = 0;
  bool stats_sent_ = false;
  bool job_started_ = false;
  bool half_closed_ = false;
  bool job_running_ = false;
  bool write_pending_ = false;
  bool finished_ = false;
  // Set when the upload ended before the declared bytes, with what was sent.
  bool upload_ended_short_ = false;
  absl::Status short_upload_status_;
  bool done_ = false;
  // Progress: kProgressBytes of the matrix since the last progress, or its
  // last byte, so that a trickle of small messages (a byte, an empty one or
  // a repeated header each second) does not hold a declared matrix's
  // admission past the idle limit; a response message sent; the job's end.
  static constexpr uint64_t kProgressBytes = 64 << 10;
  StallWatchdog::Clock::time_point last_progress_ = StallWatchdog::Clock::now();
  uint64_t progress_at_bytes_ = 0;  // The matrix's bytes at the last progress.
};

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
TransposeService::TransposeStream(grpc::CallbackServerContext* context) {
  return new StreamCall(*this, *context);
}

// Checks calls from their headers, before gRPC reads their messages.
class TransposeService::HeaderCheck final : public grpc::AuthMetadataProcessor {
 public:
  explicit HeaderCheck(TransposeService& service) : service_(service) {}

  bool IsBlocking() const override { return false; }

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* auth,
                       OutputMetadata*, OutputMetadata*) override {
    // Calls of every other service (health) stay open. Every method of this
    // one is checked, those it does not have too: gRPC answers those
    // UNIMPLEMENTED once they pass.
    const auto path = metadata.find(":path");
    absl::string_view method;
    if (path != metadata.end()) {
      method = absl::string_view(path->second.data(), path->second.size());
    }
    if (!absl::ConsumePrefix(&method, service_.prefix_)) {
      return grpc::Status::OK;
    }
    const absl::Status status = service_.access_.Check(auth, metadata);
    if (status.ok()) return grpc::Status::OK;
    // Counted and logged as the methods count and log their own refusals
    // (gRPC does not give the peer's address here), but for a time: the call
    // never ran.
    const std::optional<RpcMethod> known = Known(method);
    if (known.has_value()) {
      service_.metrics_.RecordRefusal(*known, status.code());
    }
    std::string peer = "a TLS client";
    if (auth != nullptr && auth->IsPeerAuthenticated()) {
      const std::vector<grpc::string_ref> identity = auth->GetPeerIdentity();
      absl::StrAppend(
          &peer, " with a certificate for ",
          absl::string_view(identity.front().data(), identity.front().size()));
    }
    LogFailedCall(
        service_.failure_log_,
        known.has_value() ? RpcMethodName(*known) : "an unknown method", peer,
        "was refused at its headers", status, RefusedCallSuffix(metadata));
    return api::ToGrpcStatus(status);
  }

 private:
  // No trailers of the service's go out when the header check refuses a
  // call, so only the client's own id names it.
  static std::string RefusedCallSuffix(const InputMetadata& metadata) {
    const std::optional<absl::string_view> sent = SentRequestId(metadata);
    if (!sent.has_value()) return "";
    return absl::StrCat(" [request ", QuoteClientRequestId(*sent), "]");
  }

  static std::optional<RpcMethod> Known(absl::string_view method) {
    for (RpcMethod known : {RpcMethod::kTranspose, RpcMethod::kTransposeStream,
                            RpcMethod::kGetServerInfo}) {
      if (method == RpcMethodName(known)) return known;
    }
    return std::nullopt;
  }

  TransposeService& service_;
};

std::shared_ptr<grpc::AuthMetadataProcessor>
TransposeService::MakeHeaderCheck() {
  return std::make_shared<HeaderCheck>(*this);
}

void TransposeService::LogHeldBackFailures() {
  if (const uint64_t held_back = failure_log_.TakeHeldBack(); held_back > 0) {
    Log(LogLevel::kWarning,
        "%d failed calls not logged since the last line "
        "(transpose_requests_total counts all)",
        held_back);
  }
}

// GetServerInfo: answered at once, and recorded as a Transpose call is
// (UnaryReply).
class TransposeService::InfoCall final : public UnaryReply {
 public:
  InfoCall(TransposeService& service, grpc::CallbackServerContext& context,
           v1::ServerInfo& response)
      : UnaryReply(service, context, RpcMethod::kGetServerInfo) {
    absl::Status status = scope().Admit(service.access_, context);
    if (status.ok()) service.DescribeServer(response);
    End(status);
  }
};

grpc::ServerUnaryReactor* TransposeService::GetServerInfo(
    grpc::CallbackServerContext* context, const v1::GetServerInfoRequest*,
    v1::ServerInfo* response) {
  return new InfoCall(*this, *context, *response);
}

void TransposeService::DescribeServer(v1::ServerInfo& response) const {
  response.set_version(options_.version);
  for (const auto& backend : engine_.backends()) {
    const BackendInfo& info = backend->info();
    v1::Backend& proto = *response.add_backends();
    proto.set_name(info.name);
    proto.set_device_name(info.device_name);
    proto.set_calibrated_copy_bandwidth_bytes_per_second(
        info.copy_bandwidth_bytes_per_second);
    proto.set_streams(info.streams);
    proto.set_total_memory_bytes(info.total_memory_bytes);
    proto.set_healthy(backend->healthy());
    for (kernels::Algorithm algorithm : info.algorithms) {
      proto.add_algorithms(api::ToProto(algorithm));
    }
  }
  v1::Limits& limits = *response.mutable_limits();
  limits.set_max_message_bytes(options_.max_message_bytes);
  limits.set_max_matrix_bytes(engine_.options().max_matrix_bytes);
  limits.set_response_chunk_bytes(options_.response_chunk_bytes);
  limits.set_max_inflight_bytes(engine_.options().max_inflight_bytes);
  limits.set_max_inflight_requests(engine_.options().max_inflight_requests);
  limits.set_max_inflight_bytes_per_peer(
      engine_.options().max_inflight_bytes_per_caller);
  limits.set_max_inflight_requests_per_peer(
      engine_.options().max_inflight_requests_per_caller);
  limits.set_stream_idle_seconds(
      absl::ToDoubleSeconds(options_.stream_idle_timeout));
}

}  // namespace transpose
