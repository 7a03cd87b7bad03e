// The transport-free transpose engine: validates a request, enforces the limits
// (matrix size and admission), and picks the least loaded healthy backend that
// can run it.
#ifndef TRANSPOSE_SERVER_ENGINE_H_
#define TRANSPOSE_SERVER_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/backend.h"

namespace transpose {

struct EngineOptions {
  // Largest matrix accepted, in bytes; at most max_inflight_bytes and
  // max_inflight_bytes_per_caller, where those are set.
  uint64_t max_matrix_bytes = uint64_t{4} << 30;
  // Admission: bytes of matrices in jobs that exist at once (from the header's
  // arrival until the result is sent), and the number of such jobs. Past
  // either, new requests get RESOURCE_EXHAUSTED at once, rather than waiting or
  // exhausting memory. 0: no limit.
  uint64_t max_inflight_bytes = 0;
  int max_inflight_requests = 0;
  // The same limits for each caller (CreateJob's `caller`): so that one caller,
  // slow or hostile, cannot hold the whole budget while others are refused.
  // 0: no limit.
  uint64_t max_inflight_bytes_per_caller = 0;
  int max_inflight_requests_per_caller = 0;
};

class Engine {
 public:
  // `backends` must not be empty.
  Engine(std::vector<std::unique_ptr<Backend>> backends, EngineOptions options);

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // A job for `spec`: INVALID_ARGUMENT for a malformed spec, RESOURCE_EXHAUSTED
  // past max_matrix_bytes, past the admission limits or out of memory,
  // UNIMPLEMENTED for an algorithm no backend has, UNAVAILABLE when no backend
  // is healthy. The job holds its admission until it is destroyed. `caller`
  // names who asks, for the per-caller limits (e.g. the client's address);
  // empty: only the server-wide limits apply.
  absl::StatusOr<std::unique_ptr<TransposeJob>> CreateJob(
      const TransposeSpec& spec, absl::string_view caller = "");

  absl::Span<const std::unique_ptr<Backend>> backends() const {
    return backends_;
  }
  // True while at least one backend is healthy.
  bool healthy() const;
  const EngineOptions& options() const { return options_; }

  // Bytes and jobs admitted now.
  uint64_t inflight_bytes() const { return inflight_bytes_.load(); }
  int inflight_requests() const { return inflight_requests_.load(); }
  // Callers holding admitted jobs now (tracked only under per-caller limits).
  int callers() const ABSL_LOCKS_EXCLUDED(callers_mutex_);

  // One admitted job's share of the limits, given back when destroyed.
  class Admission {
   public:
    Admission(Engine* engine, uint64_t bytes, std::string caller)
        : engine_(engine), bytes_(bytes), caller_(std::move(caller)) {}
    Admission(Admission&& other) noexcept { *this = std::move(other); }
    Admission& operator=(Admission&& other) noexcept;
    ~Admission() { Release(); }

   private:
    void Release();
    Engine* engine_ = nullptr;
    uint64_t bytes_ = 0;
    // Empty when the job counts against no caller's share.
    std::string caller_;
  };

 private:
  struct CallerShare {
    uint64_t bytes = 0;
    int requests = 0;
  };

  absl::StatusOr<Admission> Admit(uint64_t bytes, absl::string_view caller)
      ABSL_LOCKS_EXCLUDED(callers_mutex_);
  bool has_caller_limits() const {
    return options_.max_inflight_bytes_per_caller > 0 ||
           options_.max_inflight_requests_per_caller > 0;
  }
  void ReleaseCallerShare(const std::string& caller, uint64_t bytes)
      ABSL_LOCKS_EXCLUDED(callers_mutex_);

  const std::vector<std::unique_ptr<Backend>> backends_;
  const EngineOptions options_;
  // Rotates ties between equally loaded backends.
  std::atomic<uint32_t> next_{0};
  std::atomic<uint64_t> inflight_bytes_{0};
  std::atomic<int> inflight_requests_{0};
  mutable absl::Mutex callers_mutex_;
  // Callers with admitted jobs; a caller leaves with its last job.
  absl::flat_hash_map<std::string, CallerShare> callers_
      ABSL_GUARDED_BY(callers_mutex_);
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_ENGINE_H_
