// Bearer-token files, as the server's --auth_token_file and the CLI's
// --token_file take them: one token per line.
#ifndef TRANSPOSE_SERVER_CORE_TOKEN_FILE_H_
#define TRANSPOSE_SERVER_CORE_TOKEN_FILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace transpose {

// The tokens of a token file: one per line, blank lines and the whitespace
// around each ignored (a server's file lists two while one replaces the
// other). INVALID_ARGUMENT, naming the line but not quoting it, for a token
// with a character a client cannot send in a header value after "Bearer "
// (anything but visible ASCII), and for a file with no token.
absl::StatusOr<std::vector<std::string>> ParseTokenFile(
    absl::string_view contents);

// Whether `token` could be sent after "Bearer ": not empty, visible ASCII only.
bool IsSendableToken(absl::string_view token);

}  // namespace transpose

#endif  // TRANSPOSE_SERVER_CORE_TOKEN_FILE_H_
