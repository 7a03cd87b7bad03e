#include "server/access_control.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

absl::Status CheckClientName(const std::vector<std::string>& names,
                             const std::vector<std::string>& allowed) {
  for (const std::string& name : names) {
    if (std::find(allowed.begin(), allowed.end(), name) != allowed.end()) {
      return absl::OkStatus();
    }
  }
  // The client learns only its own certificate's names, which helps whoever
  // set it up and tells it nothing about the list; escaped and cut, since a
  // CA may sign any bytes there and the message goes to the log too.
  constexpr size_t kShown = 8;
  constexpr size_t kShownBytes = 128;
  std::vector<std::string> shown;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) {
    shown.push_back(absl::StrCat(
        "\"",
        absl::CHexEscape(absl::string_view(names[i]).substr(0, kShownBytes)),
        names[i].size() > kShownBytes ? "...\"" : "\""));
  }
  std::string described =
      names.empty() ? "no names" : absl::StrJoin(shown, ", ");
  if (names.size() > kShown) {
    absl::StrAppend(&described, " and ", names.size() - kShown, " more");
  }
  return absl::PermissionDeniedError(
      absl::StrCat("the client certificate (", described,
                   ") names none of the clients this server serves"));
}

std::vector<std::string> AccessControl::CertificateNames(
    const grpc::AuthContext& auth) {
  // gRPC's peer identity: the subject alternative names, or the common name
  // of a certificate without any (as RFC 6125 has it: a CA that issues names
  // of its own for a service need not also police what it puts in the CN).
  std::vector<std::string> names;
  for (const grpc::string_ref& value : auth.GetPeerIdentity()) {
    // gRPC gives an absent common name as "".
    if (value.empty()) continue;
    std::string name(value.data(), value.size());
    if (std::find(names.begin(), names.end(), name) == names.end()) {
      names.push_back(std::move(name));
    }
  }
  return names;
}

AccessControl::AccessControl(AccessPolicy policy)
    : tokens_on_(!policy.tokens.empty()),
      require_client_certificate_(policy.require_client_certificate ||
                                  !policy.client_names.empty()),
      client_names_(std::move(policy.client_names)),
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
  // Before the token: a certificate that names no allowed client learns only
  // that, whatever token it sends, so the token cannot be probed with it.
  if (!client_names_.empty()) {
    TRANSPOSE_RETURN_IF_ERROR(
        CheckClientName(CertificateNames(*auth), client_names_));
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
