#include "server/peers/peer_directory.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"
#include "server/peers/protocol.h"
#include "base/grpc_status.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

PeerDirectory::PeerDirectory(std::string self, std::string self_address,
                             std::map<std::string, std::string> peers, fabric::Fabric* fabric)
    : self_(std::move(self)), fabric_(fabric) {
  peers[self_] = std::move(self_address);
  for (auto& [name, address] : peers) links_[name].address = address;
}

bool PeerDirectory::Known(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  return links_.contains(node);
}

std::vector<std::string> PeerDirectory::Names() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [name, link] : links_) {
    if (name != self_) names.push_back(name);
  }
  return names;
}

absl::StatusOr<PeerDirectory::Link*> PeerDirectory::FindLink(const std::string& node) {
  auto it = links_.find(node);
  if (it == links_.end()) {
    std::vector<std::string> names;
    for (const auto& [name, link] : links_) names.push_back(name);
    return absl::NotFoundError(absl::StrCat("peer: unknown node '", node, "' (known: ",
                                            absl::StrJoin(names, ", "), ")"));
  }
  Link& link = it->second;
  if (!link.stub) {
    grpc::ChannelArguments args;
    // Reconnect quickly after a peer restarts instead of waiting out gRPC's long backoff.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    link.stub = ferry::v1::Peer::NewStub(
        grpc::CreateCustomChannel(link.address, grpc::InsecureChannelCredentials(), args));
  }
  return &link;
}

absl::StatusOr<RemoteBuffer> PeerDirectory::Resolve(const std::string& node,
                                                    const std::string& name, absl::Time deadline) {
  ferry::v1::Peer::Stub* stub;
  {
    absl::MutexLock lock(&mu_);
    auto link = FindLink(node);
    if (!link.ok()) return link.status();
    stub = (*link)->stub.get();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  ferry::v1::ResolveBufferRequest req;
  req.set_name(name);
  req.set_from_node(self_);
  ferry::v1::ResolveBufferResponse resp;
  grpc::Status s = stub->ResolveBuffer(&ctx, req, &resp);
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      return absl::NotFoundError(absl::StrCat("no buffer named '", name, "' on ", node));
    }
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                        absl::StrCat("ResolveBuffer(", name, ") on ", node, ": ", s.error_message()));
  }
  RemoteBuffer out;
  out.node = node;
  out.name = name;
  out.size = resp.size();
  out.base = {resp.address(), resp.key()};
  out.incarnation = resp.incarnation();
  return out;
}

absl::StatusOr<std::shared_ptr<fabric::Endpoint>> PeerDirectory::Endpoint(const std::string& node,
                                                                          uint64_t incarnation,
                                                                          absl::Time deadline) {
  absl::MutexLock connect_lock(&connect_mu_);
  ferry::v1::Peer::Stub* stub;
  {
    absl::MutexLock lock(&mu_);
    auto link = FindLink(node);
    if (!link.ok()) return link.status();
    Link& l = **link;
    bool fresh = incarnation == 0 || incarnation == l.incarnation;
    if (l.endpoint && !l.endpoint->broken() && fresh) return l.endpoint;
    stub = l.stub.get();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  ferry::v1::HelloRequest req;
  req.set_node(self_);
  req.set_protocol_version(kPeerProtocolVersion);
  auto* ep = req.add_endpoints();
  ep->set_provider(fabric_->provider());
  ep->set_address(fabric_->address());
  ferry::v1::HelloResponse resp;
  grpc::Status s = stub->Hello(&ctx, req, &resp);
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat("peer ", node, " did not answer Hello: ",
                                               s.error_message()));
  }
  if (resp.node() != node) {
    return absl::FailedPreconditionError(
        absl::StrCat("peer at ", node, "'s address calls itself '", resp.node(), "'"));
  }
  if (resp.protocol_version() != kPeerProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat("peer ", node, " speaks protocol ",
                                                      resp.protocol_version(), ", we speak ",
                                                      kPeerProtocolVersion));
  }
  std::string address;
  for (const auto& e : resp.endpoints()) {
    if (e.provider() == fabric_->provider()) address = e.address();
  }
  if (address.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("peer ", node, " offers no ", fabric_->provider(), " endpoint"));
  }
  auto endpoint = fabric_->Connect(address);
  if (!endpoint.ok()) return endpoint.status();
  std::shared_ptr<fabric::Endpoint> old;
  {
    absl::MutexLock lock(&mu_);
    Link& l = links_[node];
    old = std::move(l.endpoint);
    l.endpoint = *endpoint;
    l.incarnation = resp.incarnation();
  }
  spdlog::info("connected to peer {} ({} at {}, incarnation {:x})", node, fabric_->provider(),
               address, resp.incarnation());
  if (old) old->Close();
  return *endpoint;
}

void PeerDirectory::CloseAll() {
  std::vector<std::shared_ptr<fabric::Endpoint>> endpoints;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, link] : links_) {
      if (link.endpoint) endpoints.push_back(std::move(link.endpoint));
    }
  }
  for (auto& e : endpoints) e->Close();
}

}  // namespace ferry::server
