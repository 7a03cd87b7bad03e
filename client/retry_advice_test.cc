#include "client/retry_advice.h"

#include <map>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gtest/gtest.h"

namespace transpose {
namespace {

using Trailers = std::multimap<grpc::string_ref, grpc::string_ref>;

TEST(ReadRetryAdviceTest, NoPushbackSaysNothing) {
  const RetryAdvice advice = ReadRetryAdvice(Trailers{{"other", "5"}});
  EXPECT_FALSE(advice.never);
  EXPECT_FALSE(advice.pushback.has_value());
}

TEST(ReadRetryAdviceTest, APushbackIsAWaitInMilliseconds) {
  const RetryAdvice advice =
      ReadRetryAdvice(Trailers{{"grpc-retry-pushback-ms", "250"}});
  EXPECT_FALSE(advice.never);
  EXPECT_EQ(advice.pushback, absl::Milliseconds(250));
  EXPECT_EQ(ReadRetryAdvice(Trailers{{"grpc-retry-pushback-ms", "0"}}).pushback,
            absl::ZeroDuration());
}

// gRFC A6: a negative or malformed pushback means do not retry.
TEST(ReadRetryAdviceTest, ANegativeOrMalformedPushbackSaysNever) {
  for (const char* value : {"-1", "", "soon", "12ms", "1e3"}) {
    const RetryAdvice advice =
        ReadRetryAdvice(Trailers{{"grpc-retry-pushback-ms", value}});
    EXPECT_TRUE(advice.never) << '"' << value << '"';
    EXPECT_FALSE(advice.pushback.has_value()) << '"' << value << '"';
  }
}

RetryAdvice Pushback(absl::Duration wait) {
  RetryAdvice advice;
  advice.pushback = wait;
  return advice;
}

// What gRPC 1.51 reports for a stream the server's transport quota reset.
absl::Status QuotaReset() {
  return absl::ResourceExhaustedError("Received RST_STREAM with error code 11");
}

// gRPC 1.51 tells a reset by the quota from a size refusal only by its text.
TEST(ResetByTransportQuotaTest, OnlyAResetWithEnhanceYourCalm) {
  EXPECT_TRUE(ResetByTransportQuota(QuotaReset()));
  EXPECT_FALSE(ResetByTransportQuota(
      absl::UnavailableError("Received RST_STREAM with error code 11")));
  EXPECT_FALSE(ResetByTransportQuota(
      absl::ResourceExhaustedError("Received RST_STREAM with error code 2")));
  EXPECT_FALSE(ResetByTransportQuota(absl::ResourceExhaustedError(
      "Received message larger than max (Received RST_STREAM with error code "
      "11)")));
}

TEST(RetriableTest, UnavailableUnlessTheServerSaidNever) {
  const absl::Status unavailable = absl::UnavailableError("draining");
  EXPECT_TRUE(Retriable(unavailable, RetryAdvice{}));
  EXPECT_TRUE(Retriable(unavailable, Pushback(absl::Seconds(1))));
  RetryAdvice never;
  never.never = true;
  EXPECT_FALSE(Retriable(unavailable, never));
}

TEST(RetriableTest, CancelledOnlyBeforeAnyOfTheResultArrived) {
  const absl::Status cancelled = absl::CancelledError("server shutting down");
  RetryAdvice advice;
  EXPECT_TRUE(Retriable(cancelled, advice));
  advice.result_arrived = true;
  EXPECT_FALSE(Retriable(cancelled, advice));
}

TEST(RetriableTest, ResourceExhaustedOnlyWhenBusyOrResetByAnotherCallsQuota) {
  const absl::Status over_limit =
      absl::ResourceExhaustedError("matrix of 2 GiB over the limit of 1 GiB");
  EXPECT_FALSE(Retriable(over_limit, RetryAdvice{}));
  EXPECT_TRUE(Retriable(over_limit, Pushback(absl::Milliseconds(100))));

  RetryAdvice small_messages;
  small_messages.messages_within_every_limit = true;
  EXPECT_TRUE(Retriable(QuotaReset(), small_messages));
  EXPECT_FALSE(Retriable(over_limit, small_messages));
  // An oversized message meets the quota again wherever it goes.
  EXPECT_FALSE(Retriable(QuotaReset(), RetryAdvice{}));
}

TEST(RetriableTest, OtherCodesAreNot) {
  for (const absl::Status& status :
       {absl::InvalidArgumentError("bad shape"),
        absl::DeadlineExceededError("stalled stream"),
        absl::InternalError("kernel failed"), absl::DataLossError("short"),
        absl::UnauthenticatedError("no token")}) {
    EXPECT_FALSE(Retriable(status, Pushback(absl::Milliseconds(1)))) << status;
  }
}

// A failure of this process (no memory for a chunk's copy) is not the
// server's, whatever the server's trailers said meanwhile.
TEST(RetriableTest, NeverAFailureInThisProcess) {
  const absl::Status no_memory = InThisProcess(
      absl::ResourceExhaustedError("no memory for a 1 MiB chunk"));
  EXPECT_FALSE(Retriable(no_memory, Pushback(absl::Milliseconds(100))));
  EXPECT_FALSE(
      Retriable(InThisProcess(absl::UnavailableError("x")), RetryAdvice{}));
  EXPECT_TRUE(Retriable(absl::ResourceExhaustedError("no memory"),
                        Pushback(absl::Milliseconds(100))));
}

}  // namespace
}  // namespace transpose
