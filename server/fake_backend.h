// Test doubles for Backend and TransposeJob, so engine and adapter tests run
// without a device.
#ifndef TRANSPOSE_SERVER_FAKE_BACKEND_H_
#define TRANSPOSE_SERVER_FAKE_BACKEND_H_

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "server/backend.h"

namespace transpose {

// A job whose "transpose" copies its input; it finishes inline with `result`.
class FakeJob final : public TransposeJob {
 public:
  FakeJob(uint64_t bytes, std::string backend,
          absl::Status result = absl::OkStatus())
      : input_(bytes), output_(bytes), result_(std::move(result)) {
    stats_.backend = std::move(backend);
    stats_.algorithm = "fake";
  }
  void AppendInput(absl::Span<const absl::string_view> pieces,
                   std::shared_ptr<const void>) override {
    received_ = CopyPieces(pieces, absl::MakeSpan(input_), received_);
  }
  // What AppendInput has received.
  absl::string_view input() const {
    return {reinterpret_cast<const char*>(input_.data()), received_};
  }
  absl::Span<const uint8_t> output() const override { return output_; }
  const TransposeStats& stats() const override { return stats_; }
  void Run(JobDoneCallback done) override {
    output_ = input_;
    std::move(done)(result_);
  }

 private:
  std::vector<uint8_t> input_;
  uint64_t received_ = 0;
  std::vector<uint8_t> output_;
  const absl::Status result_;
  TransposeStats stats_;
};

class FakeBackend final : public Backend {
 public:
  explicit FakeBackend(std::string name) { info_.name = std::move(name); }

  const BackendInfo& info() const override { return info_; }
  bool healthy() const override { return is_healthy; }
  int load() const override { return load_value; }
  absl::Status CanRun(const TransposeSpec&) const override { return can_run; }
  absl::StatusOr<std::unique_ptr<TransposeJob>> CreateJob(
      const TransposeSpec&, uint64_t bytes) override {
    ++jobs_created;
    if (!create_error.ok()) return create_error;
    return std::make_unique<FakeJob>(bytes, info_.name);
  }

  bool is_healthy = true;
  int load_value = 0;
  absl::Status can_run = absl::OkStatus();
  absl::Status create_error = absl::OkStatus();
  std::atomic<int> jobs_created{0};

 private:
  BackendInfo info_;
};

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_FAKE_BACKEND_H_
