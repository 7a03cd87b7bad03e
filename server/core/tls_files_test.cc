#include "server/core/tls_files.h"

#include <cstdlib>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/core/files.h"

namespace transpose {
namespace {

using ::testing::HasSubstr;

// Two self-signed certificates with their keys (valid for 1 and 3 days), and
// the first key encrypted
// (with a passphrase, and with an empty one), made by the openssl command.
class TlsFilesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char dir_template[] = "/tmp/transpose-tls-files-XXXXXX";
    dir_ = mkdtemp(dir_template);
    const std::string script = absl::StrCat(
        "set -e; cd ", dir_,
        "; for n in a:1 b:3; do openssl req -x509 -newkey ec -pkeyopt "
        "ec_paramgen_curve:P-256 -nodes -keyout ${n%:*}.key -out ${n%:*}.pem "
        "-days ${n#*:} -subj /CN=${n%:*}/O=Example; done >/dev/null 2>&1; "
        "openssl pkey -in a.key -aes256 -passout pass:x -out a.encrypted.key; "
        "openssl pkey -in a.key -aes256 -passout pass: -out a.empty.key");
    ASSERT_EQ(std::system(script.c_str()), 0) << script;
  }
  static void TearDownTestSuite() {
    std::system(absl::StrCat("rm -rf ", dir_).c_str());
  }
  static std::string Pem(const std::string& name) {
    return ReadFile(absl::StrCat(dir_, "/", name)).value();
  }
  static std::string dir_;
};

std::string TlsFilesTest::dir_;

TEST_F(TlsFilesTest, CertificatesAreFound) {
  EXPECT_TRUE(CheckPemCertificates(Pem("a.pem")).ok());
  EXPECT_TRUE(CheckPemCertificates(Pem("a.pem") + Pem("b.pem")).ok());
  // A key, or anything else, where certificates belong.
  for (const std::string& pem :
       {Pem("a.key"), std::string(), std::string("x")}) {
    EXPECT_EQ(CheckPemCertificates(pem),
              absl::InvalidArgumentError("holds no PEM certificate"));
  }
}

TEST_F(TlsFilesTest, KeyMustBeTheFirstCertificatesOwn) {
  EXPECT_TRUE(CheckPemKeyMatchesCertificate(Pem("a.key"), Pem("a.pem")).ok());
  EXPECT_TRUE(
      CheckPemKeyMatchesCertificate(Pem("a.key"), Pem("a.pem") + Pem("b.pem"))
          .ok());
  const absl::Status other =
      CheckPemKeyMatchesCertificate(Pem("b.key"), Pem("a.pem"));
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(other.message()), HasSubstr("is not the key"));
  // A certificate where the key belongs.
  EXPECT_THAT(
      std::string(
          CheckPemKeyMatchesCertificate(Pem("a.pem"), Pem("a.pem")).message()),
      HasSubstr("no unencrypted PEM private key"));
  // gRPC cannot use an encrypted key, whatever its passphrase.
  for (const char* encrypted : {"a.encrypted.key", "a.empty.key"}) {
    EXPECT_THAT(
        std::string(CheckPemKeyMatchesCertificate(Pem(encrypted), Pem("a.pem"))
                        .message()),
        HasSubstr("no unencrypted PEM private key"))
        << encrypted;
  }
  EXPECT_THAT(
      std::string(CheckPemKeyMatchesCertificate(Pem("a.key"), "").message()),
      HasSubstr("holds no PEM certificate"));
}

TEST_F(TlsFilesTest, FirstCertificateSaysWhoAndUntilWhen) {
  for (const auto& [pem, subject, days] :
       {std::tuple{Pem("a.pem"), "O=Example,CN=a", 1},
        std::tuple{Pem("b.pem") + Pem("a.pem"), "O=Example,CN=b", 3}}) {
    absl::StatusOr<CertificateFacts> facts = ReadFirstCertificate(pem);
    ASSERT_TRUE(facts.ok()) << facts.status();
    EXPECT_EQ(facts->subject, subject);
    // openssl made it moments ago, valid for `days` from then.
    const absl::Duration left = facts->not_after - absl::Now();
    EXPECT_LE(left, absl::Hours(24 * days)) << subject;
    EXPECT_GT(left, absl::Hours(24 * days) - absl::Minutes(10)) << subject;
  }
  EXPECT_EQ(ReadFirstCertificate(Pem("a.key")).status(),
            absl::InvalidArgumentError("holds no PEM certificate"));
}

}  // namespace
}  // namespace transpose
