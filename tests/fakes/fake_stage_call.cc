#include "tests/fakes/fake_stage_call.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ferry::fake {

FakeStageCall::FakeStageCall(server::StageCallSpec spec, server::StageEvents* events,
                             std::shared_ptr<server::StagingPool> pool, fabric::RailId rail,
                             char* memory, uint64_t size, bool hold)
    : spec_(std::move(spec)), events_(events), pool_(std::move(pool)), rail_(std::move(rail)),
      memory_(memory), size_(size), hold_(hold) {
  thread_ = std::thread([this] { Loop(); });
}

FakeStageCall::~FakeStageCall() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void FakeStageCall::Loop() {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return stopping_ || (!hold_ && !tasks_.empty());
    };
    mu_.Await(absl::Condition(&ready));
    if (stopping_) return;
    Task task = std::move(tasks_.front());
    tasks_.pop_front();
    busy_ = true;
    // Tasks call back into the sender: never with our lock held.
    mu_.Unlock();
    std::move(task)();
    mu_.Lock();
    busy_ = false;
  }
}

void FakeStageCall::Push(Task task) { tasks_.push_back(std::move(task)); }

void FakeStageCall::Violation(std::string what) {
  violations_.push_back(absl::StrCat("Stage ", spec_.buffer, spec_.read ? " (read): " : ": ",
                                     std::move(what)));
}

void FakeStageCall::EndLocked(absl::Status why) {
  if (!ended_) verdict_ = std::move(why);
  ended_ = true;
  hold_ = false;  // what is queued runs now, and finds the call ended
  granted_.clear();
}

absl::Status FakeStageCall::Open() {
  absl::MutexLock lock(&mu_);
  if (opened_) Violation("opened twice");
  opened_ = true;
  return ended_ ? verdict_ : absl::OkStatus();
}

void FakeStageCall::Cancel() {
  absl::MutexLock lock(&mu_);
  if (ended_) return;
  // As the gRPC client: the cancelled stream ends its reader, which says so (UNAVAILABLE).
  FailLocked(absl::UnavailableError(absl::StrCat("Stage on ", spec_.node, ": cancelled")));
}

absl::StatusOr<server::StageGrant> FakeStageCall::GrantLocked(uint64_t length, uint64_t token) {
  server::ChunkLease lease = pool_->Acquire(absl::Now());
  if (!lease) return absl::ResourceExhaustedError("fake Stage peer: its bounce pool is empty");
  const fabric::MemoryRegion* region = lease.region(rail_);
  const uint64_t id = next_grant_++;
  server::StageGrant g{id, region->remote_address(), region->key(), length, token};
  granted_[id].lease = std::move(lease);
  peak_ = std::max(peak_, granted_.size() + fetching_);
  return g;
}

absl::StatusOr<server::StageGrant> FakeStageCall::TakeGrant(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (spec_.read) {
    Violation("TakeGrant on a READ call");
    return absl::InvalidArgumentError("TakeGrant on a READ call");
  }
  if (!opened_) Violation("TakeGrant before Open");
  // A credit comes back when the copy of the chunk that held it is done.
  auto credit = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return ended_ || granted_.size() < spec_.depth;
  };
  if (!mu_.AwaitWithDeadline(absl::Condition(&credit), deadline)) {
    return absl::DeadlineExceededError("fake Stage peer: no credit before the deadline");
  }
  if (ended_) return verdict_.ok() ? absl::UnavailableError("Stage: call ended") : verdict_;
  if (grants_left_ == 0) return grant_failure_;
  if (grants_left_ > 0) --grants_left_;
  return GrantLocked(pool_->chunk_bytes(), 0);
}

bool FakeStageCall::Report(uint64_t grant, uint64_t offset, uint64_t length, uint64_t token) {
  absl::MutexLock lock(&mu_);
  if (ended_) return false;
  if (spec_.read) {
    Violation("Report on a READ call");
    return false;
  }
  auto it = granted_.find(grant);
  if (it == granted_.end() || it->second.reported) {
    Violation(absl::StrCat("report of grant ", grant,
                           it == granted_.end() ? ", which is not granted" : " twice"));
    return false;
  }
  if (length == 0 || length > pool_->chunk_bytes() || offset > size_ || length > size_ - offset) {
    Violation(absl::StrCat("report of [", offset, ", +", length, ") outside the buffer (", size_,
                           " bytes) or a chunk"));
    return false;
  }
  it->second.reported = true;
  Push([this, grant, offset, length, token] {
    {
      absl::MutexLock lock(&mu_);
      if (ended_) return;  // the chunk went back with the call; no copy, no report
      auto g = granted_.find(grant);
      std::memcpy(memory_ + offset, g->second.lease.data(), length);
      granted_.erase(g);  // the credit is the sender's again
      ++copies_;
    }
    events_->OnCopied(token, length);
  });
  return true;
}

void FakeStageCall::Fetch(uint64_t offset, uint64_t length, Ready ready) {
  absl::MutexLock lock(&mu_);
  absl::Status refused;
  if (!spec_.read) {
    Violation("Fetch on a WRITE call");
    refused = absl::InvalidArgumentError("Fetch on a WRITE call");
  } else if (length == 0 || length > pool_->chunk_bytes() || offset > size_ ||
             length > size_ - offset) {
    Violation(absl::StrCat("fetch of [", offset, ", +", length, ") outside the buffer (", size_,
                           " bytes) or a chunk"));
    refused = absl::OutOfRangeError("fetch outside the buffer");
  }
  if (!refused.ok()) {
    Push([ready = std::move(ready), refused]() mutable { std::move(ready)(refused); });
    return;
  }
  ++fetching_;
  peak_ = std::max(peak_, granted_.size() + fetching_);
  Push([this, offset, length, ready = std::move(ready)]() mutable {
    absl::StatusOr<server::StageGrant> grant;
    {
      absl::MutexLock lock(&mu_);
      --fetching_;
      if (ended_) {
        grant = verdict_.ok() ? absl::UnavailableError("Stage: call ended") : verdict_;
      } else {
        grant = GrantLocked(length, 0);
        if (grant.ok()) {
          std::memcpy(granted_[grant->grant].lease.data(), memory_ + offset, length);
          ++copies_;
        }
      }
    }
    std::move(ready)(std::move(grant));
  });
}

void FakeStageCall::Release(uint64_t grant) {
  absl::MutexLock lock(&mu_);
  if (ended_) return;  // everything went back when the call ended
  if (granted_.erase(grant) == 0) Violation(absl::StrCat("release of grant ", grant));
}

absl::Status FakeStageCall::Close(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (!opened_) Violation("Close before Open");
  // The peer's verdict comes once every copy it was asked for is done.
  auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return ended_ || (tasks_.empty() && !busy_);
  };
  mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
  EndLocked(absl::OkStatus());
  return verdict_;
}

void FakeStageCall::FailGrantsAfter(int n, absl::Status why) {
  absl::MutexLock lock(&mu_);
  grants_left_ = n;
  grant_failure_ = std::move(why);
}

void FakeStageCall::ReleaseCopies() {
  absl::MutexLock lock(&mu_);
  hold_ = false;
}

void FakeStageCall::Fail(absl::Status why) {
  absl::MutexLock lock(&mu_);
  FailLocked(std::move(why));
}

void FakeStageCall::FailLocked(absl::Status why) {
  EndLocked(why);
  tasks_.push_front([this, why] { events_->OnCallFailed(this, why); });
}

bool FakeStageCall::AwaitHeld(size_t n, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto held = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return tasks_.size() >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&held), timeout);
}

size_t FakeStageCall::outstanding_grants() const {
  absl::MutexLock lock(&mu_);
  return granted_.size() + fetching_;
}

size_t FakeStageCall::peak_grants() const {
  absl::MutexLock lock(&mu_);
  return peak_;
}

uint64_t FakeStageCall::copies() const {
  absl::MutexLock lock(&mu_);
  return copies_;
}

bool FakeStageCall::ended() const {
  absl::MutexLock lock(&mu_);
  return ended_;
}

std::vector<std::string> FakeStageCall::violations() const {
  absl::MutexLock lock(&mu_);
  return violations_;
}

}  // namespace ferry::fake
