// Who may call the transpose service: callers with the bearer token, and (with
// mutual TLS) only callers whose client certificate the server verified. gRPC's
// own health service answers probes before any of this, so health stays open.
#ifndef TRANSPOSE_SERVER_ACCESS_CONTROL_H_
#define TRANSPOSE_SERVER_ACCESS_CONTROL_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace transpose {

struct AccessPolicy {
  // Empty: no token is needed. Otherwise calls must send "authorization: Bearer
  // <token>" with one of these (several while a token is being replaced; the
  // file format is ParseTokenFile's).
  std::vector<std::string> tokens;
  // Calls must come over TLS with a client certificate the server verified.
  bool require_client_certificate = false;
};

class AccessControl {
 public:
  explicit AccessControl(AccessPolicy policy);

  // OK, or UNAUTHENTICATED saying what is missing (never what the token is).
  absl::Status Check(const grpc::ServerContextBase& context) const;

  // Whether any check is on.
  bool enabled() const {
    return !policy_.tokens.empty() || policy_.require_client_certificate;
  }

 private:
  const AccessPolicy policy_;
};

// OK when `authorization` (the header's value) is "Bearer <token>", the scheme
// in any case, with one of `tokens`; UNAUTHENTICATED otherwise. Every token is
// compared, in time that does not say which matched or where one differed.
absl::Status CheckBearer(absl::string_view authorization,
                         const std::vector<std::string>& tokens);

// Equal contents in time that depends on the lengths only, not on where they
// differ.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_ACCESS_CONTROL_H_
