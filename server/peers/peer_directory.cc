#include "server/peers/peer_directory.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/grpc_status.h"
#include "base/echo.h"
#include "base/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "server/peers/protocol.h"
#include "spdlog/spdlog.h"
#include "transport/providers.h"

namespace ferry::server {
namespace {

absl::Status PeerError(const grpc::Status& s, const std::string& what) {
  // A peer that cannot be reached, or that cancelled our call as it stopped, is UNAVAILABLE
  // whatever gRPC's exact code.
  auto code = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                      s.error_code() == grpc::StatusCode::CANCELLED
                  ? absl::StatusCode::kUnavailable
                  : static_cast<absl::StatusCode>(s.error_code());
  return absl::Status(code, absl::StrCat(what, ": ", s.error_message()));
}

}  // namespace

PeerDirectory::PeerDirectory(std::string self, uint64_t incarnation, std::string self_address,
                             std::map<std::string, std::string> peers,
                             std::vector<fabric::Fabric*> fabrics)
    : self_(std::move(self)), incarnation_(incarnation), fabrics_(std::move(fabrics)) {
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

fabric::Fabric* PeerDirectory::FabricFor(const std::string& provider) const {
  for (fabric::Fabric* f : fabrics_) {
    if (f->provider() == provider) return f;
  }
  return nullptr;
}

absl::StatusOr<PeerDirectory::Link*> PeerDirectory::FindLink(const std::string& node) {
  auto it = links_.find(node);
  if (it == links_.end()) {
    std::vector<std::string> names;
    for (const auto& [name, link] : links_) names.push_back(name);
    return absl::NotFoundError(absl::StrCat("unknown node '", node, "' (known: ",
                                            absl::StrJoin(names, ", "), ")"));
  }
  Link& link = it->second;
  if (!link.channel) {
    grpc::ChannelArguments args;
    // Reconnect quickly after a peer restarts instead of waiting out gRPC's long backoff.
    // Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: it is also the connect timeout, and at 100 ms a
    // busy peer (one out of fds, accepting slowly) would look dead.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    link.channel =
        grpc::CreateCustomChannel(link.address, grpc::InsecureChannelCredentials(), args);
    link.stub = ferry::v1::Peer::NewStub(link.channel);
  }
  return &link;
}

absl::StatusOr<RemoteBuffer> PeerDirectory::Resolve(const std::string& node,
                                                    const std::string& name, absl::Time deadline) {
  ASSIGN_OR_RETURN(std::shared_ptr<ferry::v1::Peer::Stub> stub, Stub(node));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(deadline));
  ferry::v1::ResolveBufferRequest req;
  req.set_name(name);
  req.set_from_node(self_);
  ferry::v1::ResolveBufferResponse resp;
  grpc::Status s = stub->ResolveBuffer(&ctx, req, &resp);
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      return absl::NotFoundError(absl::StrCat("no buffer named ", Echo(name), " on ", node));
    }
    return PeerError(s, absl::StrCat("ResolveBuffer(", name, ") on ", node));
  }
  RemoteBuffer out;
  out.node = node;
  out.name = name;
  out.size = resp.size();
  out.device = resp.device();
  out.incarnation = resp.incarnation();
  for (const auto& k : resp.keys()) {
    out.keys.push_back({{k.provider(), k.nic()}, {k.address(), k.key()}});
  }
  out.reason = resp.reason();
  if (!resp.mode().empty()) {
    std::optional<LegMode> mode = ParseLegMode(resp.mode());
    out.mode = mode.value_or(LegMode::kUnavailable);
    if (!mode) out.reason = absl::StrCat("the peer named an unknown mode ", Echo(resp.mode()));
  }
  out.nic = resp.nic();
  out.path = resp.path();
  out.backend = resp.backend();
  return out;
}

absl::StatusOr<std::shared_ptr<ferry::v1::Peer::Stub>> PeerDirectory::Stub(
    const std::string& node) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Link* link, FindLink(node));
  return link->stub;
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> PeerDirectory::Channel(const std::string& node) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Link* link, FindLink(node));
  return link->channel;
}

std::vector<std::string> PeerDirectory::Update(const std::map<std::string, std::string>& peers) {
  std::vector<std::string> changes;
  std::vector<std::shared_ptr<fabric::Endpoint>> closing;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = links_.begin(); it != links_.end();) {
      if (it->first == self_ || peers.contains(it->first)) {
        ++it;
        continue;
      }
      changes.push_back(absl::StrCat("peer ", it->first, " removed"));
      if (it->second.connected.endpoint)
        closing.push_back(std::move(it->second.connected.endpoint));
      it = links_.erase(it);
    }
    for (const auto& [name, address] : peers) {
      if (name == self_) continue;
      auto [it, added] = links_.try_emplace(name);
      Link& link = it->second;
      if (added) {
        link.address = address;
        changes.push_back(absl::StrCat("peer ", name, " added at ", address));
      } else if (link.address != address) {
        changes.push_back(
            absl::StrCat("peer ", name, " moved from ", link.address, " to ", address));
        link.address = address;
        link.channel.reset();
        link.stub.reset();
        link.incarnation = 0;
        if (link.connected.endpoint) closing.push_back(std::move(link.connected.endpoint));
      }
    }
  }
  for (auto& e : closing) e->Close();
  return changes;
}

absl::StatusOr<PeerEndpoint> PeerDirectory::Endpoint(const std::string& node, uint64_t incarnation,
                                                     absl::Time deadline) {
  std::shared_ptr<absl::Mutex> connect_mu;
  {
    absl::MutexLock lock(&mu_);
    auto link = FindLink(node);
    if (!link.ok()) return link.status();
    connect_mu = (*link)->connect_mu;
  }
  absl::MutexLock connecting(connect_mu.get());
  std::shared_ptr<ferry::v1::Peer::Stub> stub;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Link * link, FindLink(node));  // it may have been removed meanwhile
    Link& l = *link;
    bool fresh = incarnation == 0 || incarnation == l.incarnation;
    if (l.connected.endpoint && !l.connected.endpoint->broken() && fresh) return l.connected;
    stub = l.stub;
  }
  uint64_t peer_incarnation = 0;
  ASSIGN_OR_RETURN(PeerEndpoint connected, Connect(node, stub.get(), deadline, &peer_incarnation));
  PeerEndpoint old;
  {
    absl::MutexLock lock(&mu_);
    auto found = links_.find(node);
    if (found == links_.end()) {
      connected.endpoint->Close();
      return absl::UnavailableError(
          absl::StrCat("peer ", node, " was removed from the configuration"));
    }
    Link& l = found->second;
    old = std::move(l.connected);
    l.connected = connected;
    l.incarnation = peer_incarnation;
  }
  if (old.endpoint) old.endpoint->Close();
  return connected;
}

absl::StatusOr<PeerEndpoint> PeerDirectory::Connect(const std::string& node,
                                                    ferry::v1::Peer::Stub* stub,
                                                    absl::Time deadline, uint64_t* incarnation) {
  ferry::v1::HelloRequest hello;
  hello.set_node(self_);
  hello.set_protocol_version(kPeerProtocolVersion);
  std::vector<std::string> ours;
  for (fabric::Fabric* f : fabrics_) {
    if (!f->health().ok()) continue;  // e.g. its port is down: offer and use the others
    auto* ep = hello.add_endpoints();
    ep->set_provider(f->provider());
    ep->set_address(f->address());
    ours.push_back(f->provider());
  }
  ferry::v1::HelloResponse welcome;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    grpc::Status s = stub->Hello(&ctx, hello, &welcome);
    if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      return absl::FailedPreconditionError(
          absl::StrCat("peer ", node, " refused Hello: ", s.error_message()));
    }
    if (!s.ok()) {
      return absl::UnavailableError(
          absl::StrCat("peer ", node, " did not answer Hello: ", s.error_message()));
    }
  }
  if (welcome.node() != node) {
    return absl::FailedPreconditionError(
        absl::StrCat("the agent at ", node, "'s address calls itself '", welcome.node(), "'"));
  }
  if (welcome.protocol_version() != kPeerProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat("peer ", node, " speaks protocol ",
                                                      welcome.protocol_version(), ", we speak ",
                                                      kPeerProtocolVersion));
  }
  std::vector<std::string> theirs;
  for (const auto& e : welcome.endpoints()) theirs.push_back(e.provider());
  ASSIGN_OR_RETURN(std::string provider, fabric::SelectProvider(ours, theirs));
  std::string address;
  for (const auto& e : welcome.endpoints()) {
    if (e.provider() == provider) address = e.address();
  }
  fabric::Fabric* fabric = FabricFor(provider);
  ASSIGN_OR_RETURN(auto pending, fabric->BeginConnect(address));
  ferry::v1::ConnectRequest req;
  req.set_node(self_);
  req.set_incarnation(incarnation_);
  req.set_provider(provider);
  req.set_request(pending->request());
  ferry::v1::ConnectResponse reply;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    grpc::Status s = stub->Connect(&ctx, req, &reply);
    if (!s.ok()) return PeerError(s, absl::StrCat("Connect(", provider, ") to ", node));
  }
  ASSIGN_OR_RETURN(std::shared_ptr<fabric::Endpoint> endpoint, pending->Finish(reply.reply()));
  *incarnation = welcome.incarnation();
  spdlog::info("connected to peer {} over {} ({}, incarnation {:x})", node, provider, address,
               welcome.incarnation());
  return PeerEndpoint{std::move(endpoint), fabric->rail()};
}

void PeerDirectory::CloseAll() {
  std::vector<std::shared_ptr<fabric::Endpoint>> endpoints;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, link] : links_) {
      if (link.connected.endpoint) endpoints.push_back(std::move(link.connected.endpoint));
    }
  }
  for (auto& e : endpoints) e->Close();
}

}  // namespace ferry::server
