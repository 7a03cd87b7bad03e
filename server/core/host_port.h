// Listening addresses as the server's flags take them: HOST:PORT.
#ifndef TRANSPOSE_SERVER_CORE_HOST_PORT_H_
#define TRANSPOSE_SERVER_CORE_HOST_PORT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace transpose {

struct HostPort {
  std::string host;  // As written: a name, an IPv4 address or [an IPv6 one].
  int port = 0;      // 0 asks for a free port.
};

// Splits "host:port". INVALID_ARGUMENT, saying what is wrong, for an empty
// host, an IPv6 address without brackets, or a port that is not a number from
// 0 to 65535 (the OS would take 65536 as 0 and 99999 as 34463).
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);

// A gRPC peer ("ipv4:10.0.0.1:40000", "ipv6:[::1]:40000") without its port:
// the client's host, which its connections share. Other peers ("unix:...")
// as they are.
std::string PeerHost(absl::string_view peer);

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_HOST_PORT_H_
