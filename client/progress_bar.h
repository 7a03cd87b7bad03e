// A one-line progress bar on stderr for transfers that take more than a moment.
// It draws only when stderr is a terminal, and only once the transfer has run
// for half a second.
#ifndef TRANSPOSE_CLIENT_PROGRESS_BAR_H_
#define TRANSPOSE_CLIENT_PROGRESS_BAR_H_

#include <cstdio>

#include "absl/time/time.h"
#include "client/client.h"

namespace transpose {

class ProgressBar {
 public:
  // `enabled` false draws nothing (e.g. --progress=false, or stderr not a
  // terminal).
  explicit ProgressBar(bool enabled, std::FILE* out = stderr);
  ~ProgressBar() { Done(); }

  void Update(const TransferProgress& progress);
  // Draws the last update if the bar is up and it was not drawn, and ends the
  // line.
  void Done();

  // Whether stderr is a terminal.
  static bool StderrIsTerminal();

 private:
  const bool enabled_;
  std::FILE* const out_;
  const absl::Time start_;
  void Draw(absl::Time now);

  absl::Time last_draw_ = absl::InfinitePast();
  TransferProgress last_;
  bool undrawn_ = false;  // last_ is not on the screen yet.
  bool drawn_ = false;
};

}  // namespace transpose

#endif  // TRANSPOSE_CLIENT_PROGRESS_BAR_H_
