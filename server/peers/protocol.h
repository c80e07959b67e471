#pragma once
// Version of the Peer protocol (peer.proto plus the providers' wire formats). Agents refuse
// peers that speak another version rather than misread them.

#include <cstdint>

namespace ferry::server {
// 2: tcp connections open with a hello frame (transport/tcp/wire.h).
// 3: tcp carries gathered writes (kWriteList, tcp wire version 4).
// 4: ResolveBlocks answers may hold strided extents (RemoteExtent.stride), which an agent
//    of version 3 would read as back to back and so move the wrong bytes.
inline constexpr uint32_t kPeerProtocolVersion = 4;
}  // namespace ferry::server
