#pragma once
// A buffer on a peer as its agent's ResolveBuffer answered: where it is and the keys that
// let each of the peer's fabrics reach it.

#include <cstdint>
#include <string>
#include <vector>

#include "server/policy/leg_mode.h"
#include "transport/fabric.h"

namespace ferry::server {

// How one of the peer's fabrics reaches byte 0 of a buffer.
struct RemoteKey {
  fabric::RailId rail;  // the peer's rail
  fabric::RemoteSlice slice;
};

// A buffer on a peer, as its agent exported it.
struct RemoteBuffer {
  std::string node;
  std::string name;
  uint64_t size = 0;
  std::string device;
  // Byte 0 of the buffer, per peer fabric that can reach it directly.
  std::vector<RemoteKey> keys;
  uint64_t incarnation = 0;
  // How the peer takes writes into it (staged: through the Stage call), and why; the NIC
  // and path class on the peer's side. A mode word this agent does not know is kUnavailable.
  LegMode mode = LegMode::kHost;
  std::string reason;
  std::string nic;
  std::string path;
  std::string backend;
  // The peer revokes this answer before it goes stale (ResolveBufferResponse.revocable), so
  // it may be kept (server/peers/resolve_cache.h).
  bool revocable = false;

  // The key of the peer's first fabric of `provider`, or nullptr.
  const fabric::RemoteSlice* KeyFor(const std::string& provider) const {
    for (const auto& k : keys) {
      if (k.rail.provider == provider) return &k.slice;
    }
    return nullptr;
  }
  // The key of the peer's fabric `rail`, or nullptr.
  const fabric::RemoteSlice* KeyFor(const fabric::RailId& rail) const {
    for (const auto& k : keys) {
      if (k.rail == rail) return &k.slice;
    }
    return nullptr;
  }
};

}  // namespace ferry::server
