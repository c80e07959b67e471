#include "server/api/peer_service.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/echo.h"
#include "base/grpc_status.h"
#include "server/agent/agent_core.h"
#include "server/peers/caller_identity.h"
#include "server/peers/protocol.h"
#include "server/api/stage_service.h"
#include "spdlog/spdlog.h"

namespace ferry::server {

grpc::Status PeerService::Hello(grpc::ServerContext* ctx, const ferry::v1::HelloRequest* req,
                                ferry::v1::HelloResponse* resp) {
  // A node whose certificate names another is no peer of ours, even with the right CA.
  if (auto caller = CallerNode(*ctx, req->node()); !caller.ok()) {
    return ToGrpcStatus(caller.status());
  }
  // Refused rather than misread: the other side's messages and wire frames may differ.
  if (req->protocol_version() != kPeerProtocolVersion) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        absl::StrCat("protocol_version: ", Echo(req->node()),
                                     " speaks peer protocol ", req->protocol_version(), ", ",
                                     core_->config().node, " speaks ", kPeerProtocolVersion));
  }
  resp->set_node(core_->config().node);
  resp->set_protocol_version(kPeerProtocolVersion);
  resp->set_incarnation(core_->incarnation());
  for (const auto& fabric : core_->fabrics()) {
    // A fabric that cannot carry traffic now (its port is down) is not offered: the peer
    // picks one of the others rather than failing its Connect.
    if (!fabric->health().ok()) continue;
    auto* ep = resp->add_endpoints();
    ep->set_provider(fabric->provider());
    ep->set_address(fabric->address());
    ep->set_nic(fabric->rail().nic);
  }
  spdlog::debug("Hello from {} (protocol {})", req->node(), req->protocol_version());
  return grpc::Status::OK;
}

grpc::Status PeerService::Connect(grpc::ServerContext* ctx, const ferry::v1::ConnectRequest* req,
                                  ferry::v1::ConnectResponse* resp) {
  // Endpoints (verbs QPs, tcp sessions) exist only for the node the certificate names.
  absl::StatusOr<std::string> caller = CallerNode(*ctx, req->node());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  for (const auto& fabric : core_->fabrics()) {
    if (fabric->provider() != req->provider()) continue;
    // "" (a peer without rails) takes our first fabric of the provider.
    if (!req->nic().empty() && fabric->rail().nic != req->nic()) continue;
    auto reply = fabric->AcceptConnect(req->request(), {*caller, req->incarnation()});
    if (!reply.ok()) return ToGrpcStatus(reply.status());
    resp->set_reply(*reply);
    resp->set_incarnation(core_->incarnation());
    spdlog::info("peer {} connected over {}", *caller, fabric->rail().ToString());
    return grpc::Status::OK;
  }
  return grpc::Status(
      grpc::StatusCode::FAILED_PRECONDITION,
      absl::StrCat("provider: this agent does not run '", req->provider(), "'",
                   req->nic().empty() ? "" : absl::StrCat(" on NIC ", Echo(req->nic()))));
}

grpc::Status PeerService::ResolveBuffer(grpc::ServerContext* ctx,
                                        const ferry::v1::ResolveBufferRequest* req,
                                        ferry::v1::ResolveBufferResponse* resp) {
  absl::StatusOr<std::string> caller = CallerNode(*ctx, req->from_node());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  auto buffer = core_->buffers().FindByName(req->name());
  // A buffer not exported to the caller is answered as one that does not exist, word for
  // word, so that names cannot be probed; the real reason stays in our log.
  auto unknown = [&] {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("name: no buffer named ", Echo(req->name()), " on ",
                                     core_->config().node));
  };
  // A broken client registration (its file shrank) is no longer the client's memory.
  if (!buffer.ok() || !(*buffer)->ExportedTo(*caller) || (*buffer)->memory().broken()) {
    if (buffer.ok()) {
      spdlog::debug("ResolveBuffer: buffer '{}' is not exported to {}", req->name(), *caller);
    }
    return unknown();
  }
  // Granted before the drain flag, the policy and the name are read (again): a revocation
  // that ran before the grant changed one of them, and this answer says so (or is refused).
  const bool revocable = core_->leases().CanGrant(*caller) &&
                         !absl::StartsWith(req->name(), kLandingNamePrefix) &&
                         !core_->engine().draining();
  if (revocable) core_->leases().Grant(req->name(), *caller);
  // A peer's new transfer to a draining node fails at its Submit, not half way through
  // (server/agent/drain.h); transfers that resolved earlier go on.
  if (core_->engine().draining()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("node ", core_->config().node,
                                     " is draining (it is shutting down) and takes no new "
                                     "transfers"));
  }
  auto again = core_->buffers().FindByName(req->name());
  if (!again.ok() || *again != *buffer) {  // freed meanwhile
    // Its free's revocation ran before the grant: take the grant back, so that no holder is
    // left for a name that went.
    if (revocable) core_->leases().Revoke({req->name()}, "freed while answering");
    return unknown();
  }
  resp->set_size((*buffer)->size());
  for (const auto& [rail, region] : (*buffer)->regions()) {
    auto* key = resp->add_keys();
    key->set_provider(rail.provider);
    key->set_nic(rail.nic);
    key->set_address(region->remote_address());
    key->set_key(region->key());
  }
  // How we take writes into it, with the provider this peer will use (the first we both
  // run: the writer picked it the same way).
  auto snapshot = core_->policies().Current();
  fabric::RailId rail = core_->fabrics().front()->rail();
  for (const auto& f : core_->fabrics()) {
    if ((*buffer)->region(f->rail()) != nullptr) {
      rail = f->rail();
      break;
    }
  }
  LegPlan leg = core_->PlanLeg(**buffer, *snapshot, rail);
  resp->set_mode(LegModeName(leg.mode));
  resp->set_reason(leg.reason);
  resp->set_nic(leg.nic);
  resp->set_path(leg.path);
  resp->set_backend(leg.backend);
  resp->set_policy_generation(snapshot->generation);
  resp->set_device((*buffer)->device());
  resp->set_incarnation(core_->incarnation());
  resp->set_revocable(revocable);
  return grpc::Status::OK;
}

grpc::Status PeerService::Revoke(grpc::ServerContext* ctx, const ferry::v1::RevokeRequest* req,
                                 ferry::v1::RevokeResponse* resp) {
  absl::StatusOr<std::string> caller = CallerNode(*ctx, req->from_node());
  if (!caller.ok()) return ToGrpcStatus(caller.status());
  // Answers are asked of, and kept for, peers in our directory only: another caller has
  // nothing here to revoke (and leaves nothing behind).
  if (!core_->peers().Known(*caller)) return grpc::Status::OK;
  std::vector<std::string> names(req->names().begin(), req->names().end());
  std::vector<std::string> lists(req->lists().begin(), req->lists().end());
  std::vector<std::weak_ptr<const RemoteList>> lists_dropped;
  auto dropped =
      core_->peers().kept_answers().Revoke(*caller, names, req->all(), lists, &lists_dropped);
  resp->set_dropped(static_cast<uint32_t>(dropped.size() + lists_dropped.size()));
  // The exporter frees the memory, or uses the blocks again, once we answer: our transfers
  // and moves on these answers finish first. Answered before the caller's deadline, so that
  // it learns either way.
  const absl::Time deadline = std::min(absl::FromChrono(ctx->deadline()) - absl::Milliseconds(200),
                                       absl::Now() + absl::Seconds(2));
  if (!ResolveCache::Drained(dropped, deadline) ||
      !ResolveCache::Drained(lists_dropped, deadline)) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        absl::StrCat("dropped ", dropped.size(), " answer(s) and ",
                                     lists_dropped.size(), " list answer(s), but a transfer ",
                                     "on one of them is still running"));
  }
  if (!dropped.empty() || !lists_dropped.empty()) {
    spdlog::debug("revoke from {} ({}): dropped {} kept answer(s) and {} list answer(s)",
                  *caller, req->reason(), dropped.size(), lists_dropped.size());
  }
  return grpc::Status::OK;
}

grpc::Status PeerService::Health(grpc::ServerContext*, const ferry::v1::HealthRequest*,
                                 ferry::v1::HealthResponse* resp) {
  resp->set_node(core_->config().node);
  resp->set_incarnation(core_->incarnation());
  return grpc::Status::OK;
}

grpc::Status PeerService::Stage(
    grpc::ServerContext* ctx,
    grpc::ServerReaderWriter<ferry::v1::StageReply, ferry::v1::StageRequest>* stream) {
  StageServiceDeps deps;
  deps.buffers = &core_->buffers();
  deps.gpus = core_->gpus();
  deps.bounce = &core_->bounce();
  deps.policies = &core_->policies();
  for (const auto& f : core_->fabrics()) deps.rails.push_back(f->rail());
  AgentCore* core = core_;
  deps.bounce_numa = [core](const Buffer& b, const PolicySnapshot& snap,
                            const fabric::RailId& rail) {
    return core->PlanLeg(b, snap, rail).bounce_numa;
  };
  return ServeStage(ctx, stream, deps);
}

}  // namespace ferry::server
