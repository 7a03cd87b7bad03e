// Command-line parsing shared by the shipped programs (transpose_server and the
// transpose CLI): Abseil's flags, with the usage flags ending the program the
// way scripts expect.
#ifndef TRANSPOSE_SERVER_CORE_COMMAND_LINE_H_
#define TRANSPOSE_SERVER_CORE_COMMAND_LINE_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace transpose {

struct ProgramUsage {
  // The program's name as --version prints it: "<name> <version>".
  std::string name;
  std::string version;
  // --help and --helpshort list the flags defined in source files whose path
  // ends with this (the program's main.cc); --helpfull lists every flag.
  std::string main_source_suffix;
  std::string usage_message;
  // The program's own checks of its arguments (the positional ones, argv[0]
  // first, and the flags' values), which --only_check_args runs too: a refusal
  // is reported by `report_refusal` and exits 2, as at start-up.
  std::function<absl::Status(const std::vector<char*>& positional)> check_args;
  // Prints a refusal of check_args as the program does at start-up (unset:
  // its message alone, on stderr).
  std::function<void(const absl::Status& refusal)> report_refusal;
};

// Parses argv's flags and returns the remaining arguments, argv[0] first.
// --help, --helpshort, --helpfull, --helppackage, --helpon and --version print
// to stdout and exit 0; so does --only_check_args, once `usage.check_args`
// (if any) passes. A flag Abseil's parser rejects (unknown, or a value that
// does not parse) prints its message and exits 1.
std::vector<char*> ParseCommandLine(int argc, char** argv,
                                    const ProgramUsage& usage);

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_COMMAND_LINE_H_
