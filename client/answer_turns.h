// How callers that share a connection with no thread of its own wait for their answers
// (client/transfer_line.h, client/socket_line.h): one reads while the others wait for it to
// hand them their answer or the turn, so a lone caller reads its own answer with no hop to
// another thread.
#pragma once

#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace ferry {

// Under `mu`, until `answer` has a value or `deadline` passes: waits while another caller
// reads (`reading`), else takes the turn and calls `read(deadline)`, which reads once (it may
// release `mu` meanwhile, setting and clearing `reading`), hands out what it read, and
// returns false at the deadline.
template <typename Answer, typename Read>
void AwaitAnswer(absl::Mutex& mu, const bool& reading, const std::optional<Answer>& answer,
                 absl::Time deadline, Read read) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  struct Turn {
    const std::optional<Answer>* answer;
    const bool* reading;
  } turn{&answer, &reading};
  // Our answer came, or nobody reads and it is our turn.
  const absl::Condition answered_or_free(
      +[](Turn* t) { return t->answer->has_value() || !*t->reading; }, &turn);
  while (!answer.has_value()) {
    if (reading) {
      if (!mu.AwaitWithDeadline(answered_or_free, deadline)) return;
      continue;
    }
    if (!read(deadline)) return;
  }
}

}  // namespace ferry
