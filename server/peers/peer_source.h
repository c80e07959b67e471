#pragma once
// How this agent learned of a peer. One node may be named by several sources at once (in the
// config file and registered in etcd); the PeerDirectory keeps each source's address and
// dials the one of the first source in this order: an operator's run-time word
// (AddPeer) over the config file over etcd. A peer stays while any source names it, so a
// lapsed etcd lease never removes a peer the config file or an operator named.

namespace ferry::server {

enum class PeerSource {
  kRuntime = 0,  // AddPeer / `ferryctl peers add`; kept across SIGHUP until RemovePeer
  kConfig = 1,   // the config file's `peers` (and --peer flags), replaced on SIGHUP
  kEtcd = 2,     // registered under the discovery prefix in etcd, gone with its key
};

// "runtime", "config", "etcd": what `ferryctl peers` shows as how a peer was found.
constexpr const char* PeerSourceName(PeerSource source) {
  switch (source) {
    case PeerSource::kRuntime:
      return "runtime";
    case PeerSource::kConfig:
      return "config";
    case PeerSource::kEtcd:
      return "etcd";
  }
  return "unknown";
}

}  // namespace ferry::server
