#include "server/api/agent_service.h"

#include <unistd.h>

#include <fstream>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "server/agent/agent_core.h"
#include "server/api/await_transfer.h"
#include "server/api/info_protos.h"
#include "server/engine/op_target.h"
#include "server/api/nic_info.h"
#include "server/api/views.h"
#include "server/agent/runtime_peers.h"
#include "server/local/own_node_access.h"
#include "server/local/session_call.h"
#include "server/local/uid_quotas.h"
#include "server/api/transfer_socket.h"
#include "server/api/transfer_stream.h"
#include "server/api/unary_transfer.h"
#include "base/grpc_status.h"
#include "base/status_macros.h"
#include "server/version.h"
#include "transport/topology/plan_format.h"

namespace ferry::server {
namespace {

void FillPolicy(const PolicySnapshot& snap, ferry::v1::PolicyState* out) {
  out->set_generation(snap.generation);
  out->set_gdr(config::GdrModeName(snap.policy.gdr));
  out->set_gdr_max_path(config::PathClassName(snap.policy.gdr_max_path));
  out->set_fallback(config::FallbackName(snap.policy.fallback));
  out->set_staging_chunk_bytes(snap.policy.staging_chunk_bytes);
  out->set_staging_depth(snap.policy.staging_depth);
  for (const auto& [key, value] : snap.overrides) {
    auto* o = out->add_overrides();
    o->set_key(key);
    o->set_value(value);
  }
}

// Threads of this process, from /proc/self/status ("Threads:"); 0 if unreadable.
uint64_t ThreadCount() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    uint64_t n = 0;
    if (line.rfind("Threads:", 0) == 0 &&
        absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(8)), &n)) {
      return n;
    }
  }
  return 0;
}

ResultPage PageOf(const ferry::v1::WaitRequest& req) {
  ResultPage page;
  page.include_ops = req.include_ops();
  page.from = req.ops_from();
  page.limit = req.ops_limit();
  page.failed_only = req.failed_only();
  return page;
}

ResultPage PageOf(const ferry::v1::TransferRequest& req) {
  ResultPage page;
  page.include_ops = req.include_ops();
  page.limit = req.ops_limit();
  page.failed_only = req.failed_only();
  return page;
}

}  // namespace

absl::Status AgentService::MayUseOpBuffers(const std::optional<LocalCaller>& caller,
                                           const ferry::v1::SubmitRequest& request) {
  const LocalCallers& callers = core_->local_callers();
  if (callers.SeesAll(caller)) return absl::OkStatus();
  const std::string& self = core_->config().node;
  // A batch names a few buffers thousands of times: each is looked up once.
  absl::flat_hash_set<uint64_t> checked;
  absl::flat_hash_set<absl::string_view> checked_names;  // views into `request`
  for (int i = 0; i < request.ops_size(); ++i) {
    const uint64_t id = request.ops(i).local_buffer();
    if (checked.insert(id).second) {
      RETURN_IF_ERROR(MayUseBuffer(callers, caller, core_->buffers(), id,
                                   absl::StrCat("ops[", i, "].local_buffer")));
    }
    auto target = TargetOf(request, i);
    if (!target.ok() || *target->peer != self) continue;  // a bad target: the engine says so
    if (!checked_names.insert(*target->remote_buffer).second) continue;
    RETURN_IF_ERROR(MayReachOwnNodeBuffer(callers, caller, core_->buffers(),
                                          *target->remote_buffer,
                                          target->Field(i, "remote_buffer")));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<server::Transfer>> AgentService::OwnTransfer(
    const grpc::ServerContext& ctx, uint64_t id) {
  ASSIGN_OR_RETURN(std::shared_ptr<server::Transfer> transfer, core_->engine().Find(id));
  RETURN_IF_ERROR(core_->local_callers().MayUse(core_->local_callers().Of(ctx),
                                                transfer->owner_uid(),
                                                absl::StrCat("transfer_id: transfer ", id)));
  return transfer;
}

absl::Status AgentService::Authorize(const grpc::ServerContext& ctx, absl::string_view call) {
  return core_->local_callers().Authorize(core_->local_callers().Of(ctx), call);
}

grpc::ServerWriteReactor<ferry::v1::SessionEvent>* AgentService::OpenSession(
    grpc::CallbackServerContext* ctx, const ferry::v1::OpenSessionRequest* req) {
  return StartSessionCall(&core_->sessions(), *req, core_->local_callers().Of(*ctx));
}

grpc::Status AgentService::GetInfo(grpc::ServerContext*, const ferry::v1::GetInfoRequest*,
                                   ferry::v1::GetInfoResponse* resp) {
  resp->set_node(core_->config().node);
  resp->set_version(kFerryVersion);
  for (const auto& fabric : core_->fabrics()) resp->add_providers(fabric->provider());
  resp->set_buffer_count(core_->buffers().count());
  resp->set_host_pool_bytes(core_->pool().size());
  resp->set_host_pool_used_bytes(core_->pool().used());
  resp->set_host_buffer_bytes(core_->buffers().host_bytes());
  resp->set_sessions(core_->sessions().count());
  resp->set_pid(static_cast<uint32_t>(getpid()));
  resp->set_threads(ThreadCount());
  for (const auto& name : core_->peers().Names()) resp->add_peers(name);
  resp->set_transfers_active(core_->engine().active());
  resp->set_transfers_done(core_->engine().finished());
  auto snapshot = core_->policies().Current();
  resp->set_policy_generation(snapshot->generation);
  GpuPools* gpus = core_->gpus();
  for (size_t g = 0; gpus != nullptr && g < gpus->count(); ++g) {
    FillGpuInfo(gpus->Stats(static_cast<int>(g)), resp->add_gpus());
  }
  for (const auto& pool : core_->bounce().Stats()) FillBouncePool(pool, resp->add_bounce_pools());
  DescribeNics(*core_, resp);
  if (FdInbox* inbox = core_->fd_inbox()) {
    resp->set_fd_socket(inbox->path());
    resp->set_fds_waiting(inbox->held());
  }
  if (const TransferSocket* socket = transfer_socket_.load()) {
    resp->set_transfer_socket(socket->path());
    resp->set_transfer_socket_clients(socket->connections());
    resp->set_transfer_socket_moves(true);  // main.cc gives it TensorService::MovesFor
    resp->set_transfer_socket_polls(true);  // and TensorService::PollsFor
  }
  resp->set_registered_bytes(core_->buffers().registered_bytes());
  resp->set_block_lists(core_->tensors().blocks().count());
  resp->set_incarnation(core_->incarnation());
  resp->set_started_unix_ms(absl::ToUnixMillis(core_->started()));
  return grpc::Status::OK;
}

grpc::Status AgentService::ListPeers(grpc::ServerContext*, const ferry::v1::ListPeersRequest*,
                                     ferry::v1::ListPeersResponse* resp) {
  DescribePeers(*core_, resp);
  return grpc::Status::OK;
}

grpc::Status AgentService::ListTransfers(grpc::ServerContext* ctx,
                                         const ferry::v1::ListTransfersRequest* req,
                                         ferry::v1::ListTransfersResponse* resp) {
  if (req->recent() > 4096) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "recent: at most 4096 finished transfers are kept");
  }
  std::optional<LocalCaller> caller = core_->local_callers().Of(*ctx);
  DescribeTransfers(*core_, req->recent(), resp,
                    core_->local_callers().SeesAll(caller) ? Transfer::kUnknownOwner
                                                           : LocalCallers::OwnerUid(caller));
  return grpc::Status::OK;
}

grpc::Status AgentService::GetStats(grpc::ServerContext*, const ferry::v1::GetStatsRequest*,
                                    ferry::v1::GetStatsResponse* resp) {
  DescribeStats(*core_, resp);
  return grpc::Status::OK;
}

grpc::Status AgentService::SetNicState(grpc::ServerContext* ctx,
                                       const ferry::v1::SetNicStateRequest* req,
                                       ferry::v1::SetNicStateResponse* resp) {
  if (absl::Status allowed = Authorize(*ctx, "Agent.SetNicState"); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  auto changed = server::SetNicState(*core_, *req);
  if (!changed.ok()) return ToGrpcStatus(changed.status());
  *resp = *std::move(changed);
  return grpc::Status::OK;
}

grpc::Status AgentService::AllocBuffer(grpc::ServerContext* ctx,
                                       const ferry::v1::AllocBufferRequest* req,
                                       ferry::v1::AllocBufferResponse* resp) {
  auto session = SessionOfCall(*ctx, core_->sessions(), core_->local_callers());
  if (!session.ok()) return ToGrpcStatus(session.status());
  if (*session == 0 && !req->persist()) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "persist: a buffer allocated outside a session is never freed for you; "
                        "set persist, or open a session (OpenSession) and name it in the "
                        "\"ferry-session\" metadata");
  }
  BufferOwner owner = req->persist() ? BufferOwner{} : core_->sessions().OwnerFor(*session);
  if (std::optional<LocalCaller> caller = core_->local_callers().Of(*ctx)) {
    owner.uid = caller->uid;
    if (req->persist()) owner.label = absl::StrCat("uid ", caller->uid);
  }
  if (absl::Status room = CheckUidQuota(core_->buffers(), owner.uid, /*registered=*/false,
                                        core_->config().per_uid_buffers, "limits.per_uid_buffers");
      !room.ok()) {
    return ToGrpcStatus(room);
  }
  auto buffer =
      core_->buffers().Allocate(req->size(), req->name(), req->device(), std::move(owner),
                                {req->allowed_peers().begin(), req->allowed_peers().end()});
  if (!buffer.ok()) return ToGrpcStatus(buffer.status());
  if (!req->persist() && !core_->sessions().IsOpen(*session)) {
    // The session ended while we allocated: its sweep may have missed this one.
    core_->buffers().Free((*buffer)->id()).IgnoreError();
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "ferry-session: the session ended");
  }
  DescribeBuffer(**buffer, resp->mutable_buffer());
  return grpc::Status::OK;
}

grpc::Status AgentService::FreeBuffer(grpc::ServerContext* ctx,
                                      const ferry::v1::FreeBufferRequest* req,
                                      ferry::v1::FreeBufferResponse*) {
  return EndBuffer(*ctx, req->id(), /*registered=*/false);
}

grpc::Status AgentService::EndBuffer(const grpc::ServerContext& ctx, uint64_t id,
                                     bool registered) {
  auto session = SessionOfCall(ctx, core_->sessions(), core_->local_callers());
  if (!session.ok()) return ToGrpcStatus(session.status());
  auto buffer = core_->buffers().Get(id, "id");
  if (!buffer.ok()) return ToGrpcStatus(buffer.status());
  if ((*buffer)->memory().registered() != registered) {
    return grpc::Status(
        grpc::StatusCode::FAILED_PRECONDITION,
        absl::StrCat("id: buffer ", id,
                     registered ? " is the agent's, not registered memory (FreeBuffer)"
                                : " is the client's registered memory (DeregisterMemory)"));
  }
  absl::Status allowed = core_->local_callers().MayUse(
      core_->local_callers().Of(ctx), (*buffer)->owner_uid(), absl::StrCat("id: buffer ", id));
  if (!allowed.ok()) return ToGrpcStatus(allowed);
  std::weak_ptr<Buffer> held = *buffer;
  buffer->reset();
  // Transfers using it hold it: its memory goes when the last one finishes.
  absl::Status freed = core_->buffers().FreeFor(id, *session);
  if (!freed.ok() || !registered) return ToGrpcStatus(freed);
  // The client reuses its memory once this returns (a caching allocator, a pool of shm):
  // answer only when no transfer can touch it any more.
  const absl::Time until =
      std::min(absl::FromChrono(ctx.deadline()), absl::Now() + absl::Seconds(30));
  while (!held.expired()) {
    if (absl::Now() >= until) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrCat("id: buffer ", id,
                                       " is deregistered, but transfers still use its memory"));
    }
    absl::SleepFor(absl::Milliseconds(1));
  }
  return grpc::Status::OK;
}

grpc::Status AgentService::ListBuffers(grpc::ServerContext* ctx,
                                       const ferry::v1::ListBuffersRequest*,
                                       ferry::v1::ListBuffersResponse* resp) {
  const LocalCallers& callers = core_->local_callers();
  std::optional<LocalCaller> caller = callers.Of(*ctx);
  // Another uid's buffers are not listed (their names, sizes and owners are theirs); root
  // and the admin group see every one.
  for (const auto& b : core_->buffers().List()) {
    if (!callers.MayUse(caller, b->owner_uid(), "").ok()) continue;
    DescribeBuffer(*b, resp->add_buffers());
  }
  return grpc::Status::OK;
}

grpc::Status AgentService::StatRemoteBuffer(grpc::ServerContext* ctx,
                                            const ferry::v1::StatRemoteBufferRequest* req,
                                            ferry::v1::StatRemoteBufferResponse* resp) {
  if (!core_->peers().Known(req->node())) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("node: unknown node '", req->node(), "'"));
  }
  if (req->node() == core_->config().node) {
    if (absl::Status mine = MayReachOwnNodeBuffer(core_->local_callers(),
                                                  core_->local_callers().Of(*ctx),
                                                  core_->buffers(), req->name(), "name");
        !mine.ok()) {
      return ToGrpcStatus(mine);
    }
  }
  absl::Time deadline =
      std::min(absl::FromChrono(ctx->deadline()), absl::Now() + absl::Seconds(10));
  auto remote = core_->peers().Resolve(req->node(), req->name(), deadline);
  if (!remote.ok()) return ToGrpcStatus(remote.status());
  resp->set_size(remote->size);
  return grpc::Status::OK;
}

grpc::Status AgentService::Submit(grpc::ServerContext* ctx, const ferry::v1::SubmitRequest* req,
                                  ferry::v1::SubmitResponse* resp) {
  std::optional<LocalCaller> caller = core_->local_callers().Of(*ctx);
  if (absl::Status mine = MayUseOpBuffers(caller, *req); !mine.ok()) {
    return ToGrpcStatus(mine);
  }
  auto id = core_->engine().Submit(*req, {}, {}, LocalCallers::OwnerUid(caller));
  if (!id.ok()) return ToGrpcStatus(id.status());
  resp->set_transfer_id(*id);
  return grpc::Status::OK;
}

grpc::Status AgentService::Wait(grpc::ServerContext* ctx, const ferry::v1::WaitRequest* req,
                                ferry::v1::TransferResult* resp) {
  auto transfer = OwnTransfer(*ctx, req->transfer_id());
  if (!transfer.ok()) return ToGrpcStatus(transfer.status());
  // poll: answer now; wait_ms: at most that long; either answers RUNNING rather than failing.
  if (req->poll() || req->wait_ms() > 0) {
    absl::Time until = req->poll() ? absl::Now() : absl::Now() + absl::Milliseconds(req->wait_ms());
    return AwaitTransferResult(ctx, **transfer, PageOf(*req), resp, until);
  }
  return AwaitTransferResult(ctx, **transfer, PageOf(*req), resp);
}

AgentService::AgentService(AgentCore* core) : core_(core) {
  SetMessageAllocatorFor_Transfer(&transfer_messages_);
}

class AgentService::CallerTransfers final : public TransferCalls {
 public:
  // A start may run on starters_ after the call ended: it uses the caller as it was when
  // the call began, never the call.
  CallerTransfers(AgentService* service, std::optional<LocalCaller> caller)
      : service_(service), caller_(std::move(caller)) {}

  absl::StatusOr<uint64_t> Start(const ferry::v1::TransferRequest& req,
                                 AnswerFn answer) const override {
    RETURN_IF_ERROR(service_->MayUseOpBuffers(caller_, req.submit()));
    // No thread waits for it: the engine's finished hook answers, on the thread that settled
    // the last op.
    return service_->core_->engine().Submit(
        req.submit(),
        [page = PageOf(req), answer = std::move(answer)](const server::Transfer& t) {
          answer(t.Result(page));
        },
        {}, LocalCallers::OwnerUid(caller_));
  }

  // Submit blocks only to ask a peer: to resolve a remote buffer that is not kept (the
  // engine's Plan, once per buffer), or for its rails when the last answer is old (Post);
  // an unknown peer is refused without a call.
  std::optional<std::string> MayBlockOn(const ferry::v1::TransferRequest& req) const override {
    PeerDirectory& peers = service_->core_->peers();
    const std::string* peer = nullptr;
    const std::string* name = nullptr;
    const ferry::v1::SubmitRequest& submit = req.submit();
    for (int i = 0; i < submit.ops_size(); ++i) {
      auto target = TargetOf(submit, i);
      if (!target.ok()) return std::nullopt;  // refused by Plan, which asks no peer first
      if (peer && *peer == *target->peer && *name == *target->remote_buffer) continue;
      const bool new_peer = !peer || *peer != *target->peer;
      peer = target->peer;
      name = target->remote_buffer;
      if (!peers.Known(*peer)) continue;
      // The lane is the first peer it would ask: a batch to a hung peer and a healthy one
      // waits in the hung one's lane, as it would wait for it anyway.
      if (new_peer && !peers.RailsFresh(*peer)) return *peer;
      if (!peers.Kept(*peer, *name)) return *peer;
    }
    return std::nullopt;
  }

 private:
  AgentService* const service_;
  const std::optional<LocalCaller> caller_;
};

std::shared_ptr<const TransferCalls> AgentService::CallsFor(std::optional<LocalCaller> caller) {
  return std::make_shared<CallerTransfers>(this, std::move(caller));
}

grpc::ServerUnaryReactor* AgentService::Transfer(grpc::CallbackServerContext* ctx,
                                                 const ferry::v1::TransferRequest* req,
                                                 ferry::v1::TransferResult* resp) {
  return StartUnaryTransfer(ctx, req, resp, &starters_,
                            CallsFor(core_->local_callers().Of(*ctx)));
}

grpc::ServerBidiReactor<ferry::v1::StreamedTransfer, ferry::v1::StreamedResults>*
AgentService::TransferStream(grpc::CallbackServerContext* ctx) {
  return StartTransferStream(&starters_, CallsFor(core_->local_callers().Of(*ctx)));
}

grpc::Status AgentService::Cancel(grpc::ServerContext* ctx,
                                  const ferry::v1::CancelTransferRequest* req,
                                  ferry::v1::TransferResult* resp) {
  if (auto mine = OwnTransfer(*ctx, req->transfer_id()); !mine.ok()) {
    return ToGrpcStatus(mine.status());
  }
  auto transfer = core_->engine().Cancel(req->transfer_id());
  if (!transfer.ok()) return ToGrpcStatus(transfer.status());
  *resp = (*transfer)->Result();
  return grpc::Status::OK;
}

grpc::Status AgentService::Watch(grpc::ServerContext* ctx, const ferry::v1::WatchRequest* req,
                                 grpc::ServerWriter<ferry::v1::TransferProgress>* writer) {
  auto transfer = OwnTransfer(*ctx, req->transfer_id());
  if (!transfer.ok()) return ToGrpcStatus(transfer.status());
  uint64_t version = 0;
  while (true) {
    ferry::v1::TransferProgress p = (*transfer)->Progress(&version);
    if (!writer->Write(p)) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    if (p.state() != ferry::v1::RUNNING) return grpc::Status::OK;
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "client went away");
    // At most ~20 updates a second, however many ops complete.
    (*transfer)->AwaitChange(version, absl::Now() + absl::Milliseconds(500));
    absl::SleepFor(absl::Milliseconds(50));
  }
}

grpc::Status AgentService::GetTopology(grpc::ServerContext*, const ferry::v1::GetTopologyRequest*,
                                       ferry::v1::GetTopologyResponse* resp) {
  topology::TopologyPlan plan = core_->plan();
  resp->set_text(topology::FormatPlanText(core_->machine(), plan));
  resp->set_json(topology::FormatPlanJson(core_->machine(), plan));
  return grpc::Status::OK;
}

grpc::Status AgentService::GetPolicy(grpc::ServerContext*, const ferry::v1::GetPolicyRequest*,
                                     ferry::v1::PolicyState* resp) {
  FillPolicy(*core_->policies().Current(), resp);
  return grpc::Status::OK;
}

grpc::Status AgentService::SetPolicy(grpc::ServerContext* ctx,
                                     const ferry::v1::SetPolicyRequest* req,
                                     ferry::v1::PolicyState* resp) {
  if (absl::Status allowed = Authorize(*ctx, "Agent.SetPolicy"); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  std::vector<std::pair<std::string, std::string>> settings;
  for (const auto& s : req->settings()) settings.emplace_back(s.key(), s.value());
  if (settings.empty() && !req->clear_overrides()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "settings: nothing to set");
  }
  auto snapshot = core_->policies().Apply(settings, req->clear_overrides());
  if (!snapshot.ok()) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("settings: ", snapshot.status().message(), " (policy unchanged)"));
  }
  // Peers' kept answers say how we took writes under the old policy.
  core_->leases().RevokeAll("policy changed");
  FillPolicy(**snapshot, resp);
  return grpc::Status::OK;
}

grpc::Status AgentService::AddPeer(grpc::ServerContext* ctx, const ferry::v1::AddPeerRequest* req,
                                   ferry::v1::PeerChange* resp) {
  if (absl::Status allowed = Authorize(*ctx, "Agent.AddPeer"); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  auto change = AddRuntimePeer(core_->peers(), *req);
  if (!change.ok()) return ToGrpcStatus(change.status());
  *resp = *std::move(change);
  return grpc::Status::OK;
}

grpc::Status AgentService::RemovePeer(grpc::ServerContext* ctx,
                                      const ferry::v1::RemovePeerRequest* req,
                                      ferry::v1::PeerChange* resp) {
  if (absl::Status allowed = Authorize(*ctx, "Agent.RemovePeer"); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  auto change = RemoveRuntimePeer(core_->peers(), *req);
  if (!change.ok()) return ToGrpcStatus(change.status());
  *resp = *std::move(change);
  return grpc::Status::OK;
}

}  // namespace ferry::server
