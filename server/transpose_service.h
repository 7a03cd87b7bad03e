// The gRPC layer: maps the API's messages to the engine and back, streams
// chunks, and maps engine status to gRPC status in one place. It holds no
// transpose logic.
#ifndef TRANSPOSE_SERVER_TRANSPOSE_SERVICE_H_
#define TRANSPOSE_SERVER_TRANSPOSE_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "server/access_control.h"
#include "server/core/call_gate.h"
#include "server/core/log_rate_limiter.h"
#include "server/core/stall_watchdog.h"
#include "server/engine.h"
#include "server/metrics.h"
#include "server/request_assembler.h"
#include "transpose/v1/transpose.grpc.pb.h"

namespace transpose {

struct ServiceOptions {
  // Most data in one request message (a unary matrix, or one stream chunk).
  // The gRPC server refuses larger messages on receipt, with room for the
  // header fields; the service checks the data itself.
  uint64_t max_message_bytes = uint64_t{64} << 20;
  // Data bytes per TransposeStream response message.
  uint64_t response_chunk_bytes = uint64_t{1} << 20;
  // A TransposeStream call that moves no message either way for this long,
  // while no job of its runs, is ended with DEADLINE_EXCEEDED and gives back
  // its admission; a unary reply not delivered whole within it is cancelled.
  // Zero: never.
  absl::Duration stream_idle_timeout = absl::Minutes(2);
  std::string version;
};

// One received TransposeRequest as the request assembler takes it: its header
// fields mapped to core types (the message carries a header when any of them is
// set), and its data as the transport delivered it. `data` must outlive the
// part; `owner` keeps it alive for the job (null: the caller does, until the
// job is destroyed).
RequestPart PartOf(const v1::TransposeRequest& header,
                   absl::Span<const absl::string_view> data,
                   std::shared_ptr<const void> owner);

// Transpose and TransposeStream are registered raw (grpc::ByteBuffer): request
// data goes to the job as the transport's slices (the CPU backend transposes
// from them in place, the CUDA backend copies them into pinned memory), and
// response data goes out as slices of the job's output.
using TransposeServiceBase =
    v1::TransposeService::WithRawCallbackMethod_TransposeStream<
        v1::TransposeService::WithRawCallbackMethod_Transpose<
            v1::TransposeService::WithCallbackMethod_GetServerInfo<
                v1::TransposeService::Service>>>;

class TransposeService final : public TransposeServiceBase {
 public:
  // `engine`, `metrics` and `access` must outlive the service. Every method
  // checks `access` first.
  TransposeService(Engine& engine, Metrics& metrics,
                   const AccessControl& access, ServiceOptions options);

  grpc::ServerUnaryReactor* Transpose(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* TransposeStream(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetServerInfo(
      grpc::CallbackServerContext* context,
      const v1::GetServerInfoRequest* request,
      v1::ServerInfo* response) override;

  const ServiceOptions& options() const { return options_; }
  // The calls running; closing it makes new calls UNAVAILABLE (the drain).
  CallGate& calls() { return calls_; }

  // For a TLS server (gRPC takes such a processor only with TLS): checks each
  // call of this service from its headers, so that one without the token or
  // client certificate is refused before any of its messages is read (a unary
  // call's, up to --max_message_bytes, otherwise arrives whole first). Such
  // refusals are counted and logged as the methods' own. Other services' calls
  // (health) pass. Must not outlive the service.
  std::shared_ptr<grpc::AuthMetadataProcessor> MakeHeaderCheck();

  // Logs how many failed calls' lines were held back since the last one that
  // went out, if any: called each second, so a flood that stops is still
  // counted in the log.
  void LogHeldBackFailures();

 private:
  class UnaryReply;
  class UnaryCall;
  class StreamCall;
  class InfoCall;
  class HeaderCheck;

  // GetServerInfo's answer: the version, each backend, the limits.
  void DescribeServer(v1::ServerInfo& response) const;

  Engine& engine_;
  Metrics& metrics_;
  const AccessControl& access_;
  const ServiceOptions options_;
  CallGate calls_;
  // Failed calls log a warning each, up to 10 a second; the next line says
  // how many were held back.
  LogRateLimiter failure_log_{10, absl::Seconds(1)};
  // Null when streams may idle for ever.
  std::unique_ptr<StallWatchdog> stall_watchdog_;
  // "/transpose.v1.TransposeService/": the start of its methods' paths.
  const std::string prefix_;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_TRANSPOSE_SERVICE_H_
