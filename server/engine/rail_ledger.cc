#include "server/engine/rail_ledger.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

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

void RailLedger::Carried(const fabric::RailId& rail, const std::string& peer, uint64_t bytes,
                         absl::Time now) {
  std::string back;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = EntryFor(rail, peer);
    e.counters.bytes += bytes;
    ++e.counters.ops;
    if (e.counters.state != "ok" && now >= e.counters.paused_until) {
      back = absl::StrCat("rail ", rail.ToString(), " to ", peer, " carries again after ",
                          e.errors_in_run, " error(s) (the first: ", e.counters.root_cause, ")");
      e.counters.state = "ok";
      e.counters.paused_until = absl::InfinitePast();
      e.backoff = first_backoff_;
      e.errors_in_run = 0;
    }
  }
  if (!back.empty()) spdlog::info("{}", back);
}

void RailLedger::Failed(const fabric::RailId& rail, const std::string& peer,
                        const absl::Status& why, bool retried, absl::Time now,
                        const std::string& fallback) {
  // Logged after the lock: a warning per run of failures, not per slice (a broken rail fails
  // every slice in flight at once; a rail that cannot connect fails each probe).
  std::string warning, info;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = EntryFor(rail, peer);
    ++e.counters.errors;
    ++e.errors_in_run;
    if (retried) ++e.counters.retries;
    e.counters.last_error = std::string(why.message());
    const std::string name = absl::StrCat("rail ", rail.ToString(), " to ", peer);
    const bool run_starts = e.counters.state == "ok";
    if (run_starts) {
      e.counters.root_cause = e.counters.last_error;
      e.counters.fallback.clear();
      e.fallback_logged = false;
    }
    const bool fallback_learnt = !fallback.empty() && e.counters.fallback.empty();
    if (!fallback.empty()) e.counters.fallback = fallback;
    const std::string where =
        fallback.empty() ? "" : absl::StrCat("; its slices go to ", fallback);
    // The slices in flight when a rail breaks all fail at once: one pause for them, and the
    // back-off grows only when a probe after the pause fails.
    if (e.counters.paused_until > now) {
      if (fallback_learnt && !e.fallback_logged) {
        e.fallback_logged = true;
        warning = absl::StrCat(name, " (", e.counters.root_cause, ")", where);
      }
    } else {
      if (!run_starts) e.backoff = std::min(e.backoff * 2, max_backoff_);
      e.counters.state = "paused";
      e.counters.pause = e.backoff;
      e.counters.paused_until = now + e.backoff;
      if (run_starts) {
        e.fallback_logged = !fallback.empty();
        warning = absl::StrCat(name, " paused ", absl::FormatDuration(e.backoff), ": ",
                               e.counters.root_cause, where);
      } else {
        info = absl::StrCat(name, " failed again (", e.counters.last_error, "); paused ",
                            absl::FormatDuration(e.backoff));
      }
    }
  }
  if (!warning.empty()) spdlog::warn("{}", warning);
  if (!info.empty()) spdlog::info("{}", info);
}

void RailLedger::FellBack(const fabric::RailId& rail, const std::string& peer,
                          const std::string& fallback) {
  std::string warning;
  {
    absl::MutexLock lock(&mu_);
    Entry& e = EntryFor(rail, peer);
    e.counters.fallback = fallback;
    if (!e.fallback_logged && e.counters.state != "ok") {
      e.fallback_logged = true;
      warning = absl::StrCat("rail ", rail.ToString(), " to ", peer, " (", e.counters.root_cause,
                             "); its slices go to ", fallback);
    }
  }
  if (!warning.empty()) spdlog::warn("{}", warning);
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
