#pragma once
// The peers this agent may talk to: one gRPC channel to each (the Peer stub and the tensor
// service's TensorPeer stubs share it), the rails they offered in Hello, and the fabric
// endpoints to them: one set per route (our rail -> their rail), `endpoints_per_peer` lanes
// each. Connects lazily on first use (Hello, the provider's handshake through the Connect
// call) and again after a peer restarts (its incarnation changes) or an endpoint broke.

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/v1/peer.grpc.pb.h"
#include "grpcpp/channel.h"
#include "server/policy/leg_mode.h"
#include "server/peers/peer_credentials.h"
#include "server/peers/peer_source.h"
#include "server/peers/remote_buffer.h"
#include "server/peers/resolve_cache.h"
#include "transport/fabric.h"

namespace ferry::server {

// One way to a peer: our fabric and the peer's fabric it connects to (same provider).
struct Route {
  fabric::RailId ours;
  fabric::RailId theirs;
  friend bool operator==(const Route&, const Route&) = default;
  friend auto operator<=>(const Route&, const Route&) = default;
  // "tcp:mlx5_0->tcp:mlx5_0"
  std::string ToString() const { return ours.ToString() + "->" + theirs.ToString(); }
};

// A connected endpoint and the route it takes.
struct PeerEndpoint {
  std::shared_ptr<fabric::Endpoint> endpoint;
  fabric::RailId rail;       // ours
  fabric::RailId peer_rail;  // theirs
};

// The rails both sides run, per provider they share, in our preference order: ours that are
// healthy now, and those the peer offered in its last Hello.
struct ProviderRails {
  std::string provider;
  std::vector<fabric::RailId> ours;
  std::vector<fabric::RailId> theirs;
};
struct PeerRails {
  uint64_t incarnation = 0;
  std::vector<ProviderRails> providers;  // never empty
};

class PeerDirectory {
 public:
  static constexpr absl::Duration kHelloTtl = absl::Seconds(2);
  static constexpr int kResolveAttempts = 3;

  // `self` is this agent's node name and `incarnation` its AgentCore::incarnation() (what
  // targets are told on Connect); naming itself as a peer reaches this agent's own Peer
  // service at `self_address`, so local targets need no special case. `peers` are the
  // config file's (PeerSource::kConfig). `fabrics` are in preference order.
  // `credentials` make every channel to a peer (plaintext when null).
  PeerDirectory(std::string self, uint64_t incarnation, std::string self_address,
                std::map<std::string, std::string> peers, std::vector<fabric::Fabric*> fabrics,
                std::shared_ptr<const PeerCredentials> credentials = nullptr);
  const PeerCredentials& credentials() const { return *credentials_; }

  bool Known(const std::string& node) const;
  std::vector<std::string> Names() const;

  // NOT_FOUND for a node that is not a peer or a buffer it does not have; UNAVAILABLE
  // when the peer does not answer. Always asks the peer.
  absl::StatusOr<RemoteBuffer> Resolve(const std::string& node, const std::string& name,
                                       absl::Time deadline);
  // As Resolve, but a kept answer (the peer said it revokes it; kept_answers()) costs no
  // call, and a new revocable answer is kept. The peer restarting or moving drops them. An
  // answer the peer revoked while it was on its way is not used: it asks again (up to
  // kResolveAttempts times, then UNAVAILABLE).
  absl::StatusOr<std::shared_ptr<const RemoteBuffer>> ResolveKept(const std::string& node,
                                                                  const std::string& name,
                                                                  absl::Time deadline);
  // Whether ResolveKept(node, name) would answer from what is kept, without a call: the
  // answer is kept and no connection to the peer broke. A hint (a revocation may come just
  // after), for callers that must not block to choose where to resolve.
  bool Kept(const std::string& node, const std::string& name);
  // Whether Rails(node) would answer from its last Hello without a call and no endpoint to
  // `node` broke (it would reconnect): a hint, as Kept, for callers that must not block.
  bool RailsFresh(const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);
  ResolveCache& kept_answers() { return kept_; }
  // No link to `node`, or one of its endpoints is gone or broken: it may have restarted
  // (a process that exits resets its sockets), so what is kept from it should be asked
  // again rather than used.
  bool LinkBroken(const std::string& node) ABSL_LOCKS_EXCLUDED(mu_);
  // The rails to `node` (a Hello when there is no answer yet, the last is older than
  // kHelloTtl (rails come back after maintenance), the peer restarted since `incarnation`
  // (0: any), or Refresh asked for one). FAILED_PRECONDITION when the two
  // share no provider; UNAVAILABLE when the peer does not answer.
  absl::StatusOr<PeerRails> Rails(const std::string& node, uint64_t incarnation,
                                  absl::Time deadline);
  // Lane `lane` (< our fabric's endpoints_per_peer) of `route` to `node`; connects when there
  // is none, it broke, or the peer restarted since `incarnation` (0: any).
  absl::StatusOr<PeerEndpoint> Endpoint(const std::string& node, const Route& route,
                                        uint32_t lane, uint64_t incarnation, absl::Time deadline);
  // The first route of the preferred provider (our first rail to its pair), lane 0.
  absl::StatusOr<PeerEndpoint> Endpoint(const std::string& node, uint64_t incarnation,
                                        absl::Time deadline);
  // Forgets `node`'s Hello, so the next Rails asks again (a route to it failed: its rails
  // may have changed).
  void Refresh(const std::string& node);
  // `node` answered a Health call with `incarnation`: if it restarted since its last Hello,
  // its kept answers go, the endpoints to its previous life are closed (their ops fail now,
  // not after transport retries), and the next Rails says hello again.
  void Answered(const std::string& node, uint64_t incarnation);
  // Our fabric of `rail`, or nullptr.
  fabric::Fabric* FabricOf(const fabric::RailId& rail) const;

  // What the directory knows of `node` now (`ferryctl peers`): its address, the rails its
  // last Hello offered, the incarnation it named and how many endpoints to it are up.
  struct View {
    std::string address;
    std::vector<fabric::RailId> rails;
    uint64_t incarnation = 0;
    size_t endpoints = 0;
    size_t kept_answers = 0;  // its ResolveBuffer answers this agent keeps
    size_t kept_lists = 0;    // its ResolveBlocks answers this agent keeps
  };
  std::optional<View> ViewOf(const std::string& node) const;
  // The Peer stub for `node` (Stage calls); NOT_FOUND for an unknown node. Shared: a peer
  // removed meanwhile keeps its stub alive for the calls that still use it.
  absl::StatusOr<std::shared_ptr<ferry::v1::Peer::Stub>> Stub(const std::string& node);
  // The gRPC channel to `node`'s peer address (this agent's own for self()), the one its
  // Peer stub uses, for the other agent-to-agent services served there (TensorPeer): make
  // the stub on it per use rather than keeping it, so that Update's changes reach you.
  // NOT_FOUND for an unknown node. Shared like Stub: a channel taken before the peer was
  // removed or moved stays usable and keeps reaching the address it was made for.
  absl::StatusOr<std::shared_ptr<grpc::Channel>> Channel(const std::string& node);
  // Makes the configured peers `peers` (a SIGHUP reload): new ones are added, removed ones
  // dropped (their endpoints closed; transfers to them fail UNAVAILABLE), a changed address
  // gets a new channel and reconnects. Peers that etcd or an operator (AddPeer) named stay.
  // Returns one line per change, for the log.
  std::vector<std::string> Update(const std::map<std::string, std::string>& peers);
  // Sets `source`'s address for `node`, adding the peer or moving it when that changes the
  // address dialled (the first source's in PeerSource order). Returns the change for the
  // log, "" when nothing changed (this node itself: never).
  std::string Upsert(const std::string& node, const std::string& address, PeerSource source);
  // Drops `source`'s address for `node`; the peer goes (endpoints closed) when no source
  // names it any more, or moves to the next source's address. Returns the change, "" when
  // `source` did not name it.
  std::string Remove(const std::string& node, PeerSource source);
  // How `node` was found: the source whose address is dialled; nullopt for an unknown node
  // and for this node itself.
  std::optional<PeerSource> SourceOf(const std::string& node) const;
  // Every source that names `node`, in PeerSource order (empty: unknown, or this node).
  std::vector<PeerSource> SourcesOf(const std::string& node) const;
  // The address dialled for `node` ("" when unknown).
  std::string AddressOf(const std::string& node) const;
  const std::string& self() const { return self_; }
  // Closes every endpoint (agent shutdown).
  void CloseAll();

 private:
  // What a peer's Hello said.
  struct Welcome {
    absl::Time said_at;
    uint64_t incarnation = 0;
    std::vector<std::pair<fabric::RailId, std::string>> rails;  // rail, its address
  };
  struct Link {
    // Each source's address for the peer; `address` is the first's (empty for self).
    std::map<PeerSource, std::string> sources;
    std::string address;
    // Made on first use; both reset when the address changes.
    std::shared_ptr<grpc::Channel> channel;
    std::shared_ptr<ferry::v1::Peer::Stub> stub;
    std::optional<Welcome> welcome;  // reset by Refresh and when the address changes
    uint64_t incarnation = 0;
    std::map<std::pair<Route, uint32_t>, std::shared_ptr<fabric::Endpoint>> endpoints;
    // Serialises connection set-up to this peer, so it is not dialled twice at once.
    std::shared_ptr<absl::Mutex> connect_mu = std::make_shared<absl::Mutex>();

    // Its Hello answer serves Rails without a new Hello: younger than kHelloTtl, from the
    // peer's life `incarnation` (0: any).
    bool Fresh(uint64_t incarnation) const {
      return (incarnation == 0 || incarnation == this->incarnation) && welcome &&
             absl::Now() - welcome->said_at < kHelloTtl;
    }
    // An endpoint is gone or broken (the peer may have restarted).
    bool Broken() const {
      return std::any_of(endpoints.begin(), endpoints.end(),
                         [](const auto& e) { return e.second == nullptr || e.second->broken(); });
    }
  };
  absl::StatusOr<Link*> FindLink(const std::string& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets (or with nullopt drops) `source`'s address for `node` and applies what that means
  // for the link: added, moved (endpoints to `closing`), removed. Returns the change or "".
  std::string SetSourceLocked(const std::string& node, PeerSource source,
                              const std::optional<std::string>& address,
                              std::vector<std::shared_ptr<fabric::Endpoint>>& closing)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Rails under the link's connect_mu: Hello when needed.
  absl::StatusOr<PeerRails> RailsLocked(const std::string& node, uint64_t incarnation,
                                        absl::Time deadline);
  absl::StatusOr<Welcome> Hello(const std::string& node, ferry::v1::Peer::Stub* stub,
                                absl::Time deadline);
  absl::StatusOr<std::shared_ptr<absl::Mutex>> ConnectMutex(const std::string& node);
  std::vector<fabric::RailId> HealthyRails(const std::string& provider) const;

  const std::string self_;
  const uint64_t incarnation_;
  const std::vector<fabric::Fabric*> fabrics_;
  const std::shared_ptr<const PeerCredentials> credentials_;
  mutable absl::Mutex mu_;
  std::map<std::string, Link> links_ ABSL_GUARDED_BY(mu_);
  ResolveCache kept_;  // its own lock, taken after mu_ where both are
};

}  // namespace ferry::server
