#pragma once
// The peers this agent may talk to: their Peer gRPC stubs, what they said in Hello, and the
// fabric endpoint to each. Connects lazily on first use and again after a peer restarts
// (its incarnation changes) or its endpoint broke.

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "ferry/v1/peer.grpc.pb.h"
#include "transport/fabric.h"

namespace ferry::server {

// A buffer on a peer, as its agent exported it.
struct RemoteBuffer {
  std::string node;
  std::string name;
  uint64_t size = 0;
  fabric::RemoteSlice base;  // byte 0
  uint64_t incarnation = 0;
};

class PeerDirectory {
 public:
  // `self` is this agent's node name; naming it as a peer reaches this agent's own Peer
  // service at `self_address`, so local targets need no special case.
  PeerDirectory(std::string self, std::string self_address,
                std::map<std::string, std::string> peers, fabric::Fabric* fabric);

  bool Known(const std::string& node) const;
  // The provider endpoints use ("tcp").
  std::string provider() const { return fabric_->provider(); }
  std::vector<std::string> Names() const;

  // NOT_FOUND for a node that is not a peer; UNAVAILABLE when it does not answer.
  absl::StatusOr<RemoteBuffer> Resolve(const std::string& node, const std::string& name,
                                       absl::Time deadline);
  // The endpoint to `node`'s fabric; connects (Hello + fabric connect) when there is none, it
  // broke, or the peer restarted since `incarnation` (0: any).
  absl::StatusOr<std::shared_ptr<fabric::Endpoint>> Endpoint(const std::string& node,
                                                             uint64_t incarnation,
                                                             absl::Time deadline);
  // Closes every endpoint (agent shutdown).
  void CloseAll();

 private:
  struct Link {
    std::string address;
    std::unique_ptr<ferry::v1::Peer::Stub> stub;
    std::shared_ptr<fabric::Endpoint> endpoint;
    uint64_t incarnation = 0;
  };
  absl::StatusOr<Link*> FindLink(const std::string& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string self_;
  fabric::Fabric* const fabric_;
  mutable absl::Mutex mu_;
  std::map<std::string, Link> links_ ABSL_GUARDED_BY(mu_);
  // Serialises connection set-up so that one peer is not dialled twice at once.
  absl::Mutex connect_mu_;
};

}  // namespace ferry::server
