#pragma once
// For fabric tests: waits for one op's completion and returns its status.

#include <atomic>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "transport/fabric.h"

namespace ferry::fabric {

class CompletionWaiter {
 public:
  Completion Callback() {
    return [this](absl::Status s) {
      status_ = std::move(s);
      calls_.fetch_add(1);
      done_.Notify();
    };
  }
  absl::Status Wait() {
    done_.WaitForNotification();
    return status_;
  }
  int calls() const { return calls_.load(); }

 private:
  absl::Notification done_;
  absl::Status status_;
  std::atomic<int> calls_{0};
};

}  // namespace ferry::fabric
