#pragma once
// `ferryctl peers`, `transfers` and `stats`: the Agent API's operator views as tables.

#include <string>

#include "ferry/v1/agent.pb.h"

namespace ferry::client {

// One line per peer: health, round trip, incarnation, rails, endpoints, how it was found;
// then each unreachable peer's last error.
std::string FormatPeers(const ferry::v1::ListPeersResponse& peers);
// Running transfers, then recent ones: id, state, progress, peers, modes, rails, retries.
std::string FormatTransfers(const ferry::v1::ListTransfersResponse& transfers);
// Totals by peer, direction, mode and provider; op latency by size class.
std::string FormatStats(const ferry::v1::GetStatsResponse& stats);

// "23.8 MiB": counters are rarely round (FormatByteSize prints exact units).
std::string HumanBytes(uint64_t bytes);

}  // namespace ferry::client
