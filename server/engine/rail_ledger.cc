#include "server/engine/rail_ledger.h"

#include <algorithm>

namespace ferry::server {

RailLedger::Entry& RailLedger::EntryFor(const fabric::RailId& rail, const std::string& peer) {
  auto [it, added] = entries_.try_emplace({rail, peer});
  if (added) {
    it->second.counters.rail = rail;
    it->second.counters.peer = peer;
    it->second.backoff = first_backoff_;
  }
  return it->second;
}

bool RailLedger::Usable(const fabric::RailId& rail, const std::string& peer,
                        absl::Time now) const {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find({rail, peer});
  return it == entries_.end() || it->second.counters.paused_until <= now;
}

void RailLedger::Carried(const fabric::RailId& rail, const std::string& peer, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  Entry& e = EntryFor(rail, peer);
  e.counters.bytes += bytes;
  ++e.counters.ops;
  if (e.counters.state != "ok") {
    e.counters.state = "ok";
    e.counters.paused_until = absl::InfinitePast();
    e.backoff = first_backoff_;
  }
}

void RailLedger::Failed(const fabric::RailId& rail, const std::string& peer,
                        const absl::Status& why, bool retried, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Entry& e = EntryFor(rail, peer);
  ++e.counters.errors;
  if (retried) ++e.counters.retries;
  e.counters.last_error = std::string(why.message());
  // The slices in flight when a rail breaks all fail at once: one pause for them, and the
  // back-off grows only when a probe after the pause fails.
  if (e.counters.paused_until > now) return;
  if (e.counters.state == "paused") e.backoff = std::min(e.backoff * 2, max_backoff_);
  e.counters.state = "paused";
  e.counters.paused_until = now + e.backoff;
}

std::vector<RailPeerCounters> RailLedger::Snapshot(absl::Time now) const {
  absl::MutexLock lock(&mu_);
  std::vector<RailPeerCounters> out;
  for (const auto& [key, e] : entries_) {
    RailPeerCounters c = e.counters;
    if (c.state == "paused" && c.paused_until <= now) c.state = "probing";
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace ferry::server
