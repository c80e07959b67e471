#pragma once
// Which routes (our rail -> the peer's rail) an op takes. Pure functions of the rails both
// sides run, where the op's memory is registered, and the ledger's pauses.

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "server/buffers/buffer_registry.h"
#include "server/engine/rail_ledger.h"
#include "server/peers/peer_directory.h"

namespace ferry::server {

// Pairs each of `ours` with one of `theirs`: the rail on the NIC of the same name when the
// peer has it (NIC i with the peer's NIC i, as NCCL pairs rails, so the far GPU also keeps to
// its root complex), else the peer's rail at the same position (modulo their count). One
// route per rail of ours; none when either list is empty.
std::vector<Route> PairRails(const std::vector<fabric::RailId>& ours,
                             const std::vector<fabric::RailId>& theirs);

struct RouteChoice {
  std::string provider;       // "" when no provider reaches both buffers
  std::vector<Route> routes;  // the ones to stripe over
  bool probing = false;       // every route was paused: they are used anyway, as probes
  // The next provider's usable routes (tcp behind verbs): where slices go when every one of
  // `routes` failed them. Empty when there is none.
  std::string reserve_provider;
  std::vector<Route> reserve;
};

// For a direct op: of the providers of `rails` (preference order) whose healthy rails of
// ours hold `local` and whose rails of the peer hold a key of `remote`, the first with a
// pair the ledger lets us use for `peer` now (a provider whose NICs are all paused yields
// to the next: when no RDMA NIC is left, tcp carries the op), and the next such provider's
// as the reserve; when every provider's pairs are paused, the first's, all of them (a probe
// beats failing the op).
RouteChoice DirectRoutes(const Buffer& local, const RemoteBuffer& remote, const PeerRails& rails,
                         const RailLedger& ledger, absl::Time now);

// For a staged op (bounce chunks are registered with every rail): of `provider`'s healthy
// rails, `candidates` when given (the local buffer's, when our side is direct), the one on
// `our_nic` (the NIC the plan chose for the memory) when present, else the first; paired
// with the peer's rail on `their_nic` (the NIC it named for the buffer) when it offers it,
// else as PairRails pairs. nullopt when there is no rail on either side.
std::optional<Route> StagedRoute(const ProviderRails& provider,
                                 const std::vector<fabric::RailId>& candidates,
                                 const std::string& our_nic, const std::string& their_nic);

}  // namespace ferry::server
