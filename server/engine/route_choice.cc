#include "server/engine/route_choice.h"

#include <algorithm>

namespace ferry::server {
namespace {

bool Has(const std::vector<fabric::RailId>& rails, const fabric::RailId& rail) {
  return std::find(rails.begin(), rails.end(), rail) != rails.end();
}

fabric::RailId PairOf(const fabric::RailId& ours, size_t position,
                      const std::vector<fabric::RailId>& theirs) {
  for (const fabric::RailId& t : theirs) {
    if (t.nic == ours.nic) return t;
  }
  return theirs[position % theirs.size()];
}

}  // namespace

std::vector<Route> PairRails(const std::vector<fabric::RailId>& ours,
                             const std::vector<fabric::RailId>& theirs) {
  std::vector<Route> out;
  if (theirs.empty()) return out;
  for (size_t i = 0; i < ours.size(); ++i) out.push_back({ours[i], PairOf(ours[i], i, theirs)});
  return out;
}

RouteChoice DirectRoutes(const Buffer& local, const RemoteBuffer& remote, const PeerRails& rails,
                         const RailLedger& ledger, absl::Time now) {
  // Per provider that reaches both buffers: every pair, and those usable now.
  struct Candidate {
    std::string provider;
    std::vector<Route> all, usable;
  };
  std::vector<Candidate> candidates;
  for (const ProviderRails& p : rails.providers) {
    std::vector<fabric::RailId> ours, theirs;
    for (const fabric::RailId& r : p.ours) {
      if (local.region(r) != nullptr) ours.push_back(r);
    }
    for (const fabric::RailId& r : p.theirs) {
      if (remote.KeyFor(r) != nullptr) theirs.push_back(r);
    }
    Candidate c{p.provider, PairRails(ours, theirs), {}};
    if (c.all.empty()) continue;
    for (const Route& route : c.all) {
      if (ledger.Usable(route.ours, remote.node, now)) c.usable.push_back(route);
    }
    candidates.push_back(std::move(c));
  }
  RouteChoice choice;
  for (size_t i = 0; i < candidates.size(); ++i) {
    if (candidates[i].usable.empty()) continue;
    choice.provider = candidates[i].provider;
    choice.routes = candidates[i].usable;
    for (size_t j = i + 1; j < candidates.size(); ++j) {
      if (candidates[j].usable.empty()) continue;
      choice.reserve_provider = candidates[j].provider;
      choice.reserve = candidates[j].usable;
      break;
    }
    return choice;
  }
  if (!candidates.empty()) {
    choice.provider = candidates[0].provider;
    choice.routes = candidates[0].all;
    choice.probing = true;
  }
  return choice;
}

std::optional<Route> StagedRoute(const ProviderRails& provider,
                                 const std::vector<fabric::RailId>& candidates,
                                 const std::string& our_nic, const std::string& their_nic) {
  std::vector<fabric::RailId> ours;
  for (const fabric::RailId& r : provider.ours) {
    if (candidates.empty() || Has(candidates, r)) ours.push_back(r);
  }
  if (ours.empty() || provider.theirs.empty()) return std::nullopt;
  size_t pick = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    if (ours[i].nic == our_nic) pick = i;
  }
  for (const fabric::RailId& t : provider.theirs) {
    if (!their_nic.empty() && t.nic == their_nic) return Route{ours[pick], t};
  }
  return Route{ours[pick], PairOf(ours[pick], pick, provider.theirs)};
}

}  // namespace ferry::server
