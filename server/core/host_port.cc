#include "server/core/host_port.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace transpose {

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", address, "' is not HOST:PORT"));
  }
  const absl::string_view host = address.substr(0, colon);
  const absl::string_view port = address.substr(colon + 1);
  if (host.empty() || host == "[]") {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", address, "' has no host (0.0.0.0 listens on every interface)"));
  }
  if (absl::StrContains(host, ':') &&
      !(absl::StartsWith(host, "[") && absl::EndsWith(host, "]"))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", address, "': write an IPv6 host in brackets, [::1]:PORT"));
  }
  // A name's or an address's characters only: the metrics listener reads a
  // comma as a list of listeners ("9000,127.0.0.1" would listen on port 9000
  // of every interface too), and gRPC reads other characters its own ways.
  // An IPv6 address may carry a zone, "[fe80::1%br-lan]".
  const bool bracketed =
      absl::StartsWith(host, "[") && absl::EndsWith(host, "]");
  for (char c : bracketed ? host.substr(1, host.size() - 2) : host) {
    const bool allowed = absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
                         c == '.' || c == '-' || c == '_' ||
                         (bracketed && (c == ':' || c == '%'));
    if (!allowed) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", address, "': the host holds '", absl::string_view(&c, 1),
          "', which no host name or address does"));
    }
  }
  int number = 0;
  bool digits = !port.empty() && port.size() <= 5;
  for (char c : port) {
    digits = digits && absl::ascii_isdigit(static_cast<unsigned char>(c));
    number = number * 10 + (c - '0');
  }
  if (!digits || number > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", address, "': the port must be a number from 0 to 65535"));
  }
  return HostPort{std::string(host), number};
}

std::string PeerHost(absl::string_view peer) {
  if (!absl::StartsWith(peer, "ipv4:") && !absl::StartsWith(peer, "ipv6:")) {
    return std::string(peer);
  }
  const size_t colon = peer.rfind(':');
  if (colon == absl::string_view::npos || colon < 5) return std::string(peer);
  const absl::string_view host = peer.substr(0, colon);
  // An IPv6 host is bracketed (gRPC 1.51 writes the brackets URI-encoded), so
  // a last colon after the bracket is the port's.
  if (absl::StartsWith(peer, "ipv6:") && !absl::EndsWith(host, "]") &&
      !absl::EndsWithIgnoreCase(host, "%5D")) {
    return std::string(peer);
  }
  return std::string(host);
}

}  // namespace transpose
