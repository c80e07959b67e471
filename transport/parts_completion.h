#pragma once
// Joins the completions of an op's parts (stripes, slices) into the op's one completion:
// the first error wins, and the op completes when its last part does, on the thread that
// completed that part. Header-only: providers and the engine both cut ops into parts.

#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "transport/completion.h"

namespace ferry::fabric {

class PartsCompletion {
 public:
  PartsCompletion(int parts, Completion done) : remaining_(parts), done_(std::move(done)) {}

  // Reports one part; every part reports exactly once.
  void PartDone(absl::Status status) {
    bool last;
    {
      absl::MutexLock lock(&mu_);
      if (!status.ok() && first_error_.ok()) first_error_ = std::move(status);
      last = --remaining_ == 0;
    }
    if (last) std::move(done_)(first_error_);
  }

 private:
  absl::Mutex mu_;
  int remaining_ ABSL_GUARDED_BY(mu_);
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  Completion done_;
};

}  // namespace ferry::fabric
