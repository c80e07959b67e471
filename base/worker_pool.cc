#include "base/worker_pool.h"

#include <pthread.h>

#include <utility>

namespace ferry {

WorkerPool::WorkerPool(size_t threads, std::string name)
    : max_threads_(threads == 0 ? 1 : threads), name_(std::move(name)) {}

WorkerPool::~WorkerPool() {
  std::vector<std::thread*> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;  // from now on no thread starts: threads_ stays as it is
    for (std::thread& t : threads_) threads.push_back(&t);
  }
  for (std::thread* t : threads) t->join();
}

void WorkerPool::Run(absl::AnyInvocable<void() &&> work) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(work));
  // While stopping, the threads there are run it before they end (work queued then comes
  // from work running on them).
  if (stopping_ || queue_.size() <= idle_ || threads_.size() >= max_threads_) return;
  // More work waits than threads are free to take it: one more thread, up to the limit.
  // Counted idle until it takes its first work, so a burst of Runs starts one thread per
  // piece of work waiting, not more.
  ++idle_;
  threads_.emplace_back([this] { Loop(); });
  pthread_setname_np(threads_.back().native_handle(), name_.substr(0, 15).c_str());
}

size_t WorkerPool::threads() const {
  absl::MutexLock lock(&mu_);
  return threads_.size();
}

void WorkerPool::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !queue_.empty() || stopping_;
    };
    mu_.Await(absl::Condition(&ready));
    if (queue_.empty()) return;  // stopping, and nothing left to run
    absl::AnyInvocable<void() &&> work = std::move(queue_.front());
    queue_.pop_front();
    --idle_;
    mu_.Unlock();
    std::move(work)();
    mu_.Lock();
    ++idle_;
  }
}

}  // namespace ferry
