#include "server/access_control.h"

#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

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

absl::StatusOr<std::vector<std::string>> ParseTokenFile(
    absl::string_view contents) {
  std::vector<std::string> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    for (char c : line) {
      if (c < '!' || c > '~') {
        return absl::InvalidArgumentError(absl::StrCat(
            "line ", line_number,
            " holds a character that is not visible ASCII (a space, a "
            "control character or a non-ASCII byte): a token is one word "
            "per line"));
      }
    }
    tokens.emplace_back(line);
  }
  if (tokens.empty()) return absl::InvalidArgumentError("holds no token");
  return tokens;
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
  if (!policy_.tokens.empty()) {
    const auto& metadata = context.client_metadata();
    auto it = metadata.find("authorization");
    if (it == metadata.end()) {
      return absl::UnauthenticatedError(
          "missing 'authorization: Bearer <token>' metadata");
    }
    const absl::string_view value(it->second.data(), it->second.size());
    // The scheme's name is case-insensitive (RFC 7235).
    constexpr absl::string_view kBearer = "Bearer ";
    if (!absl::StartsWithIgnoreCase(value, kBearer)) {
      return absl::UnauthenticatedError("invalid bearer token");
    }
    const std::string sent(value.substr(kBearer.size()));
    // Every token is compared, so the time does not say which one matched.
    bool known = false;
    for (const std::string& token : policy_.tokens) {
      known |= ConstantTimeEquals(sent, token);
    }
    if (!known) return absl::UnauthenticatedError("invalid bearer token");
  }
  return absl::OkStatus();
}

}  // namespace transpose
