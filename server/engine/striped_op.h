#pragma once
// One direct op on the wire: cut into slices (slice_planner.h) and spread over lanes, the
// endpoints of the routes the op may take, one NIC after the other; each slice goes through
// the peer's fair queue. A slice that fails with a transport error (UNAVAILABLE: its
// connection or NIC broke) pauses its rail in the ledger and is posted again on a lane of a
// route that has not failed this op, or when none is left on a reserve lane (the next
// provider: tcp behind verbs); the op fails only when no such lane is left, or on any other
// error (a refused key is not the wire's fault: another NIC would be refused too).

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/engine/fair_queue.h"
#include "server/engine/rail_ledger.h"
#include "server/engine/slice_planner.h"
#include "server/peers/peer_directory.h"
#include "transport/fabric.h"

namespace ferry::server {

// One endpoint of one route, with what an op needs to post on it.
struct Lane {
  std::shared_ptr<fabric::Endpoint> endpoint;
  Route route;
  const fabric::MemoryRegion* region = nullptr;  // the local buffer's, with route.ours
  fabric::RemoteSlice base;                      // the remote buffer's byte 0, via route.theirs
};

// Names of rails ("tcp", "verbs:mlx5_0"), shared: the ops of a batch mostly name the same.
using RailNames = std::shared_ptr<const std::vector<std::string>>;

// The lanes of the ops planned alike (a batch's ops between the same two buffers), built once
// and shared by them: the primary lanes, then the reserve, and each lane's rails as the
// one-name lists an outcome reports, so that an op carried by one lane builds no strings.
struct LaneSet {
  LaneSet(std::vector<Lane> primary_lanes, std::vector<Lane> reserve_lanes);
  std::vector<Lane> lanes;  // [0, primary) the ops', the rest their reserve
  size_t primary;
  std::vector<RailNames> ours, theirs;  // by lane: its route's rail on each side
};

// How an op went: its status, the rails that carried its bytes on each side (sorted, each
// once; null when none did), and one line per slice that moved to another route.
struct StripedOutcome {
  absl::Status status;
  RailNames ours;
  RailNames theirs;
  std::vector<std::string> retries;
};

// The provider(s) whose rails carried the op's bytes ("tcp" for an op of a verbs plan that
// tcp carried after its NICs failed; "tcp+verbs" when both did), so that its bytes count
// where they went; `planned` when no rail carried any.
std::string CarriedBy(const StripedOutcome& outcome, const std::string& planned);

class StripedOp : public std::enable_shared_from_this<StripedOp> {
 public:
  struct Spec {
    bool read = false;
    uint64_t local_offset = 0;
    uint64_t remote_offset = 0;
    uint64_t length = 0;
    uint64_t slice_bytes = 0;
    std::string peer;
    uint64_t transfer_id = 0;
    // Slice k starts on lane (first_lane + k) % lanes: small ops of a batch take turns on
    // the NICs rather than all starting on the first.
    size_t first_lane = 0;
    // Set: the op gathers these pieces (offsets in the two buffers; `length` bytes in all, at
    // most a slice), one list op on one lane; the offsets above are then unused.
    std::shared_ptr<const std::vector<fabric::Piece>> pieces;
    // The transfer's owner (FairQueue turns); last, so that initializers by position stay
    // as they were.
    int64_t owner_uid = -1;
  };
  using Done = absl::AnyInvocable<void(StripedOutcome) &&>;

  // `lanes` has a primary lane; its reserve lanes only take slices the primary ones failed.
  // They stay valid (regions registered) until `done` ran; `queue` is the peer's; `wanted`
  // as FairQueue::Enqueue's.
  StripedOp(Spec spec, std::shared_ptr<const LaneSet> lanes, std::shared_ptr<RailLedger> ledger,
            std::shared_ptr<FairQueue> queue, Wanted wanted, Done done);

  // The op's slices, for the caller to enqueue on the peer's queue with the rest of its
  // batch (FairQueue::Enqueue): appended to `out`, or returned. Call once, on an op held by
  // a shared_ptr.
  void AppendSlices(std::vector<SliceWork>& out);
  std::vector<SliceWork> Slices();

 private:
  SliceWork Work(const SliceRange& slice, size_t lane);
  void OnSlice(const SliceRange& slice, size_t lane, absl::Status status);
  // A lane of a route that has not failed this op and that the ledger lets us use (the
  // primary lanes after `failed` first, then the reserve ones), or -1.
  int OtherLane(size_t failed) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The rails the settled slices took on each side, by the names the lanes share.
  StripedOutcome OutcomeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Spec spec_;
  const std::shared_ptr<const LaneSet> set_;
  const size_t primary_;             // lanes_[0, primary_) are the op's, the rest its reserve
  const std::vector<Lane>& lanes_;   // set_'s
  // Shared, not borrowed: a slice's completion may run after the engine that owns the
  // ledger is gone (a fabric finishing ops at teardown; ASan saw it).
  const std::shared_ptr<RailLedger> ledger_;
  const std::shared_ptr<FairQueue> queue_;
  const Wanted wanted_;

  absl::Mutex mu_;
  Done done_ ABSL_GUARDED_BY(mu_);
  size_t open_ ABSL_GUARDED_BY(mu_) = 0;  // slices not yet settled
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::set<Route> failed_ ABSL_GUARDED_BY(mu_);
  // The lanes that carried a slice, each once: inline for the one lane of a small op.
  absl::InlinedVector<size_t, 2> carried_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> retries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::server
