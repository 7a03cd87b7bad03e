// The project's logging: one line per event on stderr, "TIME LEVEL message".
// Abseil 20220623 has no absl/log, and gRPC's gpr_log shares its level with
// gRPC's own chatter, so this is ours.
#ifndef TRANSPOSE_SERVER_CORE_LOG_H_
#define TRANSPOSE_SERVER_CORE_LOG_H_

#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace transpose {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// "debug", "info", "warning" or "error"; false for anything else.
bool ParseLogLevel(absl::string_view name, LogLevel* level);

// Lines below `level` are dropped. Set once by main; defaults to info.
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);

void LogLine(LogLevel level, absl::string_view message);

// Makes gRPC's own log lines (gpr_log: those at or above GRPC_VERBOSITY,
// ERROR by default) lines of this log, so that a program's stderr has one
// format: gRPC's errors as warnings (the program reports what failed itself),
// but a failed assertion, which aborts, as an error; its info and debug lines
// as ours.
void RouteGrpcLogs();

template <typename... Args>
void Log(LogLevel level, const absl::FormatSpec<Args...>& format,
         const Args&... args) {
  if (LogEnabled(level)) LogLine(level, absl::StrFormat(format, args...));
}

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_LOG_H_
