#include "server/engine/fair_queue.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/time/clock.h"

namespace ferry::server {

void FairQueue::Enqueue(uint64_t id, std::vector<SliceWork> slices, Wanted wanted,
                        int64_t owner) {
  if (slices.empty()) return;
  {
    absl::MutexLock lock(&mu_);
    auto [it, fresh] = pending_.try_emplace(id);
    if (fresh) {
      if (pending_.size() > 1 || in_flight_ > 0) shared_until_ = absl::Now() + shared_hold_;
      it->second.wanted = std::move(wanted);
      it->second.owner = owner;
      std::list<uint64_t>& turns = turns_[owner];
      if (turns.empty()) owner_turns_.push_back(owner);
      turns.push_back(id);
    }
    queued_ += slices.size();
    for (auto& s : slices) it->second.slices.push_back(std::move(s));
    if (!ClaimPumpLocked()) return;
  }
  Pump();
}

bool FairQueue::ClaimPumpLocked() {
  if (pumping_) {
    again_ = true;  // the pumping thread takes another look before it stops
    return false;
  }
  pumping_ = true;
  return true;
}

uint64_t FairQueue::WindowLocked() const {
  if (pending_.size() > 1 || solo_window_bytes_ == window_bytes_) return window_bytes_;
  return absl::Now() < shared_until_ ? window_bytes_ : solo_window_bytes_;
}

void FairQueue::Pump() {
  // Taken out of the queue a few at a time: a window of 4 KiB slices is 4096 of them, and
  // one vector that large per pump was allocated, grown and faulted in every time.
  constexpr size_t kBatch = 64;
  std::vector<std::pair<SliceWork, Wanted>> batch;
  batch.reserve(kBatch);
  while (true) {
    batch.clear();
    {
      absl::MutexLock lock(&mu_);
      // One slice per owner per turn, from its transfers in turn, while the next one fits
      // in the window (and always one, so a slice larger than the window still goes). The
      // window is read once a pass (it reads the clock): a line that shrinks to one
      // transfer meanwhile keeps the shared window until the next pass.
      const uint64_t window = owner_turns_.empty() ? window_bytes_ : WindowLocked();
      while (!owner_turns_.empty() && batch.size() < kBatch) {
        const int64_t owner = owner_turns_.front();
        std::list<uint64_t>& turns = turns_.at(owner);
        uint64_t id = turns.front();
        Pending& p = pending_.at(id);
        const uint64_t next = p.slices.front().local.length;
        if (in_flight_ > 0 && in_flight_ + next > window) break;
        SliceWork work = std::move(p.slices.front());
        p.slices.pop_front();
        --queued_;
        in_flight_ += work.local.length;
        batch.emplace_back(std::move(work), p.wanted);
        if (p.slices.empty()) {
          pending_.erase(id);
          turns.pop_front();
        } else {
          turns.splice(turns.end(), turns, turns.begin());  // last in its owner's line
        }
        if (turns.empty()) {
          turns_.erase(owner);
          owner_turns_.pop_front();
        } else {
          owner_turns_.splice(owner_turns_.end(), owner_turns_, owner_turns_.begin());
        }
      }
      if (batch.empty()) {
        if (!again_) {
          pumping_ = false;
          return;
        }
      }
      again_ = false;
    }
    // `wanted` once per transfer per pass (a transfer's slices mostly follow each other
    // here): each answer takes the transfer's lock.
    const std::function<bool()>* asked = nullptr;
    bool answer = true;
    for (auto& [work, wanted] : batch) {
      const std::function<bool()>* f = wanted && *wanted ? wanted.get() : nullptr;
      if (f != asked) {
        asked = f;
        answer = f == nullptr || (*f)();
      }
      Post(std::move(work), answer);
    }
  }
}

void FairQueue::Post(SliceWork work, bool wanted) {
  const uint64_t bytes = work.local.length;
  if (!wanted) {
    Release(bytes);
    std::move(work.done)(absl::CancelledError("the transfer ended before this slice was posted"));
    return;
  }
  // Held by the posted completion and here: a post refused now never runs its completion.
  // One allocation, and a completion small enough to be held in place (a shared_ptr).
  struct Posted {
    std::shared_ptr<FairQueue> queue;
    uint64_t bytes;
    fabric::Completion done;
  };
  auto held = std::make_shared<Posted>(Posted{shared_from_this(), bytes, std::move(work.done)});
  fabric::Completion on_done = [held](absl::Status s) {
    held->queue->Release(held->bytes);
    std::move(held->done)(std::move(s));
  };
  fabric::Endpoint& to = *work.endpoint;
  absl::Status posted;
  if (work.pieces) {
    posted = work.read ? to.PostReadList(work.local.region, work.remote, *work.pieces,
                                         std::move(on_done))
                       : to.PostWriteList(work.local.region, work.remote, *work.pieces,
                                          std::move(on_done));
  } else {
    posted = work.read ? to.PostRead(work.local, work.remote, std::move(on_done))
                       : to.PostWrite(work.local, work.remote, std::move(on_done));
  }
  if (!posted.ok()) {
    Release(bytes);
    std::move(held->done)(std::move(posted));
  }
}

void FairQueue::Release(uint64_t bytes) {
  {
    absl::MutexLock lock(&mu_);
    in_flight_ -= bytes;
    // Nothing waits for the room: no pump (a completion takes the queue's lock once).
    if (owner_turns_.empty() || !ClaimPumpLocked()) return;
  }
  Pump();
}

uint64_t FairQueue::in_flight_bytes() const {
  absl::MutexLock lock(&mu_);
  return in_flight_;
}

size_t FairQueue::queued() const {
  absl::MutexLock lock(&mu_);
  return queued_;
}

}  // namespace ferry::server
