#pragma once
// A few threads that run queued work in the order it came: for work that may block (a call
// to a peer) handed off by threads that must not block (gRPC's callback reactions).
//
// Work may name a lane (the peer it may block on): at most `per_lane` works of one lane run
// at once, and the rest of that lane wait in it without holding a thread, so work for a
// peer whose calls hang (a stopped node) holds at most that many threads and never holds up
// another lane's. Work of one lane starts in the order it came.

#include <cstddef>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/node_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace ferry {

class WorkerPool {
 public:
  // At most `threads` threads, named `name` (15 characters at most show), started as work
  // comes and no thread is idle: a pool never used holds none. `per_lane`: at most this many
  // works of one lane at once (0: `threads`).
  WorkerPool(size_t threads, std::string name, size_t per_lane = 0);
  // Runs the work still queued, then joins the threads.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `work` (in lane "", which may use every thread). Work queued while the pool is
  // being destroyed still runs.
  void Run(absl::AnyInvocable<void() &&> work);
  // Queues `work` in `lane`.
  void Run(const std::string& lane, absl::AnyInvocable<void() &&> work);
  // Threads started so far (tests).
  size_t threads() const;

 private:
  struct Lane {
    std::deque<absl::AnyInvocable<void() &&>> queue;
    size_t running = 0;
    bool ready = false;  // in ready_
  };
  size_t CapOf(const std::string& lane) const { return lane.empty() ? max_threads_ : per_lane_; }
  // Puts `lane` in ready_ when it has work waiting and room to run it.
  void MarkReadyLocked(const std::string& name, Lane& lane) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Works that could start now.
  size_t RunnableLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Loop();

  const size_t max_threads_;
  const std::string name_;
  const size_t per_lane_;
  mutable absl::Mutex mu_;
  // Node map: a lane found before running its work is found again after.
  absl::node_hash_map<std::string, Lane> lanes_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> ready_ ABSL_GUARDED_BY(mu_);  // lanes whose next work may start
  size_t idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry
