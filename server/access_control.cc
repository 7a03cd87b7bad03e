#include "server/access_control.h"

#include <utility>

#include "absl/strings/match.h"

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

AccessControl::AccessControl(AccessPolicy policy)
    : policy_(std::move(policy)) {}

absl::Status AccessControl::Check(
    const grpc::ServerContextBase& context) const {
  if (policy_.require_client_certificate) {
    const std::shared_ptr<const grpc::AuthContext> auth =
        context.auth_context();
    if (auth == nullptr || !auth->IsPeerAuthenticated()) {
      return absl::UnauthenticatedError(
          "a verified client certificate is required");
    }
  }
  if (!policy_.token.empty()) {
    const auto& metadata = context.client_metadata();
    auto it = metadata.find("authorization");
    if (it == metadata.end()) {
      return absl::UnauthenticatedError(
          "missing 'authorization: Bearer <token>' metadata");
    }
    const std::string value(it->second.data(), it->second.size());
    constexpr absl::string_view kBearer = "Bearer ";
    if (!absl::StartsWith(value, kBearer) ||
        !ConstantTimeEquals(value.substr(kBearer.size()), policy_.token)) {
      return absl::UnauthenticatedError("invalid bearer token");
    }
  }
  return absl::OkStatus();
}

}  // namespace transpose
