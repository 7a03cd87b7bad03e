// A loopback port that refuses connections, for tests of a server out of
// reach: bound and never listening, and held, so no other process can take it
// while the test runs (a fixed port such as 1 may be open somewhere).
#ifndef TRANSPOSE_TESTS_REFUSED_PORT_H_
#define TRANSPOSE_TESTS_REFUSED_PORT_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace transpose::testing {

class RefusedPort {
 public:
  RefusedPort() : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    if (fd_ < 0 ||
        bind(fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      std::abort();  // A test machine without loopback cannot run these.
    }
    port_ = ntohs(address.sin_port);
  }
  ~RefusedPort() { close(fd_); }
  RefusedPort(const RefusedPort&) = delete;
  RefusedPort& operator=(const RefusedPort&) = delete;

  // "127.0.0.1:PORT".
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  const int fd_;
  int port_ = 0;
};

}  // namespace transpose::testing

#endif  // TRANSPOSE_TESTS_REFUSED_PORT_H_
