#include "server/access_control.h"

#include <iterator>
#include <utility>

#include "absl/strings/match.h"
#include "server/core/status_macros.h"
#include "server/core/token_file.h"

namespace transpose {

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  // Walk the longer string whole, so the time says nothing about the first
  // difference.
  const size_t n = a.size() > b.size() ? a.size() : b.size();
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    difference |= x ^ y;
  }
  return difference == 0;
}

absl::Status CheckBearer(absl::string_view authorization,
                         const std::vector<std::string>& tokens) {
  // The scheme's name is case-insensitive (RFC 7235).
  constexpr absl::string_view kBearer = "Bearer ";
  if (!absl::StartsWithIgnoreCase(authorization, kBearer)) {
    return absl::UnauthenticatedError("invalid bearer token");
  }
  const std::string sent(authorization.substr(kBearer.size()));
  bool known = false;
  for (const std::string& token : tokens) {
    known |= ConstantTimeEquals(sent, token);
  }
  if (!known) return absl::UnauthenticatedError("invalid bearer token");
  return absl::OkStatus();
}

AccessControl::AccessControl(AccessPolicy policy)
    : tokens_on_(!policy.tokens.empty()),
      require_client_certificate_(policy.require_client_certificate),
      tokens_(std::make_shared<const std::vector<std::string>>(
          std::move(policy.tokens))) {}

AccessControl::Tokens AccessControl::tokens() const {
  absl::MutexLock lock(&mutex_);
  return tokens_;
}

absl::StatusOr<int> AccessControl::ReplaceTokens(absl::string_view contents) {
  if (!tokens_on_) {
    return absl::FailedPreconditionError("the server takes no tokens");
  }
  TRANSPOSE_ASSIGN_OR_RETURN(std::vector<std::string> tokens,
                             ParseTokenFile(contents));
  const int count = static_cast<int>(tokens.size());
  auto replacement =
      std::make_shared<const std::vector<std::string>>(std::move(tokens));
  absl::MutexLock lock(&mutex_);
  tokens_ = std::move(replacement);
  return count;
}

absl::Status AccessControl::Check(
    const grpc::ServerContextBase& context) const {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  return Check(auth.get(), context.client_metadata());
}

absl::Status AccessControl::Check(
    const grpc::AuthContext* auth,
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  if (require_client_certificate_ &&
      (auth == nullptr || !auth->IsPeerAuthenticated())) {
    return absl::UnauthenticatedError(
        "a verified client certificate is required");
  }
  if (tokens_on_) {
    const auto [first, end] = metadata.equal_range("authorization");
    if (first == end) {
      return absl::UnauthenticatedError(
          "missing 'authorization: Bearer <token>' metadata");
    }
    if (std::next(first) != end) {
      return absl::UnauthenticatedError(
          "more than one 'authorization' metadata value");
    }
    TRANSPOSE_RETURN_IF_ERROR(CheckBearer(
        absl::string_view(first->second.data(), first->second.size()),
        *tokens()));
  }
  return absl::OkStatus();
}

}  // namespace transpose
