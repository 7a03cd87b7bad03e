// The gRPC server process around the service: listening address, message
// limits, the standard health service and reflection, and graceful shutdown.
#ifndef TRANSPOSE_SERVER_GRPC_SERVER_H_
#define TRANSPOSE_SERVER_GRPC_SERVER_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/security/tls_certificate_provider.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace transpose {

struct GrpcServerOptions {
  // host:port; port 0 picks a free port.
  std::string address = "0.0.0.0:50051";
  // Largest data field of a received message. gRPC checks it only once the
  // whole message has arrived, so it bounds what a call may send, not what the
  // server buffers: max_transport_bytes does that.
  uint64_t max_message_bytes = uint64_t{64} << 20;
  // Roughly the memory gRPC may hold for received data, all connections
  // together (0: no limit). The quota is soft: near it gRPC shrinks its
  // flow-control windows, so uploads slow down; once it is used up, gRPC
  // resets streams of a connection holding memory (not always the offending
  // call's), which see RESOURCE_EXHAUSTED.
  uint64_t max_transport_bytes = 0;
  // The service whose health status SetServing sets, besides the server's ("").
  std::string health_service_name;
  // TLS: the files of a PEM certificate chain and its private key; none
  // serves plaintext. gRPC reads them (and tls_client_ca_file) again every
  // tls_reload_interval, and new connections get what they hold then:
  // replace them together and whole (a Kubernetes Secret's update swaps its
  // files so). A pair that cannot be used fails new handshakes until it is
  // fixed; connections made before keep theirs.
  std::string tls_cert_chain_file;
  std::string tls_private_key_file;
  // Mutual TLS: the file of PEM roots that client certificates must chain to.
  // Clients without a certificate can still connect (so health probes work);
  // the service's AccessControl turns them away.
  std::string tls_client_ca_file;
  absl::Duration tls_reload_interval = absl::Seconds(10);
  // With TLS only (gRPC runs such processors for secure connections alone):
  // checks every call from its headers, before its messages are read.
  std::shared_ptr<grpc::AuthMetadataProcessor> tls_header_check;
  // Server reflection. It answers without access checks, so a server that
  // checks callers turns it off.
  bool reflection = true;
  // Keepalive: a connection that carried nothing for `keepalive_time` is
  // pinged, and closed (cancelling its calls) when no answer comes within
  // `keepalive_timeout`. This is how the server notices a client that vanished
  // without closing its connection (host down, network cut), whose calls would
  // otherwise hold their admission until their deadlines. Clients' own pings
  // are taken every 5 s (the client library's are at least 10 s apart).
  absl::Duration keepalive_time = absl::Seconds(60);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  // A connection this old gets a GOAWAY (gRPC adds +-10% jitter) and its
  // client reconnects, resolving the target again: how clients find servers
  // that started after they connected (gRPC's DNS resolver looks again only
  // when a connection ends). Running calls are not cut off. Infinite or not
  // positive: never.
  absl::Duration max_connection_age = absl::InfiniteDuration();
  // Calls one connection may run at once (HTTP/2's SETTINGS_MAX_CONCURRENT_
  // STREAMS); a client's further calls wait on its side for one to end. 0: no
  // limit.
  int max_concurrent_streams = 0;
};

class GrpcServer {
 public:
  // Binds and starts serving `service` (which must outlive the server), health
  // SERVING.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(
      const GrpcServerOptions& options, grpc::Service& service);

  // The bound host and port, e.g. "0.0.0.0:50051".
  const std::string& host() const { return host_; }
  int port() const { return port_; }

  // Sets the health status of the server ("") and of every service.
  void SetServing(bool serving);

  // Stops taking calls (new ones get UNAVAILABLE), lets running calls finish
  // until `deadline`, cancels the rest, and returns when all are gone: up to a
  // keepalive timeout past `deadline` while a connection does not answer
  // (transpose_server stops waiting a second after it).
  void Shutdown(absl::Time deadline);

 private:
  GrpcServer(std::shared_ptr<grpc::experimental::CertificateProviderInterface>
                 certificates,
             std::unique_ptr<grpc::Server> server, std::string host, int port,
             std::string service_name);

  // Declared first, so it outlives the server that uses it.
  const std::shared_ptr<grpc::experimental::CertificateProviderInterface>
      certificates_;
  std::unique_ptr<grpc::Server> server_;
  const std::string host_;
  const int port_;
  const std::string service_name_;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_GRPC_SERVER_H_
