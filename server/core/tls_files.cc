#include "server/core/tls_files.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <ctime>
#include <memory>
#include <string>

namespace transpose {
namespace {

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using Bio = std::unique_ptr<BIO, BioFree>;
using Certificate = std::unique_ptr<X509, X509Free>;
using PrivateKey = std::unique_ptr<EVP_PKEY, KeyFree>;

Bio ReadOnlyBio(absl::string_view pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The next certificate in `bio`, or null at the end or at text that is not
// one (OpenSSL's error queue is cleared either way).
Certificate NextCertificate(BIO* bio) {
  Certificate cert(PEM_read_bio_X509(bio, nullptr, nullptr, nullptr));
  ERR_clear_error();
  return cert;
}

}  // namespace

absl::Status CheckPemCertificates(absl::string_view pem) {
  return ReadFirstCertificate(pem).status();
}

absl::Status CheckPemKeyMatchesCertificate(absl::string_view key_pem,
                                           absl::string_view cert_chain_pem) {
  Bio cert_bio = ReadOnlyBio(cert_chain_pem);
  Bio key_bio = ReadOnlyBio(key_pem);
  if (cert_bio == nullptr || key_bio == nullptr) {
    return absl::ResourceExhaustedError("out of memory reading PEM");
  }
  Certificate cert = NextCertificate(cert_bio.get());
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        "the certificate chain holds no PEM certificate");
  }
  // A passphrase callback that fails: an encrypted key is refused here
  // (gRPC cannot use one) instead of prompting on the terminal, even one
  // encrypted with an empty passphrase.
  PrivateKey key(PEM_read_bio_PrivateKey(
      key_bio.get(), nullptr, [](char*, int, int, void*) { return -1; },
      nullptr));
  ERR_clear_error();
  if (key == nullptr) {
    return absl::InvalidArgumentError("holds no unencrypted PEM private key");
  }
  const bool matches = X509_check_private_key(cert.get(), key.get()) == 1;
  ERR_clear_error();
  if (!matches) {
    return absl::InvalidArgumentError(
        "is not the key of the certificate chain's first certificate");
  }
  return absl::OkStatus();
}

absl::StatusOr<CertificateFacts> ReadFirstCertificate(
    absl::string_view cert_chain_pem) {
  Bio bio = ReadOnlyBio(cert_chain_pem);
  Certificate cert = bio == nullptr ? nullptr : NextCertificate(bio.get());
  if (cert == nullptr) {
    return absl::InvalidArgumentError("holds no PEM certificate");
  }
  std::tm expiry{};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert.get()), &expiry) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        "holds a certificate whose expiry cannot be read");
  }
  CertificateFacts facts;
  facts.not_after = absl::FromTimeT(timegm(&expiry));
  Bio subject(BIO_new(BIO_s_mem()));
  if (subject == nullptr ||
      X509_NAME_print_ex(subject.get(), X509_get_subject_name(cert.get()), 0,
                         XN_FLAG_RFC2253) < 0) {
    ERR_clear_error();
    return absl::ResourceExhaustedError("out of memory reading PEM");
  }
  char* text = nullptr;
  const long length = BIO_get_mem_data(subject.get(), &text);
  facts.subject.assign(text, static_cast<size_t>(length));
  return facts;
}

}  // namespace transpose
