// TLS, mutual TLS and bearer tokens against the real server binary, with
// throwaway certificates made by openssl at run time: without a valid token or
// client certificate no call but the health check succeeds.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/convert.h"
#include "server/core/files.h"
#include "tests/reflection_client.h"
#include "tests/server_process.h"
#include "transpose/v1/transpose.grpc.pb.h"

namespace transpose {
namespace {

using testing::ServerProcess;

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char dir_template[] = "/tmp/transpose-security-XXXXXX";
    dir_ = mkdtemp(dir_template);
    // A CA that signs the server's and three clients' certificates, and a rogue
    // CA with a client of its own and a second server certificate (valid for 3
    // days, the others for 2). EC keys: quick to make.
    const std::string script = absl::StrCat(
        "set -e; cd ", dir_, "\n",
        "key() { openssl genpkey -algorithm EC -pkeyopt "
        "ec_paramgen_curve:P-256 -out $1.key; }\n",
        "ca() { key $1; openssl req -x509 -new -key $1.key -out $1.pem -days 2 "
        "-subj /CN=$1; }\n",
        "leaf() { key $1; openssl req -new -key $1.key -out $1.csr -subj "
        "/CN=$1;\n"
        "  printf '%s\\n' \"${4:-subjectAltName=IP:127.0.0.1,DNS:localhost}\" "
        "> $1.ext;\n"
        "  openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key "
        "-CAcreateserial -days ${3:-2} "
        "-extfile $1.ext -out $1.pem; }\n",
        "ca ca; ca rogue_ca; leaf server ca; leaf client ca; leaf rogue "
        "rogue_ca; leaf server2 rogue_ca 3\n",
        // Clients for --tls_client_names: one named by its subject alternative
        // names, one by its common name alone.
        "leaf batch ca 2 subjectAltName=DNS:batch.example,"
        "URI:spiffe://example.org/batch\n",
        "leaf ops ca 2 basicConstraints=CA:FALSE\n",
        "printf 's3cret-token\\n' > token\n",
        "printf 'old-token\\nnew-token\\n' > two_tokens\n",
        "printf 'two words\\n' > bad_token\n");
    ASSERT_EQ(std::system(
                  absl::StrCat("bash -c '", Escape(script), "' >/dev/null 2>&1")
                      .c_str()),
              0)
        << "openssl could not make the test certificates";
  }
  static void TearDownTestSuite() {
    std::system(absl::StrCat("rm -rf ", dir_).c_str());
  }

  static std::string Escape(const std::string& script) {
    std::string out;
    for (char c : script)
      out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out;
  }
  static std::string Path(const std::string& name) {
    return absl::StrCat(dir_, "/", name);
  }
  static std::string Pem(const std::string& name) {
    return ReadFile(Path(name)).value();
  }

  static std::unique_ptr<ServerProcess> Start(std::vector<std::string> args) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::StartFromEnvironment(std::move(args));
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  static std::unique_ptr<Client> Connect(const ServerProcess& server,
                                         ClientOptions options) {
    options.target = server.address();
    options.default_timeout = absl::Seconds(10);
    // A refused handshake would only be repeated.
    options.max_attempts = 1;
    // One connection, so a client made before a certificate change keeps
    // the connection it made then.
    options.connections = 1;
    return *Client::Create(options);
  }

  // The status of each kind of call: Transpose, TransposeStream, GetServerInfo,
  // reflection.
  static std::vector<absl::StatusCode> Calls(Client& client) {
    const std::vector<uint8_t> data(4 * 5 * 4, 1);
    const MatrixView input{DataType::kFloat32, {1, 4, 5}, data};
    CallOptions stream;
    stream.force_stream = true;
    return {client.Transpose(input).status().code(),
            client.Transpose(input, stream).status().code(),
            client.GetServerInfo().status().code(),
            testing::ListServices(client.channel()).status().code()};
  }

  // What `call` returns once it returns `want`, or `within` from now: the
  // server takes a changed file within a few polls of a second each.
  static absl::StatusCode AwaitCode(
      const std::function<absl::StatusCode()>& call, absl::StatusCode want,
      absl::Duration within) {
    const absl::Time deadline = absl::Now() + within;
    absl::StatusCode got = call();
    while (got != want && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));
      got = call();
    }
    return got;
  }

  // The log at `path` once it holds `line`, or `within` from now.
  static std::string AwaitLog(const std::string& path, absl::string_view line,
                              absl::Duration within) {
    const absl::Time deadline = absl::Now() + within;
    std::string text = ReadFile(path).value_or("");
    while (!absl::StrContains(text, line) && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(100));
      text = ReadFile(path).value_or("");
    }
    return text;
  }

  static std::string dir_;
};

std::string SecurityTest::dir_;

using Codes = std::vector<absl::StatusCode>;
constexpr absl::StatusCode kOk = absl::StatusCode::kOk;
constexpr absl::StatusCode kUnauthenticated =
    absl::StatusCode::kUnauthenticated;

TEST_F(SecurityTest, TlsServesVerifyingClientsOnly) {
  auto server = Start({absl::StrCat("--tls_cert=", Path("server.pem")),
                       absl::StrCat("--tls_key=", Path("server.key"))});
  ASSERT_NE(server, nullptr);
  ClientOptions tls;
  tls.tls_root_certs_pem = Pem("ca.pem");
  EXPECT_EQ(Calls(*Connect(*server, tls)), (Codes{kOk, kOk, kOk, kOk}));
  // Plaintext, or a client that trusts another CA, gets nowhere, health
  // included.
  for (ClientOptions options : {ClientOptions(), [&] {
                                  ClientOptions rogue;
                                  rogue.tls_root_certs_pem =
                                      Pem("rogue_ca.pem");
                                  return rogue;
                                }()}) {
    auto client = Connect(*server, options);
    EXPECT_EQ(
        client
            ->Transpose({DataType::kUInt8, {1, 1, 1}, std::vector<uint8_t>{1}})
            .status()
            .code(),
        absl::StatusCode::kUnavailable);
    EXPECT_FALSE(client->CheckHealth("", absl::Seconds(3)).ok());
  }
}

TEST_F(SecurityTest,
       MutualTlsRequiresAVerifiedClientCertificateButNotForHealth) {
  auto server = Start({absl::StrCat("--tls_cert=", Path("server.pem")),
                       absl::StrCat("--tls_key=", Path("server.key")),
                       absl::StrCat("--tls_client_ca=", Path("ca.pem"))});
  ASSERT_NE(server, nullptr);
  ClientOptions anonymous;
  anonymous.tls_root_certs_pem = Pem("ca.pem");
  auto client = Connect(*server, anonymous);
  // Reflection is off when callers are checked: it could not check them.
  EXPECT_EQ(Calls(*client),
            (Codes{kUnauthenticated, kUnauthenticated, kUnauthenticated,
                   absl::StatusCode::kUnimplemented}));
  EXPECT_EQ(client->CheckHealth().value_or(false), true);

  ClientOptions known = anonymous;
  known.tls_cert_chain_pem = Pem("client.pem");
  known.tls_private_key_pem = Pem("client.key");
  EXPECT_EQ(Calls(*Connect(*server, known)),
            (Codes{kOk, kOk, kOk, absl::StatusCode::kUnimplemented}));

  // A certificate from another CA fails the handshake: nothing, health
  // included.
  ClientOptions rogue = anonymous;
  rogue.tls_cert_chain_pem = Pem("rogue.pem");
  rogue.tls_private_key_pem = Pem("rogue.key");
  auto rogue_client = Connect(*server, rogue);
  EXPECT_EQ(Calls(*rogue_client)[0], absl::StatusCode::kUnavailable);
  EXPECT_FALSE(rogue_client->CheckHealth("", absl::Seconds(3)).ok());
}

TEST_F(SecurityTest, ClientNamesNarrowMutualTlsToTheClientsNamed) {
  const std::string log = Path("client_names.log");
  absl::StatusOr<std::unique_ptr<ServerProcess>> started =
      ServerProcess::StartFromEnvironment(
          {absl::StrCat("--tls_cert=", Path("server.pem")),
           absl::StrCat("--tls_key=", Path("server.key")),
           absl::StrCat("--tls_client_ca=", Path("ca.pem")),
           "--tls_client_names=spiffe://example.org/batch,ops,client",
           absl::StrCat("--auth_token_file=", Path("token")),
           "--log_level=warning"},
          absl::Seconds(60), log);
  ASSERT_TRUE(started.ok()) << started.status();
  ServerProcess& server = **started;
  const auto with_certificate = [&](const std::string& name,
                                    const std::string& token) {
    ClientOptions options;
    options.tls_root_certs_pem = Pem("ca.pem");
    options.tls_cert_chain_pem = Pem(name + ".pem");
    options.tls_private_key_pem = Pem(name + ".key");
    options.bearer_token = token;
    return Connect(server, options);
  };
  constexpr absl::StatusCode kDenied = absl::StatusCode::kPermissionDenied;
  constexpr absl::StatusCode kNoReflection = absl::StatusCode::kUnimplemented;
  // Named by a subject alternative name (a URI), or by the common name of a
  // certificate that has no alternative names; the token is still needed.
  for (const std::string name : {"batch", "ops"}) {
    EXPECT_EQ(Calls(*with_certificate(name, "s3cret-token")),
              (Codes{kOk, kOk, kOk, kNoReflection}))
        << name;
    EXPECT_EQ(Calls(*with_certificate(name, "")),
              (Codes{kUnauthenticated, kUnauthenticated, kUnauthenticated,
                     kNoReflection}))
        << name;
  }
  // A certificate from the same CA that names no allowed client is refused on
  // every method, with the token or without (so it cannot tell whether a
  // token is right), and told its own names; health stays open. Its common
  // name is on the list, but a certificate with alternative names is named
  // by those alone.
  for (const std::string token : {"s3cret-token", "wrong-token"}) {
    EXPECT_EQ(Calls(*with_certificate("client", token)),
              (Codes{kDenied, kDenied, kDenied, kNoReflection}))
        << token;
  }
  std::unique_ptr<Client> other = with_certificate("client", "s3cret-token");
  const absl::Status refused =
      other->Transpose({DataType::kUInt8, {1, 1, 1}, std::vector<uint8_t>{1}})
          .status();
  EXPECT_THAT(
      std::string(refused.message()),
      ::testing::AllOf(::testing::StartsWith("the client certificate (\""),
                       ::testing::HasSubstr("\"localhost\""),
                       ::testing::HasSubstr("\"127.0.0.1\""),
                       ::testing::Not(::testing::HasSubstr("\"client\"")),
                       ::testing::HasSubstr(
                           ") names none of the clients this server serves")));
  EXPECT_FALSE(IsRetryable(refused));
  EXPECT_TRUE(other->CheckHealth().value_or(false));
  // The log line of a call refused at its headers names it by its request id,
  // escaped where a raw client's id could forge a line. (After a second: the
  // calls above used up the failed-call lines of this one.)
  absl::SleepFor(absl::Milliseconds(1100));
  CallOptions named;
  named.request_id = "refused-at-the-headers";
  EXPECT_EQ(
      other
          ->Transpose({DataType::kUInt8, {1, 1, 1}, std::vector<uint8_t>{1}},
                      named)
          .status()
          .code(),
      kDenied);
  {
    grpc::ClientContext context;
    context.AddMetadata(api::kRequestIdKey, "two \"words\"");
    v1::TransposeResponse response;
    EXPECT_EQ(v1::TransposeService::NewStub(other->channel())
                  ->Transpose(&context, v1::TransposeRequest(), &response)
                  .error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  EXPECT_EQ(server.AwaitMetric("transpose_requests_total{code="
                               "\"PERMISSION_DENIED\",method=\"Transpose\"}",
                               5),
            5);
  const std::string text = ReadFile(log).value_or("");
  EXPECT_THAT(text, ::testing::ContainsRegex(
                        "Transpose from a TLS client with a certificate for "
                        "[^ ]+ was refused at its headers: PERMISSION_DENIED: "
                        "the client certificate \\(\""));
  EXPECT_THAT(text, ::testing::ContainsRegex(
                        "was refused at its headers: PERMISSION_DENIED: [^\n]* "
                        "\\[request refused-at-the-headers\\]"));
  EXPECT_THAT(text, ::testing::HasSubstr(
                        "[request \"two \\\"words\\\"\", not a valid id]"));
}

TEST_F(SecurityTest, BearerTokenGuardsEveryCallButHealth) {
  auto server = Start({absl::StrCat("--auth_token_file=", Path("token"))});
  ASSERT_NE(server, nullptr);
  for (const std::string& token :
       {std::string(), std::string("wrong-token"),
        std::string("s3cret-token-but-longer"), std::string("s3cret")}) {
    ClientOptions options;
    options.bearer_token = token;
    auto client = Connect(*server, options);
    EXPECT_EQ(Calls(*client),
              (Codes{kUnauthenticated, kUnauthenticated, kUnauthenticated,
                     absl::StatusCode::kUnimplemented}))
        << "token '" << token << "'";
    EXPECT_EQ(client->CheckHealth().value_or(false), true);
  }
  ClientOptions good;
  good.bearer_token = "s3cret-token";
  EXPECT_EQ(Calls(*Connect(*server, good)),
            (Codes{kOk, kOk, kOk, absl::StatusCode::kUnimplemented}));
}

TEST_F(SecurityTest, EitherTokenOfATokenFileServesWhileOneReplacesTheOther) {
  auto server = Start({absl::StrCat("--auth_token_file=", Path("two_tokens"))});
  ASSERT_NE(server, nullptr);
  for (const char* token : {"old-token", "new-token"}) {
    ClientOptions options;
    options.bearer_token = token;
    EXPECT_EQ(Calls(*Connect(*server, options))[0], kOk) << token;
  }
}

// The token file is read again while the server runs: a token added is taken
// and a token removed is refused, without a restart; a file that cannot be used
// is reported and the tokens in use stay.
TEST_F(SecurityTest, TokensAddedOrRemovedTakeEffectWithoutARestart) {
  const std::string file = Path("live_tokens");
  const auto write = [&file](absl::string_view contents) {
    // Whole (written aside and renamed over it), as a Kubernetes Secret's
    // update swaps its files.
    ASSERT_TRUE(WriteFile(file, {contents}).ok());
  };
  write("old-token\n");
  const std::string log = Path("live_tokens.log");
  absl::StatusOr<std::unique_ptr<ServerProcess>> started =
      ServerProcess::StartFromEnvironment(
          {absl::StrCat("--auth_token_file=", file), "--log_level=info"},
          absl::Seconds(60), log);
  ASSERT_TRUE(started.ok()) << started.status();
  ServerProcess& server = **started;
  const auto code = [&server](const char* token) {
    ClientOptions options;
    options.bearer_token = token;
    return Calls(*Connect(server, options))[0];
  };
  const auto await_code = [&code](const char* token, absl::StatusCode want) {
    return AwaitCode([&] { return code(token); }, want, absl::Seconds(10));
  };
  EXPECT_EQ(code("old-token"), kOk);
  EXPECT_EQ(code("new-token"), kUnauthenticated);
  write("old-token\nnew-token\n");
  EXPECT_EQ(await_code("new-token", kOk), kOk);
  EXPECT_EQ(code("old-token"), kOk);
  write("new-token\n");
  EXPECT_EQ(await_code("old-token", kUnauthenticated), kUnauthenticated);
  EXPECT_EQ(code("new-token"), kOk);
  // Broken: reported, and new-token still serves.
  write("two words\n");
  const std::string text = AwaitLog(log, "cannot be used", absl::Seconds(10));
  EXPECT_THAT(text, ::testing::HasSubstr(absl::StrCat(
                        "--auth_token_file=", file,
                        " changed and cannot be used (line 1 holds")));
  EXPECT_THAT(text, ::testing::HasSubstr("the tokens read before stay"));
  EXPECT_THAT(text, ::testing::HasSubstr(" changed: 2 tokens now"));
  // The start-up line says tokens are on, and that they travel in the clear.
  EXPECT_THAT(text, ::testing::HasSubstr(absl::StrCat(
                        "bearer tokens: 1 from --auth_token_file=", file,
                        " over plaintext")));
  EXPECT_EQ(code("new-token"), kOk);
  EXPECT_THAT(text, ::testing::Not(::testing::HasSubstr("new-token")));
}

// Without tokens the start-up line says so, and who is served then: anyone
// that reaches the gRPC port, or only holders of a client certificate (naming
// one of the clients listed, where they are).
TEST_F(SecurityTest, TheStartUpLineSaysWhoIsServedWithoutTokens) {
  const auto start_up_log = [](const std::string& log,
                               std::vector<std::string> args) {
    args.push_back("--log_level=info");
    absl::StatusOr<std::unique_ptr<ServerProcess>> started =
        ServerProcess::StartFromEnvironment(std::move(args), absl::Seconds(60),
                                            log);
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) EXPECT_EQ((*started)->Stop(SIGTERM), 0);
    return ReadFile(log).value_or("");
  };
  EXPECT_THAT(start_up_log(Path("no_tokens.log"), {}),
              ::testing::HasSubstr(
                  "bearer tokens: off (no --auth_token_file); nor client "
                  "certificates (no --tls_client_ca): any caller that reaches "
                  "the gRPC port is served"));
  EXPECT_THAT(start_up_log(Path("no_tokens_mtls.log"),
                           {absl::StrCat("--tls_cert=", Path("server.pem")),
                            absl::StrCat("--tls_key=", Path("server.key")),
                            absl::StrCat("--tls_client_ca=", Path("ca.pem"))}),
              ::testing::HasSubstr("bearer tokens: off (no --auth_token_file); "
                                   "callers need a client certificate from "
                                   "--tls_client_ca\n"));
  EXPECT_THAT(
      start_up_log(Path("no_tokens_names.log"),
                   {absl::StrCat("--tls_cert=", Path("server.pem")),
                    absl::StrCat("--tls_key=", Path("server.key")),
                    absl::StrCat("--tls_client_ca=", Path("ca.pem")),
                    "--tls_client_names=batch"}),
      ::testing::HasSubstr("callers need a client certificate from "
                           "--tls_client_ca naming one of --tls_client_names"));
}

// A client given ClientOptions::bearer_token_file sends what the file holds
// now: a token rotated there (the server taking both while one replaces the
// other) reaches the server from a call a second later on, with the same
// Client; a file left without a single valid token keeps the last one.
TEST_F(SecurityTest, AClientSendsTheTokenItsFileHoldsNow) {
  const std::string server_file = Path("rotating_server_tokens");
  const std::string client_file = Path("rotating_client_token");
  ASSERT_TRUE(WriteFile(server_file, {"old-token\n"}).ok());
  ASSERT_TRUE(WriteFile(client_file, {"old-token\n"}).ok());
  auto server = Start({absl::StrCat("--auth_token_file=", server_file)});
  ASSERT_NE(server, nullptr);
  ClientOptions options;
  options.bearer_token_file = client_file;
  std::unique_ptr<Client> client = Connect(*server, options);
  EXPECT_EQ(Calls(*client)[0], kOk);

  // Once the server has taken its file: a new client with `token` gets
  // `want`.
  const auto await_code = [&server](const char* token, absl::StatusCode want) {
    ClientOptions options;
    options.bearer_token = token;
    return AwaitCode([&] { return Calls(*Connect(*server, options))[0]; }, want,
                     absl::Seconds(10));
  };
  ASSERT_TRUE(WriteFile(server_file, {"old-token\nnew-token\n"}).ok());
  ASSERT_EQ(await_code("new-token", kOk), kOk);
  ASSERT_TRUE(WriteFile(client_file, {"new-token\n"}).ok());
  absl::SleepFor(absl::Seconds(1.1));  // The client reads at most each second.
  EXPECT_EQ(Calls(*client)[0], kOk);
  ASSERT_TRUE(WriteFile(server_file, {"new-token\n"}).ok());
  EXPECT_EQ(await_code("old-token", kUnauthenticated), kUnauthenticated);
  EXPECT_EQ(Calls(*client)[0], kOk) << "the file's new token";

  for (const char* broken : {"", "new-token\nnewer-token\n", "two words\n"}) {
    ASSERT_TRUE(WriteFile(client_file, {broken}).ok());
    absl::SleepFor(absl::Seconds(1.1));
    EXPECT_EQ(Calls(*client)[0], kOk)
        << "the last token kept over \"" << broken << "\"";
  }

  // A file that cannot be used, or a token both ways, is refused at Create.
  options.target = server->address();
  options.bearer_token_file = Path("no_such_token_file");
  EXPECT_EQ(Client::Create(options).status().code(),
            absl::StatusCode::kNotFound);
  options.bearer_token_file = client_file;
  EXPECT_THAT(std::string(Client::Create(options).status().message()),
              ::testing::HasSubstr(" line 1 holds"));
  ASSERT_TRUE(WriteFile(client_file, {"a\nb\n"}).ok());
  EXPECT_THAT(std::string(Client::Create(options).status().message()),
              ::testing::HasSubstr(" holds 2 tokens; a client sends one"));
  options.bearer_token = "s3cret";
  EXPECT_THAT(std::string(Client::Create(options).status().message()),
              ::testing::HasSubstr("bearer_token and bearer_token_file are "
                                   "both set"));
}

// The TLS files are read again while the server runs, as a Kubernetes Secret
// volume updates them (a symbolic link to a directory swapped for another):
// new connections get the new certificate, connections made before keep
// theirs, a key that is not the certificate's is reported and fails new
// handshakes until it is fixed, and the expiry gauge follows.
TEST_F(SecurityTest, AReplacedCertificateServesNewConnectionsWithoutARestart) {
  // Directories of tls.crt and tls.key: the first server certificate, the
  // second one (another CA's), and the second one with a key not its own.
  const std::vector<std::pair<std::string, std::string>> generations = {
      {"server", "server"}, {"server2", "server2"}, {"server2", "client"}};
  for (size_t i = 0; i < generations.size(); ++i) {
    const std::string dir = Path(absl::StrCat("generation", i));
    ASSERT_EQ(mkdir(dir.c_str(), 0700), 0) << dir;
    ASSERT_TRUE(WriteFile(absl::StrCat(dir, "/tls.crt"),
                          {Pem(generations[i].first + ".pem")})
                    .ok());
    ASSERT_TRUE(WriteFile(absl::StrCat(dir, "/tls.key"),
                          {Pem(generations[i].second + ".key")})
                    .ok());
  }
  const std::string live = Path("live");
  const auto install = [&live](size_t generation) {
    const std::string next = live + ".next";
    std::remove(next.c_str());
    ASSERT_EQ(
        symlink(absl::StrCat("generation", generation).c_str(), next.c_str()),
        0);
    ASSERT_EQ(std::rename(next.c_str(), live.c_str()), 0);
  };
  install(0);
  const std::string log = Path("live_tls.log");
  absl::StatusOr<std::unique_ptr<ServerProcess>> started =
      ServerProcess::StartFromEnvironment(
          {absl::StrCat("--tls_cert=", live, "/tls.crt"),
           absl::StrCat("--tls_key=", live, "/tls.key"),
           "--tls_reload_seconds=1", "--log_level=info"},
          absl::Seconds(60), log);
  ASSERT_TRUE(started.ok()) << started.status();
  ServerProcess& server = **started;
  ClientOptions trusts_ca;
  trusts_ca.tls_root_certs_pem = Pem("ca.pem");
  ClientOptions trusts_rogue_ca;
  trusts_rogue_ca.tls_root_certs_pem = Pem("rogue_ca.pem");
  // A new client (a new connection) each time.
  const auto code = [&server](const ClientOptions& options) {
    return Calls(*Connect(server, options))[0];
  };
  const auto await_code = [&code](const ClientOptions& options,
                                  absl::StatusCode want) {
    return AwaitCode([&] { return code(options); }, want, absl::Seconds(15));
  };
  // The gauge follows the files within a second or two.
  const auto expires_in_days = [&server](double want) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    double days;
    do {
      days =
          (server.Metric("transpose_tls_certificate_expiry_timestamp_seconds")
               .value_or(-1) -
           absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch())) /
          86400;
      if (std::abs(days - want) < 0.05) break;
      absl::SleepFor(absl::Milliseconds(100));
    } while (absl::Now() < deadline);
    return days;
  };
  const auto await_log = [&log](absl::string_view line) {
    return AwaitLog(log, line, absl::Seconds(15));
  };
  std::unique_ptr<Client> held = Connect(server, trusts_ca);
  EXPECT_EQ(Calls(*held)[0], kOk);
  EXPECT_EQ(code(trusts_rogue_ca), absl::StatusCode::kUnavailable);
  EXPECT_NEAR(expires_in_days(2), 2, 0.05);

  install(1);
  EXPECT_EQ(await_code(trusts_rogue_ca, kOk), kOk);
  EXPECT_THAT(await_log("TLS files changed: connections made from 1s on get "
                        "CN=server2, valid until "),
              ::testing::HasSubstr("CN=server2, valid until "));
  EXPECT_NEAR(expires_in_days(3), 3, 0.05);
  EXPECT_EQ(Calls(*held)[0], kOk) << "a connection made before";
  held.reset();
  EXPECT_EQ(await_code(trusts_ca, absl::StatusCode::kUnavailable),
            absl::StatusCode::kUnavailable);

  install(2);
  EXPECT_THAT(
      await_log("TLS files changed and cannot be used"),
      ::testing::HasSubstr(absl::StrCat(
          "TLS files changed and cannot be used (--tls_key=", live,
          "/tls.key is not the key of the certificate chain's first "
          "certificate): from 1s on, new connections fail their handshake")));
  EXPECT_EQ(await_code(trusts_rogue_ca, absl::StatusCode::kUnavailable),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(server.AwaitMetric(
                "transpose_tls_certificate_expiry_timestamp_seconds", 0),
            0.0);

  install(1);
  EXPECT_EQ(await_code(trusts_rogue_ca, kOk), kOk);
  EXPECT_NEAR(expires_in_days(3), 3, 0.05);
}

// Over TLS, a call without the token is refused from its headers, before gRPC
// reads its message: eight unary calls of 48 MiB each leave the server's
// memory about as it was (without TLS, gRPC reads each whole before any check
// can run: docs/RELIABILITY.md), and are counted and logged as refusals; health
// stays open and the token still serves.
TEST_F(SecurityTest, OverTlsACallWithoutTheTokenIsRefusedBeforeItsMessage) {
  const std::string log = Path("header_check.log");
  absl::StatusOr<std::unique_ptr<ServerProcess>> started =
      ServerProcess::StartFromEnvironment(
          {absl::StrCat("--tls_cert=", Path("server.pem")),
           absl::StrCat("--tls_key=", Path("server.key")),
           absl::StrCat("--auth_token_file=", Path("token")),
           "--log_level=warning"},
          absl::Seconds(60), log);
  ASSERT_TRUE(started.ok()) << started.status();
  ServerProcess& server = **started;
  ClientOptions options;
  options.tls_root_certs_pem = Pem("ca.pem");
  options.unary_max_bytes = 48 << 20;
  std::unique_ptr<Client> anonymous = Connect(server, options);
  const std::vector<uint8_t> data(48 << 20, 1);
  const uint64_t before = server.ResidentBytes();
  server.ResetPeakResidentBytes();
  std::vector<std::thread> callers;
  std::vector<absl::StatusCode> codes(8);
  for (int i = 0; i < 8; ++i) {
    callers.emplace_back([&, i] {
      codes[i] =
          anonymous->Transpose({DataType::kFloat32, {1, 3072, 4096}, data})
              .status()
              .code();
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(codes, Codes(8, kUnauthenticated));
  // Less than two of the eight messages: a refusal reaches the client while
  // its data is in flight, so some MiB of each get in first, and a
  // sanitizer's quarantine keeps what the server freed in its resident set
  // (55 MiB more under ASan once). Read whole, they took 292 MiB.
  const uint64_t peak = server.PeakResidentBytes();
  EXPECT_LT(peak, before + 2 * (48 << 20))
      << (peak - before) / (1 << 20) << " MiB more at the peak";
  EXPECT_EQ(
      server.AwaitMetric("transpose_requests_total{code=\"UNAUTHENTICATED\","
                         "method=\"Transpose\"}",
                         8),
      8);
  EXPECT_THAT(ReadFile(log).value_or(""),
              ::testing::HasSubstr("Transpose from a TLS client was refused at "
                                   "its headers: UNAUTHENTICATED: missing "
                                   "'authorization: Bearer <token>' metadata"));
  EXPECT_TRUE(anonymous->CheckHealth().value_or(false));
  // A wrong token, on every method; the right one, sent twice (as a proxy
  // adding its own would), is refused too, whatever the order.
  options.bearer_token = "wrong-token";
  EXPECT_EQ(Calls(*Connect(server, options)),
            (Codes{kUnauthenticated, kUnauthenticated, kUnauthenticated,
                   absl::StatusCode::kUnimplemented}));
  options.bearer_token = "s3cret-token";
  std::unique_ptr<Client> known = Connect(server, options);
  EXPECT_EQ(Calls(*known),
            (Codes{kOk, kOk, kOk, absl::StatusCode::kUnimplemented}));
  auto stub = v1::TransposeService::NewStub(known->channel());
  for (const auto& [first, second] :
       {std::pair{"Bearer s3cret-token", "Bearer other"},
        std::pair{"Bearer other", "Bearer s3cret-token"}}) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", first);
    context.AddMetadata("authorization", second);
    v1::ServerInfo info;
    const grpc::Status status =
        stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << first;
    EXPECT_THAT(status.error_message(),
                ::testing::HasSubstr("more than one 'authorization'"));
  }
}

TEST_F(SecurityTest, TokenOverTls) {
  auto server = Start({absl::StrCat("--tls_cert=", Path("server.pem")),
                       absl::StrCat("--tls_key=", Path("server.key")),
                       absl::StrCat("--auth_token_file=", Path("token"))});
  ASSERT_NE(server, nullptr);
  ClientOptions options;
  options.tls_root_certs_pem = Pem("ca.pem");
  EXPECT_EQ(Calls(*Connect(*server, options))[0], kUnauthenticated);
  options.bearer_token = "s3cret-token";
  EXPECT_EQ(Calls(*Connect(*server, options))[0], kOk);
}

TEST_F(SecurityTest, BadSecurityFlagsStopTheServerWithAMessage) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{
            absl::StrCat("--tls_cert=", Path("server.pem"))},
        std::vector<std::string>{
            absl::StrCat("--tls_client_ca=", Path("ca.pem"))},
        std::vector<std::string>{
            absl::StrCat("--auth_token_file=", Path("missing"))}}) {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::StartFromEnvironment(args, absl::Seconds(20));
    EXPECT_FALSE(server.ok()) << args[0];
  }
  // Files that cannot work: exit 1 and a message naming the flag, the file and
  // what is wrong. A key that is not the certificate's, or a key given as the
  // client CA, used to surface as "the port is in use".
  const std::string cert = absl::StrCat("--tls_cert=", Path("server.pem"));
  const std::string key = absl::StrCat("--tls_key=", Path("server.key"));
  // A FIFO, which the server would read again each time it polls (or wait on
  // for good, with no writer), is refused rather than waited on.
  ASSERT_EQ(mkfifo(Path("fifo").c_str(), 0600), 0);
  for (const auto& [args, message] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{cert, absl::StrCat("--tls_key=", Path("client.key"))},
            absl::StrCat("--tls_key=", Path("client.key"), " is not the key")},
           {{absl::StrCat("--tls_cert=", Path("server.key")), key},
            absl::StrCat("--tls_cert=", Path("server.key"),
                         " holds no PEM certificate")},
           {{cert, key, absl::StrCat("--tls_client_ca=", Path("ca.key"))},
            absl::StrCat("--tls_client_ca=", Path("ca.key"),
                         " holds no PEM certificate")},
           {{absl::StrCat("--auth_token_file=", Path("bad_token"))},
            absl::StrCat("--auth_token_file=", Path("bad_token"),
                         " line 1 holds a character")},
           {{absl::StrCat("--auth_token_file=", Path("fifo"))},
            absl::StrCat(Path("fifo"), " is not a regular file")},
           {{cert, absl::StrCat("--tls_key=", Path("fifo"))},
            absl::StrCat(Path("fifo"), " is not a regular file")}}) {
    std::vector<std::string> command = {"--backend=cpu",
                                        "--address=127.0.0.1:0"};
    command.insert(command.end(), args.begin(), args.end());
    const auto [code, text] = ServerProcess::RunUntilExit(command);
    EXPECT_EQ(code, 1) << text;
    EXPECT_THAT(text, ::testing::HasSubstr(message));
    EXPECT_THAT(text, ::testing::Not(::testing::HasSubstr("port")));
  }
  // Flags that do not fit together: exit 2 (a usage error) and the reason.
  const std::string client_ca =
      absl::StrCat("--tls_client_ca=", Path("ca.pem"));
  for (const auto& [args, message] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{cert, key, "--tls_client_names=batch"},
            "--tls_client_names=batch: expected --tls_client_ca with it"},
           {{cert, key, client_ca, "--tls_client_names=batch,,ops"},
            "--tls_client_names=batch,,ops: expected names of printable "
            "characters without spaces"},
           {{cert, key, client_ca, "--tls_client_names=batch, ops"},
            "--tls_client_names=batch, ops: expected names"}}) {
    std::vector<std::string> command = {"--backend=cpu",
                                        "--address=127.0.0.1:0"};
    command.insert(command.end(), args.begin(), args.end());
    const auto [code, text] = ServerProcess::RunUntilExit(command);
    EXPECT_EQ(code, 2) << text;
    EXPECT_THAT(text, ::testing::HasSubstr(message));
  }
  // A file that cannot be read: exit 1 and a message naming flag and file. A
  // directory used to abort the server.
  for (const std::string& file : {Path("missing"), Path("")}) {
    const auto [code, text] = ServerProcess::RunUntilExit(
        {"--backend=cpu", absl::StrCat("--auth_token_file=", file)});
    EXPECT_EQ(code, 1) << text;
    EXPECT_THAT(text, ::testing::HasSubstr("--auth_token_file: "));
    EXPECT_THAT(text, ::testing::HasSubstr(file));
  }
}

// A TCP connection to 127.0.0.1:`port` that has sent the start of an HTTP
// request and nothing more; -1 when it cannot connect.
int HangingHttpRequest(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  constexpr char kStart[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
  if (fd < 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
          0 ||
      send(fd, kStart, sizeof(kStart) - 1, MSG_NOSIGNAL) < 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

TEST_F(SecurityTest, MetricsAnswerWhileConnectionsHangMidRequest) {
  auto server = Start({});
  ASSERT_NE(server, nullptr);
  ASSERT_TRUE(server->Metric("transpose_admitted_requests").has_value());
  // With CivetWeb's defaults (2 threads, 30 s to read a request), two
  // connections that hang mid-request kept every scrape out for as long as
  // they stayed; with 8 threads and 2 s, these 48 kept one out past the 10 s
  // a fetch waits.
  std::vector<int> hanging;
  for (int i = 0; i < 48; ++i) {
    const int fd = HangingHttpRequest(server->metrics_port());
    ASSERT_GE(fd, 0) << "connection " << i;
    hanging.push_back(fd);
  }
  absl::SleepFor(absl::Milliseconds(200));
  const absl::Time start = absl::Now();
  // FetchUrl gives up after 10 s.
  EXPECT_EQ(server->Metric("transpose_admitted_requests"), 0.0);
  const absl::Duration scrape = absl::Now() - start;
  EXPECT_LT(scrape, absl::Seconds(3)) << scrape;
  // And the server closed the hanging connections (end of stream, or reset).
  for (int fd : hanging) {
    timeval wait{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof(wait));
    char byte;
    std::string reply;
    ssize_t n;
    while ((n = recv(fd, &byte, 1, 0)) > 0) reply += byte;
    EXPECT_TRUE(n == 0 || errno == ECONNRESET)
        << "still open after 10 s: " << std::strerror(errno) << " " << reply;
    close(fd);
  }
}

}  // namespace
}  // namespace transpose
