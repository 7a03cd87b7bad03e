// Who may call the transpose service: callers with the bearer token, and (with
// mutual TLS) only callers whose client certificate the server verified, and
// which names an allowed client where a list of them is given. gRPC's own
// health service answers probes before any of this, so health stays open.
#ifndef TRANSPOSE_SERVER_ACCESS_CONTROL_H_
#define TRANSPOSE_SERVER_ACCESS_CONTROL_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace transpose {

struct AccessPolicy {
  // Empty: no token is needed. Otherwise calls must send "authorization: Bearer
  // <token>" with one of these (several while a token is being replaced; the
  // file format is ParseTokenFile's).
  std::vector<std::string> tokens;
  // Calls must come over TLS with a client certificate the server verified.
  bool require_client_certificate = false;
  // Non-empty: that certificate must also name one of these (CertificateNames;
  // exactly, case included; no wildcards). Implies require_client_certificate.
  std::vector<std::string> client_names;
};

class AccessControl {
 public:
  explicit AccessControl(AccessPolicy policy);

  // OK, UNAUTHENTICATED saying what is missing (never what the token is), or
  // PERMISSION_DENIED for a verified certificate that names no allowed client.
  absl::Status Check(const grpc::ServerContextBase& context) const;
  // The same check on a call's parts: the peer's `auth` context (may be null
  // without TLS) and the metadata it sent, which must hold one
  // "authorization" value at most (a proxy's added one would otherwise make
  // the outcome hang on their order).
  absl::Status Check(
      const grpc::AuthContext* auth,
      const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;

  // Whether any check is on. Fixed at construction: tokens can be replaced,
  // not turned on or off.
  bool enabled() const { return tokens_on_ || require_client_certificate_; }

  // The names a verified client certificate is allowed by: its subject
  // alternative names (DNS, URI, email, IP as text), or the common name of a
  // certificate without any; gRPC's peer identity in `auth`.
  static std::vector<std::string> CertificateNames(
      const grpc::AuthContext& auth);

  // Replaces the tokens with those of a token file's new `contents`, for the
  // calls checked from now on. INVALID_ARGUMENT, keeping the tokens, for
  // contents ParseTokenFile refuses; FAILED_PRECONDITION when no token was
  // required to begin with. The number of tokens now, on success.
  absl::StatusOr<int> ReplaceTokens(absl::string_view contents);

 private:
  using Tokens = std::shared_ptr<const std::vector<std::string>>;
  Tokens tokens() const ABSL_LOCKS_EXCLUDED(mutex_);

  const bool tokens_on_;
  const bool require_client_certificate_;
  const std::vector<std::string> client_names_;
  mutable absl::Mutex mutex_;
  Tokens tokens_ ABSL_GUARDED_BY(mutex_);
};

// OK when `authorization` (the header's value) is "Bearer <token>", the scheme
// in any case, with one of `tokens`; UNAUTHENTICATED otherwise. Every token is
// compared, in time that does not say which matched or where one differed.
absl::Status CheckBearer(absl::string_view authorization,
                         const std::vector<std::string>& tokens);

// OK when one of `names` (a client certificate's) is one of `allowed`;
// PERMISSION_DENIED naming the certificate's names otherwise.
absl::Status CheckClientName(const std::vector<std::string>& names,
                             const std::vector<std::string>& allowed);

// Equal contents in time that depends on the lengths only, not on where they
// differ.
bool ConstantTimeEquals(const std::string& a, const std::string& b);

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_ACCESS_CONTROL_H_
