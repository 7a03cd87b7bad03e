#include "proto/wire.h"

#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "gtest/gtest.h"

namespace transpose::wire {
namespace {

// `bytes` split into slices at the given cut points.
grpc::ByteBuffer Split(const std::string& bytes, std::vector<size_t> cuts) {
  std::vector<grpc::Slice> slices;
  size_t start = 0;
  cuts.push_back(bytes.size());
  for (size_t cut : cuts) {
    slices.emplace_back(bytes.substr(start, cut - start));
    start = cut;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Joined(const std::vector<absl::string_view>& pieces) {
  std::string s;
  for (absl::string_view p : pieces) s.append(p.data(), p.size());
  return s;
}

v1::TransposeRequest SampleRequest() {
  v1::TransposeRequest request;
  request.set_dtype(v1::DATA_TYPE_FLOAT64);
  request.mutable_shape()->set_batch(3);
  request.mutable_shape()->set_rows(300);
  request.mutable_shape()->set_cols(1u << 20);
  request.set_algorithm(v1::ALGORITHM_PADDED_32);
  std::string data(1000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31);
  request.set_data(data);
  return request;
}

TEST(WireTest, ParsesWhatProtobufSerializesAtEverySplit) {
  const v1::TransposeRequest request = SampleRequest();
  const std::string bytes = request.SerializeAsString();
  for (size_t cut = 0; cut <= bytes.size(); cut += 7) {
    for (size_t cut2 : {cut, cut + 3, bytes.size()}) {
      if (cut2 > bytes.size()) continue;
      RequestView view;
      ASSERT_TRUE(Parse(Split(bytes, {cut, cut2}), view).ok())
          << cut << " " << cut2;
      EXPECT_EQ(Joined(view.data), request.data());
      EXPECT_EQ(view.data_size(), request.data().size());
      EXPECT_EQ(view.header.dtype(), request.dtype());
      EXPECT_EQ(view.header.shape().cols(), request.shape().cols());
      EXPECT_EQ(view.header.algorithm(), request.algorithm());
      EXPECT_TRUE(view.header.data().empty());
    }
  }
}

TEST(WireTest, EncodesWhatProtobufParses) {
  v1::TransposeResponse header;
  header.set_dtype(v1::DATA_TYPE_INT8);
  header.mutable_shape()->set_rows(5);
  header.mutable_stats()->set_backend("cpu");
  const std::string data = "the matrix bytes";
  auto owner = std::make_shared<int>(7);
  std::weak_ptr<int> watch = owner;
  {
    grpc::ByteBuffer buffer = Encode(
        header, {reinterpret_cast<const uint8_t*>(data.data()), data.size()},
        std::move(owner));
    EXPECT_FALSE(watch.expired());  // The buffer holds the owner.
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(buffer.Dump(&slices).ok());
    std::string bytes;
    for (const grpc::Slice& s : slices)
      bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
    v1::TransposeResponse parsed;
    ASSERT_TRUE(parsed.ParseFromString(bytes));
    EXPECT_EQ(parsed.data(), data);
    EXPECT_EQ(parsed.stats().backend(), "cpu");
    EXPECT_EQ(parsed.shape().rows(), 5u);
    ResponseView view;
    ASSERT_TRUE(Parse(buffer, view).ok());
    EXPECT_EQ(Joined(view.data), data);
  }
  EXPECT_TRUE(watch.expired());  // Released with the last slice.
}

TEST(WireTest, EmptyDataAndNoFields) {
  RequestView view;
  ASSERT_TRUE(Parse(Encode(v1::TransposeRequest(), {}, nullptr), view).ok());
  EXPECT_TRUE(view.data.empty());
  EXPECT_EQ(view.header.dtype(), v1::DATA_TYPE_UNSPECIFIED);
}

TEST(WireTest, LastDataFieldWinsAndUnknownFieldsPass) {
  // data "ab", an unknown fixed32 field 9, data "xyz".
  const std::string bytes(
      "\x1a\x02"
      "ab"
      "\x4d\x01\x02\x03\x04"
      "\x1a\x03"
      "xyz",
      14);
  RequestView view;
  ASSERT_TRUE(Parse(Split(bytes, {3, 9}), view).ok());
  EXPECT_EQ(Joined(view.data), "xyz");
}

TEST(WireTest, SkipsUnknownGroupsAsProtobufDoes) {
  // Unknown group 9 {field 1 = 5, group 10 {}}, then data "xy".
  const std::string bytes("\x4b\x08\x05\x53\x54\x4c\x1a\x02xy", 10);
  v1::TransposeRequest reference;
  ASSERT_TRUE(reference.ParseFromString(bytes));
  RequestView view;
  ASSERT_TRUE(Parse(Split(bytes, {2}), view).ok());
  EXPECT_EQ(Joined(view.data), reference.data());
  // An end tag that does not match its group is malformed for both.
  const std::string mismatched("\x4b\x54", 2);
  EXPECT_FALSE(reference.ParseFromString(mismatched));
  EXPECT_FALSE(Parse(Split(mismatched, {}), view).ok());
}

// Tags and lengths in encodings protobuf reads in its own way: over-long, past
// 32 bits, past 2 GiB. The fuzzer found the 10-byte length.
TEST(WireTest, AgreesWithProtobufOnOddVarints) {
  const std::string cases[] = {
      // data, its length in 10 bytes whose bits past 64 are lost.
      std::string("\x1a\x80\x80\x80\x80\x80\x80\x80\x80\x80\x1a", 11),
      // data "AB", its length in 5 bytes.
      std::string("\x1a\x82\x80\x80\x80\x00"
                  "AB",
                  8),
      // data, its length 2^31 - 1 (past protobuf's limit).
      std::string("\x1a\xff\xff\xff\xff\x07", 6),
      // data "AB" under a 5-byte tag whose bits past 32 protobuf drops.
      std::string("\x9a\x80\x80\x80\x10\x02"
                  "AB",
                  8),
      // The data tag in 6 bytes: too long for protobuf.
      std::string("\x9a\x80\x80\x80\x80\x00\x02"
                  "AB",
                  9),
      // The data tag in 3 bytes, then "AB".
      std::string("\x9a\x80\x00\x02"
                  "AB",
                  6),
      // dtype (field 1) under a 6-byte tag.
      std::string("\x88\x80\x80\x80\x80\x00\x01", 7),
  };
  for (const std::string& bytes : cases) {
    v1::TransposeRequest reference;
    const bool reference_parsed = reference.ParseFromString(bytes);
    RequestView view;
    const bool parsed = Parse(Split(bytes, {1}), view).ok();
    EXPECT_EQ(parsed, reference_parsed) << absl::CEscape(bytes);
    if (parsed && reference_parsed) {
      EXPECT_EQ(Joined(view.data), reference.data()) << absl::CEscape(bytes);
    }
  }
}

TEST(WireTest, RejectsMalformedMessages) {
  const std::string full = SampleRequest().SerializeAsString();
  for (const std::string& bytes :
       {full.substr(0, full.size() - 1),
        std::string("\x1a\x05"
                    "ab",
                    4),
        std::string("\x08\x80\x80", 3), std::string("\x0f", 1),
        std::string("\x12\x02\xff\xff", 4)}) {
    RequestView view;
    EXPECT_EQ(Parse(Split(bytes, {}), view).code(),
              absl::StatusCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace transpose::wire
