// The transport-free transpose engine: validates a request, enforces the
// limits, picks the least loaded healthy backend that can run it.
#ifndef TRANSPOSE_SERVER_ENGINE_H_
#define TRANSPOSE_SERVER_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/backend.h"

namespace transpose {

struct EngineOptions {
  // Largest matrix accepted, in bytes.
  uint64_t max_matrix_bytes = uint64_t{4} << 30;
};

class Engine {
 public:
  // `backends` must not be empty.
  Engine(std::vector<std::unique_ptr<Backend>> backends, EngineOptions options);

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // A job for `spec`: INVALID_ARGUMENT for a malformed spec, RESOURCE_EXHAUSTED
  // past max_matrix_bytes or out of memory, UNIMPLEMENTED for an algorithm no
  // backend has, UNAVAILABLE when no backend is healthy.
  absl::StatusOr<std::unique_ptr<TransposeJob>> CreateJob(
      const TransposeSpec& spec);

  absl::Span<const std::unique_ptr<Backend>> backends() const {
    return backends_;
  }
  // True while at least one backend is healthy.
  bool healthy() const;
  const EngineOptions& options() const { return options_; }

 private:
  const std::vector<std::unique_ptr<Backend>> backends_;
  const EngineOptions options_;
  // Rotates ties between equally loaded backends.
  std::atomic<uint32_t> next_{0};
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_ENGINE_H_
