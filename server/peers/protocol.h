#pragma once
// Version of the Peer protocol (peer.proto plus the providers' wire formats). Agents refuse
// peers that speak another version rather than misread them.

#include <cstdint>

namespace ferry::server {
// 2: tcp connections open with a hello frame (transport/tcp/wire.h).
inline constexpr uint32_t kPeerProtocolVersion = 2;
}  // namespace ferry::server
