#include "server/peers/peer_directory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
                             std::vector<fabric::Fabric*> fabrics,
                             std::shared_ptr<const PeerCredentials> credentials)
    : self_(std::move(self)),
      incarnation_(incarnation),
      fabrics_(std::move(fabrics)),
      credentials_(credentials ? std::move(credentials) : PeerCredentials::Insecure(false)) {
  links_[self_].address = std::move(self_address);
  for (auto& [name, address] : peers) {
    if (name == self_) continue;
    Link& link = links_[name];
    link.sources[PeerSource::kConfig] = address;
    link.address = address;
  }
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
    ASSIGN_OR_RETURN(link.channel, credentials_->Dial(node, link.address, args));
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
  const absl::Duration budget = deadline - absl::Now();
  grpc::Status s = stub->ResolveBuffer(&ctx, req, &resp);
  if (!s.ok()) {
    if (s.error_code() == grpc::StatusCode::NOT_FOUND) {
      return absl::NotFoundError(absl::StrCat("no buffer named ", Echo(name), " on ", node));
    }
    const std::string what = absl::StrCat("asking ", node, " for buffer ", Echo(name));
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
      // Our own clock ended the call: the peer said nothing (gRPC's "Deadline Exceeded"
      // would read as the peer's answer). UNAVAILABLE, as PeerError makes any silence.
      return absl::UnavailableError(
          absl::StrFormat("%s: %s did not answer ResolveBuffer within %.3g s", what, node,
                          absl::ToDoubleSeconds(budget)));
    }
    return PeerError(s, what);
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
  out.revocable = resp.revocable();
  return out;
}

absl::StatusOr<std::shared_ptr<const RemoteBuffer>> PeerDirectory::ResolveKept(
    const std::string& node, const std::string& name, absl::Time deadline) {
  for (int attempt = 0; attempt < kResolveAttempts; ++attempt) {
    if (auto kept = kept_.Find(node, name)) {
      // A connection to the peer that broke says it may have restarted (a process that
      // exits resets its sockets): then ask again, which finds out, rather than fail on old
      // keys.
      if (!LinkBroken(node)) return kept;
      kept_.Revoke(node, {}, true);
    }
    const uint64_t epoch = kept_.Epoch(node);
    ASSIGN_OR_RETURN(RemoteBuffer fresh, Resolve(node, name, deadline));
    auto answer = std::make_shared<const RemoteBuffer>(std::move(fresh));
    // Not revocable: asked for this transfer alone, as every transfer did before answers
    // were kept.
    if (!answer->revocable) return answer;
    {
      // An answer from an incarnation other than the one our endpoints reach is not kept:
      // the peer restarted between the Hello and this answer (the engine then refuses it).
      absl::MutexLock lock(&mu_);
      auto it = links_.find(node);
      if (it == links_.end() ||
          (it->second.incarnation != 0 && it->second.incarnation != answer->incarnation)) {
        return answer;
      }
    }
    if (auto used = kept_.Keep(epoch, std::move(answer))) return used;
    // Revoked on its way (the buffer freed, the policy changed): ask again.
  }
  return absl::UnavailableError(absl::StrCat("asking ", node, " for buffer ", Echo(name),
                                             ": its answer was withdrawn ", kResolveAttempts,
                                             " times on its way (the buffer was freed or the ",
                                             "policy changed each time)"));
}

bool PeerDirectory::Kept(const std::string& node, const std::string& name) {
  return kept_.Find(node, name) != nullptr && !LinkBroken(node);
}

bool PeerDirectory::RailsFresh(const std::string& node) {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(node);
  return it != links_.end() && it->second.Fresh(0) && !it->second.Broken();
}

bool PeerDirectory::LinkBroken(const std::string& node) {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(node);
  return it == links_.end() || it->second.Broken();
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
    std::vector<std::string> dropped;
    for (const auto& [name, link] : links_) {
      if (link.sources.contains(PeerSource::kConfig) && !peers.contains(name)) {
        dropped.push_back(name);
      }
    }
    for (const auto& name : dropped) {
      std::string change = SetSourceLocked(name, PeerSource::kConfig, std::nullopt, closing);
      if (!change.empty()) changes.push_back(std::move(change));
    }
    for (const auto& [name, address] : peers) {
      std::string change = SetSourceLocked(name, PeerSource::kConfig, address, closing);
      if (!change.empty()) changes.push_back(std::move(change));
    }
  }
  for (auto& e : closing) e->Close();
  return changes;
}

std::string PeerDirectory::Upsert(const std::string& node, const std::string& address,
                                  PeerSource source) {
  std::vector<std::shared_ptr<fabric::Endpoint>> closing;
  std::string change;
  {
    absl::MutexLock lock(&mu_);
    change = SetSourceLocked(node, source, address, closing);
  }
  for (auto& e : closing) e->Close();
  return change;
}

std::string PeerDirectory::Remove(const std::string& node, PeerSource source) {
  std::vector<std::shared_ptr<fabric::Endpoint>> closing;
  std::string change;
  {
    absl::MutexLock lock(&mu_);
    change = SetSourceLocked(node, source, std::nullopt, closing);
  }
  for (auto& e : closing) e->Close();
  return change;
}

std::optional<PeerSource> PeerDirectory::SourceOf(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(node);
  if (it == links_.end() || it->second.sources.empty()) return std::nullopt;
  return it->second.sources.begin()->first;
}

std::vector<PeerSource> PeerDirectory::SourcesOf(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  std::vector<PeerSource> out;
  auto it = links_.find(node);
  if (it == links_.end()) return out;
  for (const auto& [source, address] : it->second.sources) out.push_back(source);
  return out;
}

std::string PeerDirectory::AddressOf(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(node);
  return it == links_.end() ? "" : it->second.address;
}

std::string PeerDirectory::SetSourceLocked(
    const std::string& node, PeerSource source, const std::optional<std::string>& address,
    std::vector<std::shared_ptr<fabric::Endpoint>>& closing) {
  if (node == self_) return "";  // this agent is reached at its own address, whoever names it
  auto it = links_.find(node);
  if (it == links_.end()) {
    if (!address) return "";
    Link& link = links_[node];
    link.sources[source] = *address;
    link.address = *address;
    return absl::StrCat("peer ", node, " added at ", *address);
  }
  Link& link = it->second;
  if (address) {
    auto [named, added] = link.sources.try_emplace(source, *address);
    if (!added && named->second == *address) return "";
    named->second = *address;
  } else {
    if (link.sources.erase(source) == 0) return "";
    if (link.sources.empty()) {
      for (auto& [key, e] : link.endpoints) closing.push_back(std::move(e));
      links_.erase(it);
      kept_.Revoke(node, {}, true);
      return absl::StrCat("peer ", node, " removed");
    }
  }
  const auto& [first, dialled] = *link.sources.begin();
  if (dialled == link.address) {
    // Another source still names it where it is dialled: nothing moves.
    return address ? ""
                   : absl::StrCat("peer ", node, " kept: ", PeerSourceName(first),
                                  " still names it at ", dialled);
  }
  std::string change =
      absl::StrCat("peer ", node, " moved from ", link.address, " to ", dialled);
  link.address = dialled;
  link.channel.reset();
  link.stub.reset();
  link.incarnation = 0;
  link.welcome.reset();
  for (auto& [key, e] : link.endpoints) closing.push_back(std::move(e));
  link.endpoints.clear();
  kept_.Revoke(node, {}, true);  // another agent may answer at the new address
  return change;
}

absl::StatusOr<std::shared_ptr<absl::Mutex>> PeerDirectory::ConnectMutex(const std::string& node) {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Link * link, FindLink(node));
  return link->connect_mu;
}

std::vector<fabric::RailId> PeerDirectory::HealthyRails(const std::string& provider) const {
  std::vector<fabric::RailId> out;
  for (fabric::Fabric* f : fabrics_) {
    // e.g. its port is down or an operator suspended it: offer and use the others.
    if (f->provider() == provider && f->health().ok()) out.push_back(f->rail());
  }
  return out;
}

absl::StatusOr<PeerRails> PeerDirectory::Rails(const std::string& node, uint64_t incarnation,
                                               absl::Time deadline) {
  ASSIGN_OR_RETURN(std::shared_ptr<absl::Mutex> connect_mu, ConnectMutex(node));
  absl::MutexLock connecting(connect_mu.get());
  return RailsLocked(node, incarnation, deadline);
}

absl::StatusOr<PeerRails> PeerDirectory::RailsLocked(const std::string& node,
                                                     uint64_t incarnation, absl::Time deadline) {
  std::optional<Welcome> welcome;
  std::shared_ptr<ferry::v1::Peer::Stub> stub;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Link * link, FindLink(node));
    if (link->Fresh(incarnation)) welcome = link->welcome;
    stub = link->stub;
  }
  if (!welcome) {
    ASSIGN_OR_RETURN(Welcome said, Hello(node, stub.get(), deadline));
    std::vector<std::shared_ptr<fabric::Endpoint>> closing;
    {
      absl::MutexLock lock(&mu_);
      auto found = links_.find(node);
      if (found == links_.end()) {
        return absl::UnavailableError(
            absl::StrCat("peer ", node, " was removed (config, etcd or RemovePeer)"));
      }
      Link& l = found->second;
      // A restarted peer forgot every connection we had and every answer it gave: they go.
      // (The first Hello finds answers kept before it; the engine checks each answer's
      // incarnation against the Hello's before it uses one.)
      if (l.incarnation != said.incarnation) {
        for (auto& [key, e] : l.endpoints) closing.push_back(std::move(e));
        l.endpoints.clear();
        if (l.incarnation != 0) kept_.Revoke(node, {}, true);
      }
      l.incarnation = said.incarnation;
      l.welcome = said;
    }
    for (auto& e : closing) e->Close();
    welcome = std::move(said);
  }
  PeerRails out;
  out.incarnation = welcome->incarnation;
  std::vector<std::string> ours, theirs;
  for (fabric::Fabric* f : fabrics_) {
    if (f->health().ok() &&
        std::find(ours.begin(), ours.end(), f->provider()) == ours.end()) {
      ours.push_back(f->provider());
    }
  }
  for (const auto& [rail, address] : welcome->rails) {
    if (std::find(theirs.begin(), theirs.end(), rail.provider) == theirs.end())
      theirs.push_back(rail.provider);
  }
  RETURN_IF_ERROR(fabric::SelectProvider(ours, theirs).status());
  for (const std::string& provider : ours) {
    ProviderRails p{provider, HealthyRails(provider), {}};
    for (const auto& [rail, address] : welcome->rails) {
      if (rail.provider == provider) p.theirs.push_back(rail);
    }
    if (!p.theirs.empty()) out.providers.push_back(std::move(p));
  }
  return out;
}

absl::StatusOr<PeerEndpoint> PeerDirectory::Endpoint(const std::string& node, uint64_t incarnation,
                                                     absl::Time deadline) {
  ASSIGN_OR_RETURN(PeerRails rails, Rails(node, incarnation, deadline));
  const ProviderRails& best = rails.providers.front();
  return Endpoint(node, {best.ours.front(), best.theirs.front()}, 0, incarnation, deadline);
}

absl::StatusOr<PeerEndpoint> PeerDirectory::Endpoint(const std::string& node, const Route& route,
                                                     uint32_t lane, uint64_t incarnation,
                                                     absl::Time deadline) {
  ASSIGN_OR_RETURN(std::shared_ptr<absl::Mutex> connect_mu, ConnectMutex(node));
  absl::MutexLock connecting(connect_mu.get());
  fabric::Fabric* fabric = FabricOf(route.ours);
  if (fabric == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("no fabric ", route.ours.ToString(), " on this agent"));
  }
  // Checks that the peer has not restarted (and forgot our connections) since `incarnation`.
  ASSIGN_OR_RETURN(PeerRails rails, RailsLocked(node, incarnation, deadline));
  const auto key = std::make_pair(route, lane);
  std::string address;
  std::shared_ptr<ferry::v1::Peer::Stub> stub;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Link * link, FindLink(node));  // it may have been removed meanwhile
    auto it = link->endpoints.find(key);
    if (it != link->endpoints.end() && !it->second->broken()) {
      return PeerEndpoint{it->second, route.ours, route.theirs};
    }
    if (link->welcome) {
      for (const auto& [rail, at] : link->welcome->rails) {
        if (rail == route.theirs) address = at;
      }
    }
    stub = link->stub;
  }
  if (address.empty()) {
    return absl::UnavailableError(
        absl::StrCat("peer ", node, " does not offer ", route.theirs.ToString(), " now"));
  }
  ASSIGN_OR_RETURN(auto pending, fabric->BeginConnect(address));
  ferry::v1::ConnectRequest req;
  req.set_node(self_);
  req.set_incarnation(incarnation_);
  req.set_provider(route.theirs.provider);
  req.set_nic(route.theirs.nic);
  req.set_request(pending->request());
  ferry::v1::ConnectResponse reply;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    grpc::Status s = stub->Connect(&ctx, req, &reply);
    if (!s.ok()) {
      return PeerError(s, absl::StrCat("connecting to ", node, " over ", route.ToString()));
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<fabric::Endpoint> endpoint, pending->Finish(reply.reply()));
  std::shared_ptr<fabric::Endpoint> old;
  {
    absl::MutexLock lock(&mu_);
    auto found = links_.find(node);
    if (found == links_.end()) {
      endpoint->Close();
      return absl::UnavailableError(
          absl::StrCat("peer ", node, " was removed (config, etcd or RemovePeer)"));
    }
    auto& slot = found->second.endpoints[key];
    old = std::move(slot);
    slot = endpoint;
  }
  if (old) old->Close();
  spdlog::info("connected to peer {} over {} lane {} ({}, incarnation {:x})", node,
               route.ToString(), lane, address, rails.incarnation);
  return PeerEndpoint{std::move(endpoint), route.ours, route.theirs};
}

std::optional<PeerDirectory::View> PeerDirectory::ViewOf(const std::string& node) const {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(node);
  if (it == links_.end()) return std::nullopt;
  const Link& l = it->second;
  View v;
  v.address = l.address;
  v.incarnation = l.incarnation;
  if (l.welcome) {
    for (const auto& [rail, address] : l.welcome->rails) v.rails.push_back(rail);
  }
  for (const auto& [key, e] : l.endpoints) v.endpoints += e && !e->broken();
  v.kept_answers = kept_.KeptFrom(node);
  v.kept_lists = kept_.ListsKeptFrom(node);
  return v;
}

void PeerDirectory::Answered(const std::string& node, uint64_t incarnation) {
  std::vector<std::shared_ptr<fabric::Endpoint>> closing;
  {
    absl::MutexLock lock(&mu_);
    auto it = links_.find(node);
    if (it == links_.end() || it->second.incarnation == 0 ||
        it->second.incarnation == incarnation) {
      return;
    }
    Link& l = it->second;
    l.welcome.reset();
    kept_.Revoke(node, {}, true);
    // The new life forgot our connections: the ops posted on them would wait for transport
    // retries (forever on rxe at retry_cnt 7) though we know now that nothing answers them.
    // Closed here, they fail at once (UNAVAILABLE, so a striped op takes another route);
    // l.incarnation stays, and the next Hello sees the new one and connects again.
    for (auto& [key, e] : l.endpoints) closing.push_back(std::move(e));
    l.endpoints.clear();
  }
  if (!closing.empty()) {
    spdlog::warn("peer {} restarted (incarnation {:x}): closing the {} connection(s) to its "
                 "previous life; the ops on them fail now",
                 node, incarnation, closing.size());
  }
  for (auto& e : closing) e->Close();
}

void PeerDirectory::Refresh(const std::string& node) {
  absl::MutexLock lock(&mu_);
  auto it = links_.find(node);
  if (it != links_.end()) it->second.welcome.reset();
}

fabric::Fabric* PeerDirectory::FabricOf(const fabric::RailId& rail) const {
  for (fabric::Fabric* f : fabrics_) {
    if (f->rail() == rail) return f;
  }
  return nullptr;
}

absl::StatusOr<PeerDirectory::Welcome> PeerDirectory::Hello(const std::string& node,
                                                            ferry::v1::Peer::Stub* stub,
                                                            absl::Time deadline) {
  ferry::v1::HelloRequest hello;
  hello.set_node(self_);
  hello.set_protocol_version(kPeerProtocolVersion);
  for (fabric::Fabric* f : fabrics_) {
    if (!f->health().ok()) continue;
    auto* ep = hello.add_endpoints();
    ep->set_provider(f->provider());
    ep->set_address(f->address());
    ep->set_nic(f->rail().nic);
  }
  ferry::v1::HelloResponse welcome;
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
  if (welcome.node() != node) {
    return absl::FailedPreconditionError(
        absl::StrCat("the agent at ", node, "'s address calls itself '", welcome.node(), "'"));
  }
  if (welcome.protocol_version() != kPeerProtocolVersion) {
    return absl::FailedPreconditionError(absl::StrCat("peer ", node, " speaks protocol ",
                                                      welcome.protocol_version(), ", we speak ",
                                                      kPeerProtocolVersion));
  }
  Welcome out;
  out.said_at = absl::Now();
  out.incarnation = welcome.incarnation();
  for (const auto& e : welcome.endpoints()) {
    out.rails.push_back({{e.provider(), e.nic()}, e.address()});
  }
  return out;
}

void PeerDirectory::CloseAll() {
  std::vector<std::shared_ptr<fabric::Endpoint>> endpoints;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [name, link] : links_) {
      for (auto& [key, e] : link.endpoints) endpoints.push_back(std::move(e));
      link.endpoints.clear();
    }
  }
  for (auto& e : endpoints) e->Close();
}

}  // namespace ferry::server
