#include "server/engine.h"

#include <algorithm>
#include <limits>
#include <memory>
#include <utility>

#include "absl/strings/str_format.h"
#include "server/core/retry.h"
#include "server/core/status_macros.h"

namespace transpose {
namespace {

// A backend's job with the admission it holds: destroying the job gives both
// back.
class AdmittedJob final : public TransposeJob {
 public:
  AdmittedJob(std::unique_ptr<TransposeJob> job, Engine::Admission admission)
      : admission_(std::move(admission)), job_(std::move(job)) {}
  // Members are destroyed in reverse order: the buffers before the admission
  // that counted them.

  void AppendInput(absl::Span<const absl::string_view> pieces,
                   std::shared_ptr<const void> owner) override {
    job_->AppendInput(pieces, std::move(owner));
  }
  absl::Span<const uint8_t> output() const override { return job_->output(); }
  const TransposeStats& stats() const override { return job_->stats(); }
  void Run(JobDoneCallback done) override { job_->Run(std::move(done)); }

 private:
  Engine::Admission admission_;
  std::unique_ptr<TransposeJob> job_;
};

// A matrix past the admission budget, or past one caller's share of it, could
// never be admitted: it is refused as too large, not as "busy, retry later",
// and Info says so.
EngineOptions WithMatrixLimitWithinBudget(EngineOptions options) {
  for (const uint64_t budget :
       {options.max_inflight_bytes, options.max_inflight_bytes_per_caller}) {
    if (budget > 0) {
      options.max_matrix_bytes = std::min(options.max_matrix_bytes, budget);
    }
  }
  return options;
}

// Adds `amount` to `count` if the total stays within `limit` (0: no limit);
// `before` is the count it found.
template <typename T>
bool AddWithinLimit(std::atomic<T>& count, T amount, T limit, T& before) {
  before = count.load();
  do {
    if (limit > 0 && (before > limit || amount > limit - before)) return false;
  } while (!count.compare_exchange_weak(before, before + amount));
  return true;
}

}  // namespace

Engine::Admission& Engine::Admission::operator=(Admission&& other) noexcept {
  if (this != &other) {
    Release();
    engine_ = std::exchange(other.engine_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    caller_ = std::move(other.caller_);
    other.caller_.clear();
  }
  return *this;
}

void Engine::Admission::Release() {
  if (engine_ == nullptr) return;
  // In the reverse order of Admit: once the server-wide counts show the room,
  // the caller's share has it too.
  if (!caller_.empty()) engine_->ReleaseCallerShare(caller_, bytes_);
  engine_->inflight_bytes_.fetch_sub(bytes_);
  engine_->inflight_requests_.fetch_sub(1);
  engine_ = nullptr;
}

void Engine::ReleaseCallerShare(const std::string& caller, uint64_t bytes) {
  absl::MutexLock lock(&callers_mutex_);
  auto it = callers_.find(caller);
  if (it == callers_.end()) return;
  it->second.bytes -= bytes;
  if (--it->second.requests == 0) callers_.erase(it);
}

int Engine::callers() const {
  absl::MutexLock lock(&callers_mutex_);
  return static_cast<int>(callers_.size());
}

Engine::Engine(std::vector<std::unique_ptr<Backend>> backends,
               EngineOptions options)
    : backends_(std::move(backends)),
      options_(WithMatrixLimitWithinBudget(options)) {}

bool Engine::healthy() const {
  for (const auto& backend : backends_) {
    if (backend->healthy()) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<TransposeJob>> Engine::CreateJob(
    const TransposeSpec& spec, absl::string_view caller) {
  TRANSPOSE_ASSIGN_OR_RETURN(const uint64_t bytes,
                             MatrixBytes(spec.dtype, spec.shape));
  // Not malformed: a newer client may name a kernel this server predates.
  if (AlgorithmName(spec.algorithm) == "unknown") {
    return absl::UnimplementedError(absl::StrFormat(
        "algorithm %d is unknown to this server (GetServerInfo lists each "
        "backend's algorithms)",
        static_cast<int>(spec.algorithm)));
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
  absl::Status why_not = absl::UnavailableError(
      "no backend of this server is in service (a device fault takes one out "
      "until the server restarts)");
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

  TRANSPOSE_ASSIGN_OR_RETURN(Admission admission, Admit(bytes, caller));
  TRANSPOSE_ASSIGN_OR_RETURN(std::unique_ptr<TransposeJob> job,
                             backends_[best]->CreateJob(spec, bytes));
  return std::make_unique<AdmittedJob>(std::move(job), std::move(admission));
}

absl::StatusOr<Engine::Admission> Engine::Admit(uint64_t bytes,
                                                absl::string_view caller) {
  // The caller's share first: a caller at its limit is refused without
  // touching the server-wide counts.
  std::string counted_caller;
  if (has_caller_limits() && !caller.empty()) {
    absl::MutexLock lock(&callers_mutex_);
    CallerShare& share = callers_[caller];
    const uint64_t per_caller_bytes = options_.max_inflight_bytes_per_caller;
    const int per_caller_requests = options_.max_inflight_requests_per_caller;
    absl::Status refused;
    if (per_caller_requests > 0 && share.requests >= per_caller_requests) {
      refused = absl::ResourceExhaustedError(absl::StrFormat(
          "server busy for %s: %d of its requests in flight, the limit per "
          "caller is %d; retry later",
          caller, share.requests, per_caller_requests));
    } else if (per_caller_bytes > 0 && share.bytes + bytes > per_caller_bytes) {
      refused = absl::ResourceExhaustedError(absl::StrFormat(
          "server busy for %s: %d bytes of its matrices in flight, and %d "
          "more would pass the limit per caller of %d; retry later",
          caller, share.bytes, bytes, per_caller_bytes));
    }
    if (!refused.ok()) {
      if (share.requests == 0) callers_.erase(caller);
      return RetryLater(std::move(refused));
    }
    share.bytes += bytes;
    ++share.requests;
    counted_caller = std::string(caller);
  }
  // Each count grows only to a total within its limit: concurrent admissions
  // never both slip under a limit, and a request refused for its bytes never
  // held bytes that refused another that fits (only a request slot, for the
  // moment it takes to give it back).
  absl::Status refused;
  int requests = 0;
  uint64_t admitted_bytes = 0;
  if (!AddWithinLimit(inflight_requests_, 1, options_.max_inflight_requests,
                      requests)) {
    refused = absl::ResourceExhaustedError(absl::StrFormat(
        "server busy: %d requests in flight, the limit is %d; retry later",
        requests, options_.max_inflight_requests));
  } else if (!AddWithinLimit(inflight_bytes_, bytes,
                             options_.max_inflight_bytes, admitted_bytes)) {
    inflight_requests_.fetch_sub(1);
    refused = absl::ResourceExhaustedError(
        absl::StrFormat("server busy: %d bytes of matrices in flight, and %d "
                        "more would pass the limit of %d; "
                        "retry later",
                        admitted_bytes, bytes, options_.max_inflight_bytes));
  }
  if (!refused.ok()) {
    if (!counted_caller.empty()) ReleaseCallerShare(counted_caller, bytes);
    return RetryLater(std::move(refused));
  }
  return Admission(this, bytes, std::move(counted_caller));
}

}  // namespace transpose
