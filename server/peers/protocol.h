#pragma once
// Version of the Peer protocol (peer.proto plus the providers' wire formats). Agents refuse
// peers that speak another version rather than misread them.

#include <cstdint>

namespace ferry::server {
inline constexpr uint32_t kPeerProtocolVersion = 1;
}  // namespace ferry::server
