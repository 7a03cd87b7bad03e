#include "proto/wire.h"

#include <google/protobuf/io/coded_stream.h>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace transpose::wire {
namespace {

constexpr uint32_t kDataField = 3;
constexpr int kLengthDelimited = 2;

// Reads a message that lies across several slices, byte by byte for the small
// fields and as views for the large one.
class SliceReader {
 public:
  static constexpr uint64_t kMaxSize = std::numeric_limits<int32_t>::max() - 16;

  explicit SliceReader(const std::vector<grpc::Slice>& slices)
      : slices_(slices) {
    SkipEmpty();
  }

  bool AtEnd() const { return index_ == slices_.size(); }

  bool ReadByte(uint8_t& byte) {
    if (AtEnd()) return false;
    byte = slices_[index_].begin()[offset_];
    Advance(1);
    return true;
  }

  // Appends the varint's bytes to `raw` (when not null).
  bool ReadVarint(uint64_t& value, std::string* raw) {
    value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t byte;
      if (!ReadByte(byte)) return false;
      if (raw != nullptr) raw->push_back(static_cast<char>(byte));
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  // A tag as protobuf reads one: at most 5 bytes, kept to its low 32 bits.
  // Appends its bytes to `raw`.
  bool ReadTag(uint32_t& tag, std::string& raw) {
    tag = 0;
    for (int i = 0; i < 5; ++i) {
      uint8_t byte;
      if (!ReadByte(byte)) return false;
      raw.push_back(static_cast<char>(byte));
      tag += static_cast<uint32_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  // A length as protobuf reads one: at most 5 bytes, and under 2 GiB less the
  // 16 bytes protobuf keeps in hand.
  bool ReadSize(uint64_t& size) {
    size = 0;
    for (int i = 0; i < 5; ++i) {
      uint8_t byte;
      if (!ReadByte(byte)) return false;
      if (i == 4 && byte >= 8) return false;
      size |= static_cast<uint64_t>(byte & 0x7f) << (7 * i);
      if ((byte & 0x80) == 0) return size <= kMaxSize;
    }
    return false;
  }

  // Consumes `n` bytes: as views into `pieces`, or appended to `raw`.
  bool Take(uint64_t n, std::vector<absl::string_view>* pieces,
            std::string* raw) {
    while (n > 0) {
      if (AtEnd()) return false;
      const grpc::Slice& slice = slices_[index_];
      const size_t available = slice.size() - offset_;
      const size_t take = n < available ? static_cast<size_t>(n) : available;
      const char* start =
          reinterpret_cast<const char*>(slice.begin()) + offset_;
      if (pieces != nullptr) pieces->emplace_back(start, take);
      if (raw != nullptr) raw->append(start, take);
      Advance(take);
      n -= take;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    offset_ += n;
    if (offset_ == slices_[index_].size()) {
      ++index_;
      offset_ = 0;
      SkipEmpty();
    }
  }
  void SkipEmpty() {
    while (index_ < slices_.size() && slices_[index_].size() == 0) ++index_;
  }

  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t offset_ = 0;
};

// Copies the payload of the field that `tag` starts into `rest`; a group field
// by field, up to its end tag, as deep as protobuf's own recursion limit.
bool CopyField(SliceReader& reader, uint64_t tag, std::string& rest,
               int depth) {
  uint64_t value;
  switch (tag & 7) {
    case 0:
      return reader.ReadVarint(value, &rest);
    case 1:
      return reader.Take(8, nullptr, &rest);
    case kLengthDelimited:
      return reader.ReadVarint(value, &rest) &&
             reader.Take(value, nullptr, &rest);
    case 3:
      if (depth >= 100) return false;
      while (true) {
        uint32_t inner;
        if (!reader.ReadTag(inner, rest)) return false;
        if ((inner & 7) == 4) return (inner >> 3) == (tag >> 3);
        if (!CopyField(reader, inner, rest, depth + 1)) return false;
      }
    case 5:
      return reader.Take(4, nullptr, &rest);
    default:  // An end-group tag without its start, or wire types 6 and 7.
      return false;
  }
}

template <typename Message>
absl::Status ParseView(const grpc::ByteBuffer& buffer,
                       MessageView<Message>& view) {
  view.header.Clear();
  view.data.clear();
  view.slices.clear();
  if (!buffer.Valid() || !buffer.Dump(&view.slices).ok()) {
    return absl::InvalidArgumentError("unreadable message");
  }
  const absl::Status malformed = absl::InvalidArgumentError(absl::StrCat(
      "malformed ", Message::descriptor()->full_name(), " message"));
  SliceReader reader(view.slices);
  std::string
      rest;  // Every field but data, re-encoded for the generated parser.
  // The data field is found the way protobuf finds it, so both agree on
  // every input (tests/fuzz/request_fuzzer.cc checks).
  while (!reader.AtEnd()) {
    uint32_t tag;
    std::string tag_bytes;
    if (!reader.ReadTag(tag, tag_bytes)) return malformed;
    const uint32_t field = tag >> 3;
    const int wire_type = static_cast<int>(tag & 7);
    if (field == kDataField && wire_type == kLengthDelimited) {
      uint64_t length;
      if (!reader.ReadSize(length)) return malformed;
      view.data.clear();  // The last occurrence wins.
      if (!reader.Take(length, &view.data, nullptr)) return malformed;
      continue;
    }
    rest += tag_bytes;
    if (!CopyField(reader, tag, rest, 0)) return malformed;
  }
  if (!view.header.ParseFromString(rest)) return malformed;
  return absl::OkStatus();
}

void ReleaseOwner(void* owner) {
  delete static_cast<std::shared_ptr<const void>*>(owner);
}

grpc::ByteBuffer EncodeWithData(const google::protobuf::MessageLite& header,
                                absl::Span<const uint8_t> data,
                                std::shared_ptr<const void> owner) {
  std::string prefix = header.SerializeAsString();
  uint8_t tag_and_length[16];
  uint8_t* end = google::protobuf::io::CodedOutputStream::WriteVarint32ToArray(
      kDataField << 3 | kLengthDelimited, tag_and_length);
  end = google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(
      data.size(), end);
  prefix.append(reinterpret_cast<const char*>(tag_and_length),
                end - tag_and_length);
  grpc::Slice slices[2] = {grpc::Slice(prefix), grpc::Slice()};
  if (data.empty()) return grpc::ByteBuffer(slices, 1);
  void* data_ptr = const_cast<uint8_t*>(data.data());
  slices[1] =
      owner == nullptr
          ? grpc::Slice(data_ptr, data.size(), grpc::Slice::STATIC_SLICE)
          : grpc::Slice(data_ptr, data.size(), &ReleaseOwner,
                        new std::shared_ptr<const void>(std::move(owner)));
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace

absl::Status Parse(const grpc::ByteBuffer& buffer, RequestView& view) {
  return ParseView(buffer, view);
}
absl::Status Parse(const grpc::ByteBuffer& buffer, ResponseView& view) {
  return ParseView(buffer, view);
}

grpc::ByteBuffer Encode(const v1::TransposeRequest& header,
                        absl::Span<const uint8_t> data,
                        std::shared_ptr<const void> owner) {
  return EncodeWithData(header, data, std::move(owner));
}
grpc::ByteBuffer Encode(const v1::TransposeResponse& header,
                        absl::Span<const uint8_t> data,
                        std::shared_ptr<const void> owner) {
  return EncodeWithData(header, data, std::move(owner));
}

}  // namespace transpose::wire
