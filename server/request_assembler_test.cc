#include "server/request_assembler.h"

#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/fake_backend.h"

namespace transpose {
namespace {

using ::testing::HasSubstr;

TransposeSpec Spec(uint64_t rows, uint64_t cols) {
  return {DataType::kUInt8, {1, rows, cols}, kernels::Algorithm::kAuto};
}

// The pieces must outlive the part: pass a braced list to a call of Add.
RequestPart Header(const TransposeSpec& spec,
                   absl::Span<const absl::string_view> data = {}) {
  return {true, spec, data};
}

RequestPart Data(absl::Span<const absl::string_view> data) {
  return {false, {}, data};
}

class RequestAssemblerTest : public ::testing::Test {
 protected:
  RequestAssembler assembler_{
      [this](const TransposeSpec& spec)
          -> absl::StatusOr<std::unique_ptr<TransposeJob>> {
        ++created_;
        if (!factory_error_.ok()) return factory_error_;
        absl::StatusOr<uint64_t> bytes = MatrixBytes(spec.dtype, spec.shape);
        if (!bytes.ok()) return bytes.status();
        return std::make_unique<FakeJob>(*bytes, "fake");
      }};
  int created_ = 0;
  absl::Status factory_error_ = absl::OkStatus();
};

std::string InputOf(TransposeJob* job) {
  return std::string(static_cast<FakeJob*>(job)->input());
}

TEST_F(RequestAssemblerTest, AssemblesChunksInOrder) {
  ASSERT_TRUE(assembler_.Add(Header(Spec(2, 3), {"ab"})).ok());
  EXPECT_FALSE(assembler_.complete());
  ASSERT_TRUE(assembler_.Add(Data({""})).ok());
  ASSERT_TRUE(assembler_.Add(Data({"c", "", "de"})).ok());
  ASSERT_TRUE(assembler_.Add(Data({"f"})).ok());
  EXPECT_TRUE(assembler_.complete());
  EXPECT_TRUE(assembler_.Finish().ok());
  EXPECT_EQ(InputOf(assembler_.job().get()), "abcdef");
  EXPECT_EQ(created_, 1);
}

TEST_F(RequestAssemblerTest, AcceptsHeadersAndEmptyPiecesAfterTheLastByte) {
  ASSERT_TRUE(assembler_.Add(Header(Spec(1, 2), {"ab"})).ok());
  EXPECT_TRUE(assembler_.complete());
  EXPECT_TRUE(assembler_.Add(Header(Spec(1, 2), {"", ""})).ok());
  EXPECT_TRUE(assembler_.Add(Data({})).ok());
  EXPECT_EQ(assembler_.Add(Data({"", "x"})).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RequestAssemblerTest, StillRejectsExtraDataOnceTheJobIsReleased) {
  ASSERT_TRUE(assembler_.Add(Header(Spec(1, 2), {"ab"})).ok());
  std::weak_ptr<TransposeJob> job = assembler_.job();
  assembler_.ReleaseJob();
  EXPECT_TRUE(job.expired());
  EXPECT_TRUE(assembler_.Add(Data({""})).ok());
  EXPECT_TRUE(assembler_.Finish().ok());
  EXPECT_EQ(assembler_.Add(Data({"x"})).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(RequestAssemblerTest, AcceptsTheSameHeaderAgain) {
  ASSERT_TRUE(assembler_.Add(Header(Spec(2, 2), {"ab"})).ok());
  ASSERT_TRUE(assembler_.Add(Header(Spec(2, 2), {"cd"})).ok());
  EXPECT_TRUE(assembler_.Finish().ok());
  EXPECT_EQ(created_, 1);
}

TEST_F(RequestAssemblerTest, RejectsDataBeforeTheHeader) {
  absl::Status status = assembler_.Add(Data({"abc"}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("before the header"));
  EXPECT_EQ(created_, 0);
}

TEST_F(RequestAssemblerTest, RejectsAFirstMessageWithoutHeader) {
  absl::Status status = assembler_.Add(Data({""}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("no header"));
}

TEST_F(RequestAssemblerTest, RejectsAHeaderRepeatedWithOtherValues) {
  ASSERT_TRUE(assembler_.Add(Header(Spec(2, 2), {"ab"})).ok());
  TransposeSpec other = Spec(2, 2);
  other.algorithm = kernels::Algorithm::kNaive;
  absl::Status status = assembler_.Add(Header(other, {"cd"}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("header repeated with other values"));
  EXPECT_THAT(status.message(), HasSubstr("naive"));
}

TEST_F(RequestAssemblerTest, RejectsDataLongerThanDeclared) {
  ASSERT_TRUE(assembler_.Add(Header(Spec(2, 2), {"abc"})).ok());
  absl::Status status = assembler_.Add(Data({"de"}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("longer than declared"));
}

TEST_F(RequestAssemblerTest, RejectsAOneMessageRequestThatIsTooLong) {
  absl::Status status = assembler_.Add(Header(Spec(1, 1), {"ab"}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("longer than declared"));
}

TEST_F(RequestAssemblerTest, FinishRejectsShortData) {
  ASSERT_TRUE(assembler_.Add(Header(Spec(2, 2), {"abc"})).ok());
  absl::Status status = assembler_.Finish();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("shorter than declared"));
}

// A unary request declaring gigabytes over a few bytes is refused before a job
// (its admission, its buffers) is made for it.
TEST_F(RequestAssemblerTest, AWholeRequestOfTheWrongSizeMakesNoJob) {
  const TransposeSpec huge{DataType::kFloat32, {1, 32768, 32768}, {}};
  absl::Status status = assembler_.AddWhole(Header(huge, {"abcd"}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("shorter than declared: 4 bytes arrived, float32 "
                        "32768x32768 (algorithm auto) needs 4294967296"));
  status = assembler_.AddWhole(Header(Spec(1, 2), {"abc"}));
  EXPECT_THAT(status.message(), HasSubstr("longer than declared"));
  EXPECT_EQ(created_, 0);
  // No header, or one without a size: the usual errors.
  EXPECT_THAT(assembler_.AddWhole(Data({"ab"})).message(),
              HasSubstr("before the header"));
  EXPECT_THAT(assembler_.AddWhole(Header(Spec(0, 5))).message(),
              HasSubstr("zero"));
}

TEST_F(RequestAssemblerTest, AWholeRequestOfTheRightSizeIsComplete) {
  ASSERT_TRUE(assembler_.AddWhole(Header(Spec(2, 3), {"abc", "def"})).ok());
  EXPECT_TRUE(assembler_.complete());
  EXPECT_EQ(InputOf(assembler_.job().get()), "abcdef");
  EXPECT_EQ(created_, 1);
}

TEST_F(RequestAssemblerTest, FinishRejectsAnEmptyStream) {
  EXPECT_EQ(assembler_.Finish().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(RequestAssemblerTest, PassesTheFactoryErrorOn) {
  factory_error_ = absl::ResourceExhaustedError("over the limit");
  EXPECT_EQ(assembler_.Add(Header(Spec(2, 2))).code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(RequestAssemblerTest, PassesValidationErrorsOn) {
  TransposeSpec zero = Spec(0, 5);
  absl::Status status = assembler_.Add(Header(zero));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("zero"));
}

}  // namespace
}  // namespace transpose
