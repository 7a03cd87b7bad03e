// A one-line progress bar on stderr for transfers that take more than a moment.
// It draws only when stderr is a terminal, and only once the transfer has run
// for half a second.
#ifndef TRANSPOSE_CLIENT_PROGRESS_BAR_H_
#define TRANSPOSE_CLIENT_PROGRESS_BAR_H_

#include <cstdio>
#include <functional>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"

namespace transpose {

class ProgressBar {
 public:
  // `enabled` false draws nothing (e.g. --progress=false, or stderr not a
  // terminal).
  // `clock` is for tests.
  explicit ProgressBar(bool enabled, std::FILE* out = stderr,
                       std::function<absl::Time()> clock = absl::Now);
  ~ProgressBar() { Done(); }

  void Update(const TransferProgress& progress);
  // Draws the last update if the bar is up and it was not drawn, and ends the
  // line.
  void Done();

  // Whether stderr is a terminal.
  static bool StderrIsTerminal();

 private:
  void Draw(absl::Time now);

  const bool enabled_;
  std::FILE* const out_;
  const std::function<absl::Time()> clock_;
  const absl::Time start_;
  // When the attempt on the screen began (a retried one: its first update, of
  // zero bytes; the first: when the bar was made, just before the call, whose
  // allocation of the result it then counts): its bytes over its own time
  // give the rate, a retried call's earlier tries and the waits between them
  // left out.
  absl::Time attempt_start_;
  absl::Time last_update_;
  absl::Time last_draw_ = absl::InfinitePast();
  TransferProgress last_;
  bool undrawn_ = false;  // last_ is not on the screen yet.
  bool drawn_ = false;
};

}  // namespace transpose

#endif  // TRANSPOSE_CLIENT_PROGRESS_BAR_H_
