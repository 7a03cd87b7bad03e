// A minimal grpc.reflection.v1alpha client for tests: Debian's gRPC ships no
// generated reflection stub, so the two messages involved are encoded by hand.
#ifndef TRANSPOSE_TESTS_REFLECTION_CLIENT_H_
#define TRANSPOSE_TESTS_REFLECTION_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace transpose::testing {

// The services the server's reflection lists, or the call's status when it
// fails.
absl::StatusOr<std::vector<std::string>> ListServices(
    const std::shared_ptr<grpc::Channel>& channel);

}  // namespace transpose::testing

#endif  // TRANSPOSE_TESTS_REFLECTION_CLIENT_H_
