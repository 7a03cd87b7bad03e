#include "server/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_credentials_options.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/core/host_port.h"

namespace transpose {

namespace {

class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>*
                         plugins) override {
    plugins->erase(
        std::remove_if(
            plugins->begin(), plugins->end(),
            [](const std::unique_ptr<grpc::ServerBuilderPlugin>& plugin) {
              return plugin->name() == "proto_server_reflection";
            }),
        plugins->end());
  }
};

}  // namespace

GrpcServer::GrpcServer(
    std::shared_ptr<grpc::experimental::CertificateProviderInterface>
        certificates,
    std::unique_ptr<grpc::Server> server, std::string host, int port,
    std::string service_name)
    : certificates_(std::move(certificates)),
      server_(std::move(server)),
      host_(std::move(host)),
      port_(port),
      service_name_(std::move(service_name)) {}

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const GrpcServerOptions& options, grpc::Service& service) {
  absl::StatusOr<HostPort> address = ParseHostPort(options.address);
  if (!address.ok()) return address.status();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::InsecureServerCredentials();
  std::shared_ptr<grpc::experimental::CertificateProviderInterface>
      certificates;
  if (!options.tls_cert_chain_file.empty() ||
      !options.tls_private_key_file.empty()) {
    if (options.tls_cert_chain_file.empty() ||
        options.tls_private_key_file.empty()) {
      return absl::InvalidArgumentError(
          "a TLS certificate and its key come together");
    }
    certificates =
        std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
            options.tls_private_key_file, options.tls_cert_chain_file,
            options.tls_client_ca_file,
            static_cast<unsigned>(std::max<int64_t>(
                1, absl::ToInt64Seconds(options.tls_reload_interval))));
    grpc::experimental::TlsServerCredentialsOptions tls(certificates);
    tls.watch_identity_key_cert_pairs();
    if (!options.tls_client_ca_file.empty()) {
      tls.watch_root_certs();
      tls.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
    }
    credentials = grpc::experimental::TlsServerCredentials(tls);
    if (options.tls_header_check != nullptr) {
      credentials->SetAuthMetadataProcessor(options.tls_header_check);
    }
  } else if (!options.tls_client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "a client CA needs a TLS certificate and key");
  }

  grpc::ServerBuilder builder;
  // Linking reflection registers its plugin with every builder; this one drops
  // it.
  if (!options.reflection)
    builder.SetOption(std::make_unique<WithoutReflection>());
  int port = 0;
  builder.AddListeningPort(options.address, credentials, &port);
  builder.RegisterService(&service);
  // The limit is on a message's data; the header fields and framing get room on
  // top.
  constexpr uint64_t kHeaderRoom = 64 << 10;
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<uint64_t>(options.max_message_bytes + kHeaderRoom, INT32_MAX)));
  builder.SetMaxSendMessageSize(-1);
  if (options.max_transport_bytes > 0) {
    grpc::ResourceQuota quota("transpose_transport");
    quota.Resize(options.max_transport_bytes);
    builder.SetResourceQuota(quota);  // The builder takes its own reference.
  }
  builder.AddChannelArgument(
      GRPC_ARG_KEEPALIVE_TIME_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  builder.AddChannelArgument(
      GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
  if (options.max_connection_age > absl::ZeroDuration() &&
      options.max_connection_age != absl::InfiniteDuration()) {
    builder.AddChannelArgument(
        GRPC_ARG_MAX_CONNECTION_AGE_MS,
        static_cast<int>(std::min<int64_t>(
            absl::ToInt64Milliseconds(options.max_connection_age), INT32_MAX)));
    // The grace for its running calls stays unlimited: a large upload on a
    // slow link is not cut off for the connection's age.
  }
  if (options.max_concurrent_streams > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                               options.max_concurrent_streams);
  }
  // Pings are the point on a connection whose client stopped sending.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // Clients' keepalive pings too (the client library's are at least 10 s
  // apart): gRPC's default takes one every 5 minutes while the server sends
  // nothing, and closes the connection after the third ping sooner, which a
  // long upload would meet.
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  // And while they run no call: grpc-go's PermitWithoutStream and grpcio's
  // keepalive_permit_without_calls are common settings, and gRPC's default
  // counts each such ping as abuse and sends the client away. The same
  // argument has the server ping idle connections itself (keepalive_time), so
  // a peer that vanished while idle is closed too.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // gRPC sets SO_REUSEPORT by default: a second server on a port in use would
  // start and silently take part of the first one's connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options.address,
        ": the port is in use, or the host is not this machine's"));
  }
  std::unique_ptr<GrpcServer> result(
      new GrpcServer(std::move(certificates), std::move(server), address->host,
                     port, options.health_service_name));
  result->SetServing(true);
  return result;
}

void GrpcServer::SetServing(bool serving) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus(serving);
  health->SetServingStatus(service_name_, serving);
}

void GrpcServer::Shutdown(absl::Time deadline) {
  server_->Shutdown(absl::ToChronoTime(deadline));
  server_->Wait();
}

}  // namespace transpose
