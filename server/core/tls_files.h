// Checks of TLS files before gRPC takes them: gRPC reports a key that does not
// match its certificate, or a file that is no certificate at all, only as a
// failure to listen (a server) or to connect (a client, which then retries).
#ifndef TRANSPOSE_SERVER_CORE_TLS_FILES_H_
#define TRANSPOSE_SERVER_CORE_TLS_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace transpose {

// OK when `pem` starts with a PEM certificate (what gRPC needs of a
// certificate chain or CA file); INVALID_ARGUMENT otherwise.
absl::Status CheckPemCertificates(absl::string_view pem);

// OK when `key_pem` is a PEM private key whose public half is that of the
// first certificate in `cert_chain_pem`; INVALID_ARGUMENT saying which part
// fails otherwise. The message never quotes the key.
absl::Status CheckPemKeyMatchesCertificate(absl::string_view key_pem,
                                           absl::string_view cert_chain_pem);

// What a log line and an expiry alert need of a certificate.
struct CertificateFacts {
  std::string subject;  // RFC 2253: "CN=server,O=Example".
  absl::Time not_after;
};

// The first certificate in `cert_chain_pem` (the one a server presents);
// INVALID_ARGUMENT when there is none.
absl::StatusOr<CertificateFacts> ReadFirstCertificate(
    absl::string_view cert_chain_pem);

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_TLS_FILES_H_
