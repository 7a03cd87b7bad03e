// Fuzzes the request path a remote client controls: TransposeRequest messages,
// as raw bytes split over gRPC slices, through the zero-copy parser (checked
// against protobuf's own parser) and the request assembler behind a real Engine
// (with a fake backend), the state machine both RPCs use.
//
// Input: records of [cuts: 1 byte][length: 2 bytes, little-endian][message
// bytes].
#include <grpc/grpc.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "proto/wire.h"
#include "server/engine.h"
#include "server/fake_backend.h"
#include "server/request_assembler.h"
#include "server/transpose_service.h"

namespace transpose {
namespace {

void Require(bool condition) {
  if (!condition) std::abort();
}

std::string Joined(const std::vector<absl::string_view>& pieces) {
  std::string joined;
  for (absl::string_view piece : pieces)
    joined.append(piece.data(), piece.size());
  return joined;
}

Engine& TheEngine() {
  static Engine* engine = [] {
    std::vector<std::unique_ptr<Backend>> backends;
    backends.push_back(std::make_unique<FakeBackend>("fake:0"));
    EngineOptions options;
    options.max_matrix_bytes = 1 << 20;  // Keeps the fuzzer's memory small.
    return new Engine(std::move(backends), options);
  }();
  return *engine;
}

void FeedRequests(const uint8_t* data, size_t size) {
  RequestAssembler assembler(
      [](const TransposeSpec& spec) { return TheEngine().CreateJob(spec); });
  bool dead = false;
  size_t pos = 0;
  while (pos + 3 <= size && !dead) {
    const int cuts = data[pos] % 4;
    size_t length = data[pos + 1] | size_t{data[pos + 2]} << 8;
    pos += 3;
    if (length > size - pos) length = size - pos;
    const std::string record(reinterpret_cast<const char*>(data + pos), length);
    pos += length;

    // The message split over up to four slices at positions taken from its own
    // bytes.
    std::vector<grpc::Slice> slices;
    size_t start = 0;
    for (int k = 0; k < cuts && !record.empty(); ++k) {
      const size_t cut =
          start + static_cast<uint8_t>(record[(start + k) % record.size()]) %
                      (record.size() - start + 1);
      slices.emplace_back(record.substr(start, cut - start));
      start = cut;
    }
    slices.emplace_back(record.substr(start));
    const grpc::ByteBuffer buffer(slices.data(), slices.size());

    wire::RequestView view;
    const bool parsed = wire::Parse(buffer, view).ok();
    v1::TransposeRequest reference;
    const bool reference_parsed = reference.ParseFromString(record);
    Require(parsed == reference_parsed);
    if (!parsed) continue;
    Require(Joined(view.data) == reference.data());
    Require(view.header.dtype() == reference.dtype());
    Require(view.header.algorithm() == reference.algorithm());
    Require(view.header.has_shape() == reference.has_shape());
    Require(view.header.shape().rows() == reference.shape().rows());
    Require(view.header.shape().cols() == reference.shape().cols());
    Require(view.header.shape().batch() == reference.shape().batch());

    const absl::Status added = assembler.Add(PartOf(
        view.header, view.data,
        std::make_shared<std::vector<grpc::Slice>>(std::move(view.slices))));
    Require(assembler.received_bytes() <= assembler.expected_bytes());
    dead = !added.ok();
  }
  if (!dead) Require(assembler.Finish().ok() == assembler.complete());
}

}  // namespace
}  // namespace transpose

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  grpc_init();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  transpose::FeedRequests(data, size);
  return 0;
}
