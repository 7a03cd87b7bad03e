// echo_server: the transpose API with the transpose taken out, as the reference
// the service benchmark measures against. Transpose returns the request's
// bytes; TransposeStream sends each request message straight back. With square
// matrices the client library cannot tell it from the real server, so both are
// driven by the same client code. By default TransposeStream stores and
// forwards, since a transpose cannot send its first row before its last input
// row arrived;
// --pipelined echoes each message at once, overlapping the upload with the
// download. The last streamed response carries empty stats, as the contract
// asks. Not a product binary.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "server/core/notification.h"
#include "server/core/process.h"
#include "transpose/v1/transpose.grpc.pb.h"

ABSL_FLAG(std::string, address, "127.0.0.1:0", "Listening address.");
ABSL_FLAG(bool, pipelined, false,
          "TransposeStream: echo each message as it arrives, instead of "
          "holding all of them "
          "until the matrix is complete (store and forward, which a transpose "
          "cannot avoid).");
ABSL_FLAG(std::string, metrics_address, "",
          "Ignored; accepted so launchers can treat it as the server.");

namespace transpose {
namespace {

uint64_t DeclaredBytes(const v1::TransposeRequest& request) {
  uint64_t size = 4;
  switch (request.dtype()) {
    case v1::DATA_TYPE_FLOAT64:
    case v1::DATA_TYPE_INT64:
    case v1::DATA_TYPE_UINT64:
    case v1::DATA_TYPE_COMPLEX64:
      size = 8;
      break;
    case v1::DATA_TYPE_COMPLEX128:
      size = 16;
      break;
    case v1::DATA_TYPE_FLOAT16:
    case v1::DATA_TYPE_BFLOAT16:
    case v1::DATA_TYPE_INT16:
    case v1::DATA_TYPE_UINT16:
      size = 2;
      break;
    case v1::DATA_TYPE_INT8:
    case v1::DATA_TYPE_UINT8:
      size = 1;
      break;
    default:
      break;
  }
  const uint64_t batch =
      request.shape().batch() == 0 ? 1 : request.shape().batch();
  return size * batch * request.shape().rows() * request.shape().cols();
}

class EchoService final : public v1::TransposeService::CallbackService {
  grpc::ServerUnaryReactor* Transpose(
      grpc::CallbackServerContext* context, const v1::TransposeRequest* request,
      v1::TransposeResponse* response) override {
    response->set_dtype(request->dtype());
    *response->mutable_shape() = request->shape();
    response->set_data(request->data());
    response->mutable_stats();
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerBidiReactor<v1::TransposeRequest, v1::TransposeResponse>*
  TransposeStream(grpc::CallbackServerContext*) override {
    // Reads never wait for writes: every message read is queued and written
    // back as soon as the previous write is done, so a client that sends
    // everything before reading cannot deadlock it.
    class Echo final : public grpc::ServerBidiReactor<v1::TransposeRequest,
                                                      v1::TransposeResponse> {
     public:
      explicit Echo(bool pipelined) : pipelined_(pipelined) {
        StartRead(&request_);
      }
      void OnReadDone(bool ok) override {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!ok || finished_) {
          reads_done_ = true;
          if (!writing_) FinishOnceLocked();
          return;
        }
        if (first_) {
          declared_ = DeclaredBytes(request_);
          first_ = false;
        }
        seen_ += request_.data().size();
        v1::TransposeResponse& response = queue_.emplace_back();
        response.set_dtype(request_.dtype());
        if (request_.has_shape()) *response.mutable_shape() = request_.shape();
        response.set_data(std::move(*request_.mutable_data()));
        if (seen_ >= declared_) response.mutable_stats();
        request_.Clear();
        // Store and forward holds everything until the last declared byte, as a
        // transpose must.
        const bool may_write = pipelined_ || seen_ >= declared_;
        if (!writing_ && may_write) WriteFrontLocked();
        StartRead(&request_);
      }
      void OnWriteDone(bool ok) override {
        std::lock_guard<std::mutex> lock(mutex_);
        queue_.pop_front();
        writing_ = false;
        if (!ok) {
          FinishOnceLocked();
        } else if (!queue_.empty()) {
          WriteFrontLocked();
        } else if (reads_done_) {
          FinishOnceLocked();
        }
      }
      void OnDone() override { delete this; }

     private:
      void FinishOnceLocked() {
        if (!finished_) Finish(grpc::Status::OK);
        finished_ = true;
      }
      void WriteFrontLocked() {
        writing_ = true;
        StartWrite(&queue_.front());
      }

      std::mutex mutex_;
      v1::TransposeRequest request_;
      std::deque<v1::TransposeResponse> queue_;
      const bool pipelined_;
      bool first_ = true;
      bool writing_ = false;
      bool reads_done_ = false;
      bool finished_ = false;
      uint64_t declared_ = 0;
      uint64_t seen_ = 0;
    };
    return new Echo(absl::GetFlag(FLAGS_pipelined));
  }
};

}  // namespace
}  // namespace transpose

int main(int argc, char** argv) {
  // The same process settings as transpose_server: the comparison is about
  // the transpose.
  transpose::SetUpProcess();
  absl::ParseCommandLine(argc, argv);
  transpose::EchoService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(absl::GetFlag(FLAGS_address),
                           grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) return 1;
  std::printf("listening on 127.0.0.1:%d\n", port);
  std::fflush(stdout);
  server->Wait();
}
