#include "server/engine.h"

#include <limits>
#include <utility>

#include "absl/strings/str_format.h"
#include "server/core/status_macros.h"

namespace transpose {
Engine::Engine(std::vector<std::unique_ptr<Backend>> backends,
               EngineOptions options)
    : backends_(std::move(backends)), options_(options) {}

bool Engine::healthy() const {
  for (const auto& backend : backends_) {
    if (backend->healthy()) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<TransposeJob>> Engine::CreateJob(
    const TransposeSpec& spec) {
  TRANSPOSE_ASSIGN_OR_RETURN(const uint64_t bytes,
                             MatrixBytes(spec.dtype, spec.shape));
  if (AlgorithmName(spec.algorithm) == "unknown") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "algorithm %d is unknown", static_cast<int>(spec.algorithm)));
  }
  if (bytes > options_.max_matrix_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "matrix of %d bytes exceeds the server's limit of %d bytes", bytes,
        options_.max_matrix_bytes));
  }

  // Least loaded healthy backend that can run the spec; ties rotate.
  const size_t n = backends_.size();
  const size_t start = next_.fetch_add(1, std::memory_order_relaxed) % n;
  size_t best = n;
  int best_load = std::numeric_limits<int>::max();
  absl::Status why_not = absl::UnavailableError("no healthy backend");
  for (size_t k = 0; k < n; ++k) {
    const size_t i = (start + k) % n;
    const Backend& backend = *backends_[i];
    if (!backend.healthy()) continue;
    if (absl::Status status = backend.CanRun(spec); !status.ok()) {
      why_not = std::move(status);
      continue;
    }
    const int load = backend.load();
    if (load < best_load) {
      best = i;
      best_load = load;
    }
  }
  if (best == n) return why_not;

  return backends_[best]->CreateJob(spec, bytes);
}

}  // namespace transpose
