#pragma once
// A few threads that run queued work in the order it came: for work that may block (a call
// to a peer) handed off by threads that must not block (gRPC's callback reactions).

#include <cstddef>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace ferry {

class WorkerPool {
 public:
  // At most `threads` threads, named `name` (15 characters at most show), started as work
  // comes and no thread is idle: a pool never used holds none.
  WorkerPool(size_t threads, std::string name);
  // Runs the work still queued, then joins the threads.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `work`. Work queued while the pool is being destroyed still runs.
  void Run(absl::AnyInvocable<void() &&> work);
  // Threads started so far (tests).
  size_t threads() const;

 private:
  void Loop();

  const size_t max_threads_;
  const std::string name_;
  mutable absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> queue_ ABSL_GUARDED_BY(mu_);
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry
