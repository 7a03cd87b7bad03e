#include "server/core/log.h"

#include <atomic>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/support/log.h"

namespace transpose {
namespace {

std::atomic<int> min_level{static_cast<int>(LogLevel::kInfo)};

absl::string_view Name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
  }
  return "?";
}

void LogGrpcLine(gpr_log_func_args* args) {
  LogLevel level = LogLevel::kDebug;
  if (args->severity == GPR_LOG_SEVERITY_ERROR) level = LogLevel::kWarning;
  if (args->severity == GPR_LOG_SEVERITY_INFO) level = LogLevel::kInfo;
  // A failed GPR_ASSERT logs this and aborts: the one line that explains a
  // crash, so it shows at every level.
  if (absl::StartsWith(args->message, "assertion failed")) {
    level = LogLevel::kError;
  }
  if (!LogEnabled(level)) return;
  // gRPC's paths are its source tree's ("src/core/lib/..."); the file name
  // is enough to find the line.
  absl::string_view file = args->file;
  if (const size_t slash = file.rfind('/'); slash != absl::string_view::npos)
    file.remove_prefix(slash + 1);
  LogLine(level,
          absl::StrFormat("grpc %s:%d: %s", file, args->line, args->message));
}

}  // namespace

void RouteGrpcLogs() { gpr_set_log_function(LogGrpcLine); }

bool ParseLogLevel(absl::string_view name, LogLevel* level) {
  for (LogLevel candidate : {LogLevel::kDebug, LogLevel::kInfo,
                             LogLevel::kWarning, LogLevel::kError}) {
    if (absl::AsciiStrToLower(Name(candidate)) == name) {
      *level = candidate;
      return true;
    }
  }
  return false;
}

void SetLogLevel(LogLevel level) { min_level.store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) {
  return static_cast<int>(level) >= min_level.load(std::memory_order_relaxed);
}

void LogLine(LogLevel level, absl::string_view message) {
  const std::string line =
      absl::StrFormat("%s %s %s\n",
                      absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", absl::Now(),
                                       absl::UTCTimeZone()),
                      Name(level), message);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace transpose
