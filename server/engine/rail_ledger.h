#pragma once
// What each of our rails carried to each peer, and whether it may carry more: a rail whose
// slice failed with a transport error is paused (its slices go to the other rails), with
// back-off that doubles while probes keep failing. After the pause the next use is a probe:
// the route reconnects, and only a slice that succeeds makes it healthy again.
//
// Keyed by (our rail, peer): a NIC whose cable to one peer's switch is cut still carries the
// others'. Thread-safe; cheap enough to call once per slice.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/rail_id.h"

namespace ferry::server {

struct RailPeerCounters {
  fabric::RailId rail;
  std::string peer;
  uint64_t bytes = 0;
  uint64_t ops = 0;
  uint64_t errors = 0;
  uint64_t retries = 0;
  // "ok", "paused" (until `paused_until`) or "probing" (the pause is over, no success yet).
  std::string state = "ok";
  absl::Time paused_until = absl::InfinitePast();
  // The pause it is in or was last in: it doubles with each failed probe.
  absl::Duration pause = absl::ZeroDuration();
  std::string last_error;
  // The error that began the current (or last) run of failures: what broke the rail. The
  // ones after it are mostly its consequences (the slices in flight, the probes).
  std::string root_cause;
  // The route that took its slices over in that run ("tcp->tcp"); "" when none did.
  std::string fallback;
};

class RailLedger {
 public:
  // The first pause; each failed probe doubles it, up to `max_backoff`.
  explicit RailLedger(absl::Duration first_backoff = absl::Seconds(1),
                      absl::Duration max_backoff = absl::Seconds(30))
      : first_backoff_(first_backoff), max_backoff_(max_backoff) {}

  // False while `rail` is paused for `peer` (a probe is allowed once the pause is over).
  bool Usable(const fabric::RailId& rail, const std::string& peer, absl::Time now) const;
  // A slice of `bytes` went through: counted, and a paused or probing rail is healthy again.
  // A slice that succeeds while the rail is paused (`now` before the pause's end: one that
  // was on its way when the rail broke, as when a device is removed) is counted but ends no
  // run: it says nothing about the rail now, and ending the run there made the next
  // failure of the same cause warn again (make test-rdma's rdma link delete).
  void Carried(const fabric::RailId& rail, const std::string& peer, uint64_t bytes,
               absl::Time now = absl::Now());
  // A slice failed on `rail` with a transport error (or its connection could not be made):
  // counted and the rail paused. `retried` when another route took the slice over, and
  // `fallback` names that route when known. The first failure of a run is logged as a
  // warning with its cause and where the slices go (again once if that is learnt later);
  // failed probes after it only at info, and a rail that carries again says so.
  void Failed(const fabric::RailId& rail, const std::string& peer, const absl::Status& why,
              bool retried, absl::Time now, const std::string& fallback = "");

  // The slices `rail` could not take to `peer` (it failed to connect) went to `fallback`:
  // recorded, and said once in the run's warnings as Failed with a fallback would.
  void FellBack(const fabric::RailId& rail, const std::string& peer, const std::string& fallback);

  // Every (rail, peer) seen, with `state` as of `now`.
  std::vector<RailPeerCounters> Snapshot(absl::Time now) const;

 private:
  struct Entry {
    RailPeerCounters counters;
    absl::Duration backoff;        // the next pause
    bool fallback_logged = false;  // the run's warning named where its slices go
    uint64_t errors_in_run = 0;
  };
  Entry& EntryFor(const fabric::RailId& rail, const std::string& peer)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration first_backoff_;
  const absl::Duration max_backoff_;
  mutable absl::Mutex mu_;
  std::map<std::pair<fabric::RailId, std::string>, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::server
