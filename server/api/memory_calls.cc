// The Agent service's calls for clients' own memory: RegisterMemory and DeregisterMemory
// (server/buffers/client_memory.h does the mapping and importing).

#include "absl/strings/str_cat.h"
#include "base/grpc_status.h"
#include "server/agent/agent_core.h"
#include "server/api/agent_service.h"
#include "server/api/info_protos.h"
#include "server/local/session_call.h"
#include "server/local/uid_quotas.h"

namespace ferry::server {

grpc::Status AgentService::RegisterMemory(grpc::ServerContext* ctx,
                                          const ferry::v1::RegisterMemoryRequest* req,
                                          ferry::v1::RegisterMemoryResponse* resp) {
  auto session = SessionOfCall(*ctx, core_->sessions(), core_->local_callers());
  if (!session.ok()) return ToGrpcStatus(session.status());
  std::optional<LocalCaller> caller = core_->local_callers().Of(*ctx);
  ClientMemorySpec spec;
  // The ticket first: another uid's is refused (and stays its owner's) whatever else is wrong.
  if (req->fd_ticket() != 0) {
    if (!caller || core_->fd_inbox() == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "fd_ticket: descriptors are taken only from clients on the agent's "
                          "local socket (not over local_tcp)");
    }
    auto fd = core_->fd_inbox()->Take(req->fd_ticket(), caller->uid);
    if (!fd.ok()) return ToGrpcStatus(fd.status());
    spec.fd = *std::move(fd);
  }
  if (*session == 0) {
    // Nothing else would end it: the memory is the client's, and lives as long as it does.
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "ferry-session: memory is registered for a session (OpenSession), "
                        "which ends the registration when the client goes");
  }
  spec.ipc_handle = req->cuda_ipc_handle();
  spec.offset = req->offset();
  spec.length = req->length();
  spec.allocation_size = req->allocation_size();
  spec.device = req->device().empty() ? "host" : req->device();
  spec.name = req->name();
  spec.allowed_peers.assign(req->allowed_peers().begin(), req->allowed_peers().end());
  BufferOwner owner = core_->sessions().OwnerFor(*session);
  if (caller) owner.uid = caller->uid;
  if (absl::Status room = CheckUidQuota(core_->buffers(), owner.uid, /*registered=*/true,
                                        core_->config().per_uid_registrations,
                                        "limits.per_uid_registrations");
      !room.ok()) {
    return ToGrpcStatus(room);
  }
  auto registered = core_->client_memory().Register(std::move(spec), std::move(owner));
  if (!registered.ok()) return ToGrpcStatus(registered.status());
  if (!core_->sessions().IsOpen(*session)) {
    // The session ended while we registered: its sweep may have missed this one.
    core_->buffers().Free(registered->buffer->id()).IgnoreError();
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "ferry-session: the session ended");
  }
  DescribeBuffer(*registered->buffer, resp->mutable_buffer());
  resp->set_existing(registered->existing);
  return grpc::Status::OK;
}

grpc::Status AgentService::DeregisterMemory(grpc::ServerContext* ctx,
                                            const ferry::v1::DeregisterMemoryRequest* req,
                                            ferry::v1::DeregisterMemoryResponse*) {
  return EndBuffer(*ctx, req->id(), /*registered=*/true);
}

}  // namespace ferry::server
