#include "base/worker_pool.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

namespace ferry {

WorkerPool::WorkerPool(size_t threads, std::string name, size_t per_lane)
    : max_threads_(threads == 0 ? 1 : threads),
      name_(std::move(name)),
      per_lane_(per_lane == 0 ? max_threads_ : std::min(per_lane, max_threads_)) {}

WorkerPool::~WorkerPool() {
  std::vector<std::thread*> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // from now on no thread starts: threads_ stays as it is
    for (std::thread& t : threads_) threads.push_back(&t);
  }
  for (std::thread* t : threads) t->join();
}

void WorkerPool::Run(absl::AnyInvocable<void() &&> work) { Run(std::string(), std::move(work)); }

void WorkerPool::Run(const std::string& name, absl::AnyInvocable<void() &&> work) {
  absl::MutexLock lock(&mu_);
  Lane& lane = lanes_[name];
  lane.queue.push_back(std::move(work));
  MarkReadyLocked(name, lane);
  // While stopping, the threads there are run it before they end (work queued then comes
  // from work running on them).
  if (stopping_ || RunnableLocked() <= idle_ || threads_.size() >= max_threads_) return;
  // More work may start than threads are free to take it: one more thread, up to the limit.
  // Counted idle until it takes its first work, so a burst of Runs starts one thread per
  // piece of work waiting, not more.
  ++idle_;
  threads_.emplace_back([this] { Loop(); });
  pthread_setname_np(threads_.back().native_handle(), name_.substr(0, 15).c_str());
}

void WorkerPool::MarkReadyLocked(const std::string& name, Lane& lane) {
  if (lane.ready || lane.queue.empty() || lane.running >= CapOf(name)) return;
  lane.ready = true;
  ready_.push_back(name);
}

size_t WorkerPool::RunnableLocked() const {
  size_t n = 0;
  for (const std::string& name : ready_) {
    const Lane& lane = lanes_.at(name);
    n += std::min(lane.queue.size(), CapOf(name) - lane.running);
  }
  return n;
}

size_t WorkerPool::threads() const {
  absl::MutexLock lock(&mu_);
  return threads_.size();
}

void WorkerPool::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !ready_.empty() || stopping_;
    };
    mu_.Await(absl::Condition(&ready));
    // Stopping with nothing that may start: work still queued behind a full lane is run by
    // the threads running that lane, which come back here when theirs is done.
    if (ready_.empty()) return;
    const std::string name = std::move(ready_.front());
    ready_.pop_front();
    Lane& lane = lanes_.at(name);
    lane.ready = false;
    absl::AnyInvocable<void() &&> work = std::move(lane.queue.front());
    lane.queue.pop_front();
    ++lane.running;
    MarkReadyLocked(name, lane);  // room for the next of the lane on another thread
    --idle_;
    mu_.Unlock();
    std::move(work)();
    mu_.Lock();
    ++idle_;
    Lane& after = lanes_.at(name);
    --after.running;
    MarkReadyLocked(name, after);
    if (after.queue.empty() && after.running == 0) lanes_.erase(name);
  }
}

}  // namespace ferry
