#include "server/core/command_line.h"

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

namespace transpose {

std::vector<char*> ParseCommandLine(int argc, char** argv,
                                    const ProgramUsage& usage) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags =
      [suffix = usage.main_source_suffix](absl::string_view path) {
        return absl::EndsWith(path, suffix);
      };
  config.contains_helpshort_flags = config.contains_help_flags;
  config.version_string = [line = usage.name + " " + usage.version + "\n"] {
    return line;
  };
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage.usage_message);
  // Abseil 20220623's absl::ParseCommandLine exits 1 after printing --help,
  // which reads as a failure to scripts and package checks. Its public way to
  // handle the usage flags oneself (absl::ParseAbseilFlagsOnly) came in
  // 20230802, so this takes the two steps of that call from the internal API.
  std::vector<char*> positional = absl::flags_internal::ParseCommandLineImpl(
      argc, argv, absl::flags_internal::ArgvListAction::kRemoveParsedArgs,
      absl::flags_internal::UsageFlagsAction::kIgnoreUsage,
      absl::flags_internal::OnUndefinedFlag::kAbortIfUndefined);
  const bool only_check_args = absl::flags_internal::GetFlagsHelpMode() ==
                               absl::flags_internal::HelpMode::kOnlyCheckArgs;
  if (absl::flags_internal::HandleUsageFlags(
          std::cout, absl::ProgramUsageMessage()) >= 0) {
    std::cout.flush();
    if (only_check_args && usage.check_args != nullptr) {
      if (const absl::Status status = usage.check_args(positional);
          !status.ok()) {
        if (usage.report_refusal != nullptr) {
          usage.report_refusal(status);
        } else {
          std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
        }
        std::exit(2);
      }
    }
    std::exit(0);
  }
  return positional;
}

}  // namespace transpose
