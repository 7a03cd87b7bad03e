#include "tests/reflection_client.h"

#include <google/protobuf/unknown_field_set.h>
#include <grpcpp/generic/generic_stub.h>

#include <chrono>

#include "absl/status/status.h"
#include "proto/convert.h"

namespace transpose::testing {

absl::StatusOr<std::vector<std::string>> ListServices(
    const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue queue;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  auto call = stub.PrepareCall(
      &context,
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &queue);
  auto await = [&queue] {
    void* tag;
    bool ok = false;
    return queue.Next(&tag, &ok) && ok;
  };
  call->StartCall(nullptr);
  bool open = await();
  // ServerReflectionRequest{list_services (field 7) = "*"}.
  grpc::Slice request(std::string("\x3a\x01*", 3));
  grpc::ByteBuffer response;
  bool answered = false;
  if (open) {
    call->Write(grpc::ByteBuffer(&request, 1), nullptr);
    if (await()) {
      call->Read(&response, nullptr);
      answered = await();
    }
    call->WritesDone(nullptr);
    await();
  }
  grpc::Status status;
  call->Finish(&status, nullptr);
  await();
  if (!status.ok()) return api::FromGrpcStatus(status);
  if (!answered) return absl::DataLossError("reflection sent no response");

  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok())
    return absl::DataLossError("unreadable response");
  std::string bytes;
  for (const grpc::Slice& s : slices) {
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  // ServerReflectionResponse.list_services_response (6) -> service (1) -> name
  // (1).
  std::vector<std::string> names;
  google::protobuf::UnknownFieldSet top;
  if (!top.ParseFromString(bytes))
    return absl::DataLossError("malformed response");
  for (int i = 0; i < top.field_count(); ++i) {
    if (top.field(i).number() != 6) continue;
    google::protobuf::UnknownFieldSet list;
    if (!list.ParseFromString(top.field(i).length_delimited())) {
      return absl::DataLossError("malformed service list");
    }
    for (int j = 0; j < list.field_count(); ++j) {
      google::protobuf::UnknownFieldSet service;
      if (!service.ParseFromString(list.field(j).length_delimited())) {
        return absl::DataLossError("malformed service entry");
      }
      names.push_back(service.field(0).length_delimited());
    }
  }
  return names;
}

}  // namespace transpose::testing
