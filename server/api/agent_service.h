#pragma once
// The Agent gRPC service (local clients). Thin: checks request fields, calls the agent's
// parts, converts absl::Status to grpc::Status. Sync API: Wait and Watch block a server
// thread by design (they wait for a transfer); everything else returns at once.
// OpenSession, Transfer and TransferStream are callback methods: a session is an idle call
// that holds no thread, and a transfer is answered by the engine when it ends.

#include <atomic>
#include <optional>

#include "absl/time/time.h"
#include "base/worker_pool.h"
#include "ferry/v1/agent.grpc.pb.h"
#include "server/engine/transfer.h"
#include "server/local/local_callers.h"
#include "server/api/transfer_calls.h"
#include "server/api/unary_transfer.h"

namespace ferry::server {

class AgentCore;
class TransferSocket;

class AgentService final
    : public ferry::v1::Agent::WithCallbackMethod_OpenSession<
          ferry::v1::Agent::WithCallbackMethod_TransferStream<
              ferry::v1::Agent::WithCallbackMethod_Transfer<ferry::v1::Agent::Service>>> {
 public:
  explicit AgentService(AgentCore* core);

  grpc::ServerWriteReactor<ferry::v1::SessionEvent>* OpenSession(
      grpc::CallbackServerContext*, const ferry::v1::OpenSessionRequest*) override;
  grpc::Status GetInfo(grpc::ServerContext*, const ferry::v1::GetInfoRequest*,
                       ferry::v1::GetInfoResponse*) override;
  grpc::Status SetNicState(grpc::ServerContext*, const ferry::v1::SetNicStateRequest*,
                           ferry::v1::SetNicStateResponse*) override;
  grpc::Status ListPeers(grpc::ServerContext*, const ferry::v1::ListPeersRequest*,
                         ferry::v1::ListPeersResponse*) override;
  grpc::Status ListTransfers(grpc::ServerContext*, const ferry::v1::ListTransfersRequest*,
                             ferry::v1::ListTransfersResponse*) override;
  grpc::Status GetStats(grpc::ServerContext*, const ferry::v1::GetStatsRequest*,
                        ferry::v1::GetStatsResponse*) override;
  grpc::Status AllocBuffer(grpc::ServerContext*, const ferry::v1::AllocBufferRequest*,
                           ferry::v1::AllocBufferResponse*) override;
  grpc::Status FreeBuffer(grpc::ServerContext*, const ferry::v1::FreeBufferRequest*,
                          ferry::v1::FreeBufferResponse*) override;
  grpc::Status ListBuffers(grpc::ServerContext*, const ferry::v1::ListBuffersRequest*,
                           ferry::v1::ListBuffersResponse*) override;
  grpc::Status StatRemoteBuffer(grpc::ServerContext*, const ferry::v1::StatRemoteBufferRequest*,
                                ferry::v1::StatRemoteBufferResponse*) override;
  grpc::Status Submit(grpc::ServerContext*, const ferry::v1::SubmitRequest*,
                      ferry::v1::SubmitResponse*) override;
  grpc::Status Wait(grpc::ServerContext*, const ferry::v1::WaitRequest*,
                    ferry::v1::TransferResult*) override;
  grpc::ServerUnaryReactor* Transfer(grpc::CallbackServerContext*,
                                     const ferry::v1::TransferRequest*,
                                     ferry::v1::TransferResult*) override;
  grpc::ServerBidiReactor<ferry::v1::StreamedTransfer, ferry::v1::StreamedResults>*
  TransferStream(grpc::CallbackServerContext*) override;
  grpc::Status Cancel(grpc::ServerContext*, const ferry::v1::CancelTransferRequest*,
                      ferry::v1::TransferResult*) override;
  grpc::Status Watch(grpc::ServerContext*, const ferry::v1::WatchRequest*,
                     grpc::ServerWriter<ferry::v1::TransferProgress>*) override;
  grpc::Status GetTopology(grpc::ServerContext*, const ferry::v1::GetTopologyRequest*,
                           ferry::v1::GetTopologyResponse*) override;
  grpc::Status GetPolicy(grpc::ServerContext*, const ferry::v1::GetPolicyRequest*,
                         ferry::v1::PolicyState*) override;
  grpc::Status SetPolicy(grpc::ServerContext*, const ferry::v1::SetPolicyRequest*,
                         ferry::v1::PolicyState*) override;
  grpc::Status AddPeer(grpc::ServerContext*, const ferry::v1::AddPeerRequest*,
                       ferry::v1::PeerChange*) override;
  // memory_calls.cc: clients' own memory.
  grpc::Status RegisterMemory(grpc::ServerContext*, const ferry::v1::RegisterMemoryRequest*,
                              ferry::v1::RegisterMemoryResponse*) override;
  grpc::Status DeregisterMemory(grpc::ServerContext*, const ferry::v1::DeregisterMemoryRequest*,
                                ferry::v1::DeregisterMemoryResponse*) override;
  grpc::Status RemovePeer(grpc::ServerContext*, const ferry::v1::RemovePeerRequest*,
                          ferry::v1::PeerChange*) override;

  // How Transfer, TransferStream and the transfer socket start the requests of `caller`
  // (nullopt: a local_tcp caller, known by its certificate only).
  std::shared_ptr<const TransferCalls> CallsFor(std::optional<LocalCaller> caller);
  // Where they start the requests that may block.
  WorkerPool* starters() { return &starters_; }
  // The transfer socket GetInfo reports; null until main starts it (and in tests of the
  // service without one).
  void set_transfer_socket(const TransferSocket* socket) { transfer_socket_.store(socket); }

 private:
  // CallsFor's calls: Submit for one caller, checked against what it may use.
  class CallerTransfers;

  // FreeBuffer (an agent buffer) and DeregisterMemory (`registered` memory): the caller's
  // session and uid may end it; FAILED_PRECONDITION naming the other call for the other kind.
  grpc::Status EndBuffer(const grpc::ServerContext& ctx, uint64_t id, bool registered);
  // PERMISSION_DENIED naming the op when a local caller names another uid's buffer (root
  // and the admin group may): its local buffer, or its remote one when the op's peer is this
  // node (server/local/own_node_access.h). The engine validates the rest.
  absl::Status MayUseOpBuffers(const std::optional<LocalCaller>& caller,
                               const ferry::v1::SubmitRequest& request);
  // The transfer `id` when `ctx`'s caller may act on it (its submitter, root, the admin
  // group); NOT_FOUND or PERMISSION_DENIED naming transfer_id else.
  absl::StatusOr<std::shared_ptr<server::Transfer>> OwnTransfer(const grpc::ServerContext& ctx,
                                                                uint64_t id);
  // Operator calls (server/local/call_rules.h): OK for root, the admin group, local_tcp.
  absl::Status Authorize(const grpc::ServerContext& ctx, absl::string_view call);

  AgentCore* const core_;
  // Atomic: GetInfo over local_tcp may run while main sets it.
  std::atomic<const TransferSocket*> transfer_socket_{nullptr};
  // Each Transfer call's request and result, in kept arenas.
  TransferMessages transfer_messages_;
  // Where the Transfer and TransferStream requests that may block start: Submit asks a peer
  // to resolve a buffer not kept yet, or for its rails (blocking calls), which gRPC's
  // callback threads must not make. Declared last, so it stops (running what is queued)
  // before the rest of the service goes.
  WorkerPool starters_{kTransferStarters, "ferry-start", kStartersPerPeer};
};

}  // namespace ferry::server
