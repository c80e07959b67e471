#include "client/peers_edit.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/grpc_status.h"
#include "grpcpp/grpcpp.h"

namespace ferry::client {
absl::StatusOr<ferry::v1::PeerChange> AddPeer(ferry::v1::Agent::Stub& stub,
                                              const std::string& node,
                                              const std::string& address) {
  ferry::v1::AddPeerRequest req;
  req.set_node(node);
  req.set_address(address);
  ferry::v1::PeerChange resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Status s = stub.AddPeer(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

absl::StatusOr<ferry::v1::PeerChange> RemovePeer(ferry::v1::Agent::Stub& stub,
                                                 const std::string& node) {
  ferry::v1::RemovePeerRequest req;
  req.set_node(node);
  ferry::v1::PeerChange resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  grpc::Status s = stub.RemovePeer(&ctx, req, &resp);
  if (!s.ok()) return FromGrpcStatus(s);
  return resp;
}

std::string FormatPeerChange(const std::string& node, const ferry::v1::PeerChange& change) {
  if (!change.change().empty()) return change.change();
  if (change.address().empty()) return absl::StrCat(node, ": no change (not a peer)");
  return absl::StrCat(node, ": no change (", change.source(), ", at ", change.address(), ")");
}

}  // namespace ferry::client
