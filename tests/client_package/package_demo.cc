// The client library inside a shared object, as a plugin or a Python extension
// would hold it: transposes through a server with it, a unary matrix, a
// streamed one with progress, and a batch into the caller's buffer.
#include "package_demo.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "client/client.h"

namespace {

template <typename T>
std::vector<T> Iota(size_t n) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(i % 30011);
  return v;
}

// Whether `out` holds the transpose of each of `batch` rows x cols matrices in
// `in`.
template <typename T>
bool IsTranspose(const std::vector<T>& in, const T* out, uint64_t batch,
                 uint64_t rows, uint64_t cols) {
  for (uint64_t b = 0; b < batch; ++b) {
    for (uint64_t r = 0; r < rows; ++r) {
      for (uint64_t c = 0; c < cols; ++c) {
        const uint64_t m = b * rows * cols;
        if (out[m + c * rows + r] != in[m + r * cols + c]) return false;
      }
    }
  }
  return true;
}

template <typename T>
absl::Span<const uint8_t> Bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what, status.ToString().c_str());
  return 1;
}

}  // namespace

int RunPackageDemo(const char* target) {
  transpose::ClientOptions options;
  options.target = target;
  absl::StatusOr<std::unique_ptr<transpose::Client>> client =
      transpose::Client::Create(options);
  if (!client.ok()) return Fail("Create", client.status());

  const std::vector<float> small = Iota<float>(3 * 5);
  absl::StatusOr<transpose::TransposeResult> unary = (*client)->Transpose(
      {transpose::DataType::kFloat32, transpose::MatrixShape::Matrix(3, 5),
       Bytes(small)});
  if (!unary.ok()) return Fail("unary", unary.status());
  if (unary->shape != transpose::MatrixShape::Matrix(5, 3) ||
      !IsTranspose(small, reinterpret_cast<const float*>(unary->data.data()), 1,
                   3, 5)) {
    std::fprintf(stderr, "unary: wrong result\n");
    return 1;
  }

  const std::vector<double> large = Iota<double>(1024 * 700);
  int progress_calls = 0;
  transpose::CallOptions call;
  call.force_stream = true;
  call.on_progress = [&](const transpose::TransferProgress&) {
    ++progress_calls;
  };
  absl::StatusOr<transpose::TransposeResult> streamed = (*client)->Transpose(
      {transpose::DataType::kFloat64, transpose::MatrixShape::Matrix(1024, 700),
       Bytes(large)},
      call);
  if (!streamed.ok()) return Fail("stream", streamed.status());
  if (!IsTranspose(large,
                   reinterpret_cast<const double*>(streamed->data.data()), 1,
                   1024, 700) ||
      progress_calls == 0) {
    std::fprintf(stderr, "stream: wrong result or no progress\n");
    return 1;
  }

  const std::vector<int16_t> batch = Iota<int16_t>(3 * 4 * 6);
  std::vector<int16_t> batch_out(batch.size());
  absl::StatusOr<transpose::TransposeStats> stats = (*client)->TransposeInto(
      {transpose::DataType::kInt16, transpose::MatrixShape::Batch(3, 4, 6),
       Bytes(batch)},
      {reinterpret_cast<uint8_t*>(batch_out.data()),
       batch_out.size() * sizeof(int16_t)});
  if (!stats.ok()) return Fail("batch", stats.status());
  if (!IsTranspose(batch, batch_out.data(), 3, 4, 6)) {
    std::fprintf(stderr, "batch: wrong result\n");
    return 1;
  }
  std::printf("ok: backend %s, %d progress calls\n", stats->backend.c_str(),
              progress_calls);
  return 0;
}
