#pragma once
// The slices waiting for the wire to one peer. At most `window_bytes` are posted and not yet
// complete; transfers take turns slice by slice, so a small op never queues behind a huge
// batch and a cancelled transfer stops at its posted slices. One per peer, shared by every
// transfer to it.
//
// Turns go to owners (local uids) first, then to each owner's transfers: a client with a
// thousand transfers waiting gets one slice a round, as a client with one does, so that
// hoarding transfers buys no share of the wire from the node's other users.
//
// One transfer that has had the peer to itself for `shared_hold` may keep
// `solo_window_bytes` (larger) on the wire: its slices wait for their acks a round trip
// each, and with one window of them in flight that round trip, not the copies, sets a large
// transfer's rate. A transfer that starts while another one has slices waiting or on the
// wire makes the peer shared for `shared_hold`, so a stream of small ops beside a batch keeps
// the batch at `window_bytes` (a fuller wire keeps the CPUs busier, and the small ops wait
// for them: p99 2 x on a 2-core loopback). A newcomer to a solo transfer waits for the
// excess to drain before its first slice goes.
//
// Threads: Enqueue from any thread; slices are posted by whichever thread pumps the queue
// (the enqueuer, or the one completing a slice), never with the queue's lock held, and at
// most one thread pumps at a time, so a completion that runs inside a post (a broken
// connection) does not recurse.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/fabric.h"

namespace ferry::server {

// One slice of a direct op, ready to post.
struct SliceWork {
  std::shared_ptr<fabric::Endpoint> endpoint;
  bool read = false;  // PostRead into `local`, else PostWrite from it
  fabric::LocalSlice local;  // with `pieces`: the region, and the pieces' bytes as length
  fabric::RemoteSlice remote;  // with `pieces`: the remote region's byte 0
  fabric::Completion done;  // runs exactly once: the slice's outcome, or CANCELLED unposted
  // Set: a gathered slice (the scattered blocks of a batch), posted as one list op.
  std::shared_ptr<const std::vector<fabric::Piece>> pieces;
};

// Asked before a transfer's slices are posted (once for those a pump takes together):
// false (the transfer ended) skips them. Null: always wanted. Shared, so that the ops of a
// batch and the queue hold one, not a copy each (a std::function holding a shared_ptr
// allocates on every copy).
using Wanted = std::shared_ptr<const std::function<bool()>>;
inline Wanted MakeWanted(std::function<bool()> wanted) {
  return std::make_shared<const std::function<bool()>>(std::move(wanted));
}

struct FairQueueWindows {
  uint64_t window_bytes = 16 << 20;
  uint64_t solo_window_bytes = 64 << 20;  // below window_bytes: window_bytes
  absl::Duration shared_hold = absl::Milliseconds(50);
};

class FairQueue : public std::enable_shared_from_this<FairQueue> {
 public:
  explicit FairQueue(FairQueueWindows windows)
      : window_bytes_(windows.window_bytes),
        solo_window_bytes_(std::max(windows.solo_window_bytes, windows.window_bytes)),
        shared_hold_(windows.shared_hold) {}
  // One window, alone or not.
  explicit FairQueue(uint64_t window_bytes)
      : FairQueue(FairQueueWindows{.window_bytes = window_bytes, .solo_window_bytes = 0}) {}

  // Queues the slices of transfer `id` (in order) and posts what the window allows.
  // `wanted` is asked before they are posted: false (the transfer ended) skips the slices
  // not yet posted, whose completions then run with CANCELLED. `owner`: whose turn the
  // transfer's slices take (its uid; -1 for transfers of no known uid, which share one); a
  // transfer already waiting keeps the owner it came with.
  void Enqueue(uint64_t id, std::vector<SliceWork> slices, Wanted wanted, int64_t owner = -1);

  uint64_t window_bytes() const { return window_bytes_; }
  uint64_t in_flight_bytes() const;
  size_t queued() const;

 private:
  struct Pending {
    std::deque<SliceWork> slices;
    Wanted wanted;
    int64_t owner = -1;
  };
  // True when the caller is now the one thread that pumps, and must call Pump.
  bool ClaimPumpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The window now: solo while one transfer has slices waiting and none other has started
  // since shared_until_.
  uint64_t WindowLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Pump();
  // Posts `work`, or completes it CANCELLED when its transfer no longer wants it.
  void Post(SliceWork work, bool wanted);
  void Release(uint64_t bytes);

  const uint64_t window_bytes_;
  const uint64_t solo_window_bytes_;
  const absl::Duration shared_hold_;
  mutable absl::Mutex mu_;
  uint64_t in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time shared_until_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  absl::flat_hash_map<uint64_t, Pending> pending_ ABSL_GUARDED_BY(mu_);
  // Owners with slices waiting, next first; and each one's transfers with slices, next first.
  std::list<int64_t> owner_turns_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, std::list<uint64_t>> turns_ ABSL_GUARDED_BY(mu_);
  size_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  bool pumping_ ABSL_GUARDED_BY(mu_) = false;
  bool again_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ferry::server
