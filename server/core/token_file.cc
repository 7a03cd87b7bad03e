#include "server/core/token_file.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace transpose {

bool IsSendableToken(absl::string_view token) {
  if (token.empty()) return false;
  for (char c : token) {
    if (c < '!' || c > '~') return false;
  }
  return true;
}

absl::StatusOr<std::vector<std::string>> ParseTokenFile(
    absl::string_view contents) {
  std::vector<std::string> tokens;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(contents, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    if (!IsSendableToken(line)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "line ", line_number,
          " holds a character that is not visible ASCII (a space, a "
          "control character or a non-ASCII byte): a token is one word "
          "per line"));
    }
    tokens.emplace_back(line);
  }
  if (tokens.empty()) return absl::InvalidArgumentError("holds no token");
  return tokens;
}

}  // namespace transpose
