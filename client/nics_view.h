#pragma once
// `ferryctl nics` and the NIC lines of `ferryctl info`: the agent's rails (GetInfo.nics) as a
// table an operator reads at a glance: health, what memory each NIC carries, what peers
// moved through it, and what it carried to each peer (paused rails with their last error).

#include <string>

#include "ferry/v1/agent.pb.h"

namespace ferry::client {

// One line per rail and peer, with a header; then each paused rail's last error.
std::string FormatNics(const google::protobuf::RepeatedPtrField<ferry::v1::NicInfo>& nics);

// One line per rail: "tcp:mlx5_0 ok, numa 0, carries cuda:0 host, sent 64 MiB".
std::string FormatNicSummary(const ferry::v1::NicInfo& nic);

}  // namespace ferry::client
