#pragma once
// libferry: the C++ client of a node's ferryd. Buffers are shared memory the agent owns;
// a Buffer maps one into this process, so filling it needs no copy through gRPC.
//
//   auto client = ferry::Client::Connect("/tmp/ferryd-node-a.sock");
//   auto buf = client->Alloc(64 << 20);
//   std::memcpy(buf->data(), tensor, 64 << 20);
//   auto result = client->Write(*buf, 0, "node-b", "kv-cache", 0, 64 << 20);

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/agent_session.h"
#include "ferry/v1/agent.grpc.pb.h"
#include "ferry/v1/tensor.pb.h"

namespace ferry {

// One agent buffer mapped into this process. Unmaps on destruction; the agent's buffer is
// freed by Client::Free, or when the client's session ends (unless allocated to persist).
class Buffer {
 public:
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  uint64_t id() const { return info_.id(); }
  const std::string& name() const { return info_.name(); }
  const std::string& device() const { return info_.device(); }
  uint64_t size() const { return info_.size(); }
  // Host buffers and simulated GPUs: a host address. CUDA GPU buffers: a device address in
  // this process (use it with CUDA, not with the CPU).
  char* data() const { return data_; }
  const ferry::v1::BufferInfo& info() const { return info_; }

  // Maps a buffer the agent described.
  static absl::StatusOr<std::unique_ptr<Buffer>> Map(const ferry::v1::BufferInfo& info);

 private:
  Buffer(ferry::v1::BufferInfo info, void* mapping, uint64_t mapping_length, char* data,
         std::string ipc_handle = "")
      : info_(std::move(info)), mapping_(mapping), mapping_length_(mapping_length), data_(data),
        ipc_handle_(std::move(ipc_handle)) {}

  ferry::v1::BufferInfo info_;
  void* mapping_;            // host mapping to munmap, or nullptr
  uint64_t mapping_length_;
  char* data_;               // host address, or device address for CUDA IPC
  std::string ipc_handle_;   // CUDA IPC handle to close, or ""
};

// One op of a batch, in the client's words.
struct OpSpec {
  ferry::v1::OpType type = ferry::v1::WRITE;
  uint64_t local_buffer = 0;
  uint64_t local_offset = 0;
  std::string peer;
  std::string remote_buffer;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

// Fills `request` (empty) to start `ops` (timeout 0: the agent's default), each remote buffer
// named once in `targets` and its ops naming it by index (Op.target).
void FillSubmitRequest(const std::vector<OpSpec>& ops, absl::Duration timeout,
                       ferry::v1::SubmitRequest* request);

class SocketLine;
class TransferLine;
class TransferStream;

class Client {
 public:
  // `target`: a Unix socket path, or "unix:PATH" / "HOST:PORT" (the opt-in TCP listener);
  // "" is this host's agent by the rule ferryctl and Python use ($FERRY_SOCKET, else
  // /tmp/ferryd-<host name>.sock: client/agent_channel.h DefaultAgentSocket).
  // Opens a session: what this client allocates is freed when the Client is destroyed or the
  // process ends, unless allocated to persist. UNAVAILABLE when no agent answers within
  // `timeout`, and at once when the socket file does not exist (the message names the path).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target = "",
                                                         absl::Duration timeout = absl::Seconds(5),
                                                         const std::string& what = "libferry");
  // A client on a session opened already (shared with a TensorClient).
  explicit Client(std::shared_ptr<AgentSession> session);

  absl::StatusOr<ferry::v1::GetInfoResponse> GetInfo();
  // `device`: "host" (default) or "cuda:N" for GPU N's pool. `persist`: the buffer outlives
  // this client's session (until someone frees it), e.g. a named target for peers.
  // `allowed_peers`: the peer nodes that may reach a named buffer (empty: every peer); to
  // the others it does not exist.
  absl::StatusOr<std::unique_ptr<Buffer>> Alloc(uint64_t size, const std::string& name = "",
                                                const std::string& device = "host",
                                                bool persist = false,
                                                const std::vector<std::string>& allowed_peers = {});
  absl::Status Free(uint64_t id);
  absl::StatusOr<std::vector<ferry::v1::BufferInfo>> ListBuffers();
  absl::StatusOr<uint64_t> StatRemoteBuffer(const std::string& node, const std::string& name);

  // Starts a batch; the whole batch is validated first. Returns the transfer id.
  absl::StatusOr<uint64_t> Submit(const std::vector<OpSpec>& ops,
                                  absl::Duration timeout = absl::ZeroDuration());
  // The transfer's result once it ended (its state says whether it succeeded), or
  // DEADLINE_EXCEEDED if it is still running after `wait`. `include_ops`: every op's
  // result, fetched page by page (each page fits gRPC's default message limit).
  absl::StatusOr<ferry::v1::TransferResult> Wait(uint64_t transfer_id, absl::Duration wait,
                                                 bool include_ops = false);
  // Ends a running transfer (its open ops fail CANCELLED); returns its result as it stands.
  absl::StatusOr<ferry::v1::TransferResult> Cancel(uint64_t transfer_id);
  // Calls `on_progress` for every update until the transfer ends.
  absl::Status Watch(uint64_t transfer_id,
                     const std::function<void(const ferry::v1::TransferProgress&)>& on_progress);

  // Submit + Wait for one batch, in one round trip; the status is the transfer's own (OK
  // when every op landed). Where the client reaches the agent's transfer socket
  // (client/socket_line.h: no gRPC on the way), batches go over it, those of more than
  // kLineOps ops on a connection of their own (so a large request never holds up a small
  // one behind it). Else a small batch rides one TransferStream call that the client's
  // threads share (client/transfer_line.h: no call set-up per transfer), and a larger one
  // has a Transfer call of its own. DEADLINE_EXCEEDED when the agent has not answered by
  // `timeout` + 5 s.
  static constexpr size_t kLineOps = 64;
  absl::StatusOr<ferry::v1::TransferResult> Run(const std::vector<OpSpec>& ops,
                                                absl::Duration timeout = absl::Seconds(60),
                                                bool include_ops = false);
  // Whether Run and OpenTransferStream may use the transfer socket (default: yes, unless the
  // environment has FERRY_TRANSFER_SOCKET=0); false keeps them on gRPC.
  void set_use_transfer_socket(bool use);

  // Tensors.MoveBlocks with `wait` in this client's session over the transfer socket, as Run
  // sends a small batch (BlockClient::Move, client/block_client.h): the response once the
  // move ended, its refusal, or DEADLINE_EXCEEDED after `wait`. nullopt where the client
  // does not reach the socket, the agent's socket takes no moves (GetInfo.
  // transfer_socket_moves) or no connection took the request: the caller then makes the
  // gRPC call.
  std::optional<absl::StatusOr<ferry::v1::MoveBlocksResponse>> MoveOnSocket(
      const ferry::v1::MoveBlocksRequest& request, absl::Duration wait);
  // Tensors.PollNotifications over the transfer socket (one Unix-socket round trip; on a
  // connection of its own, so that it never waits behind a move being started): the
  // answer or the agent's refusal. nullopt where the client does not reach the socket, the
  // agent's socket answers no polls (GetInfo.transfer_socket_polls) or no connection took
  // the request: the caller then makes the gRPC call (TensorClient::PollNotifications).
  std::optional<absl::StatusOr<ferry::v1::PollNotificationsResponse>> PollOnSocket(
      const ferry::v1::PollNotificationsRequest& request);

  // Many transfers over one stream, answered as they end (client/transfer_stream.h): for a
  // caller that issues many small ones, without a call per transfer. A connection of its
  // own to the transfer socket where the client reaches it, else a TransferStream call.
  absl::StatusOr<std::unique_ptr<TransferStream>> OpenTransferStream();

  // One WRITE (local -> peer) or READ (peer -> local), waited for.
  absl::Status Write(const Buffer& local, uint64_t local_offset, const std::string& peer,
                     const std::string& remote_buffer, uint64_t remote_offset, uint64_t length);
  absl::Status Read(const Buffer& local, uint64_t local_offset, const std::string& peer,
                    const std::string& remote_buffer, uint64_t remote_offset, uint64_t length);

  // Registers memory this process allocated itself (RegisterMemory), so that transfers move
  // it in place: [address, address + length) of a shared mapping (client/shared_memory.h
  // says which; private memory is refused with what to do instead). The registration's id
  // is a buffer id (OpSpec.local_buffer, block lists).
  absl::StatusOr<ferry::v1::RegisterMemoryResponse> RegisterMemory(
      const void* address, uint64_t length, const std::string& name = "",
      const std::vector<std::string>& allowed_peers = {});
  // [offset, offset + length) of file `fd` (a memfd, a shm file); `device` "cuda:N": the
  // memory is that GPU's, `fd` a CUDA VMM shareable handle (cuMemExportToShareableHandle,
  // POSIX fd) or, on a simulated GPU, its allocation's file; the range must then run to the
  // allocation's end (else RegisterCudaVmm, which says the allocation's size).
  absl::StatusOr<ferry::v1::RegisterMemoryResponse> RegisterFd(
      int fd, uint64_t offset, uint64_t length, const std::string& device = "host",
      const std::string& name = "", const std::vector<std::string>& allowed_peers = {});
  // [offset, offset + length) of a CUDA VMM allocation of `allocation_size` bytes
  // (cuMemCreate's size), `fd` its shareable handle (cuMemExportToShareableHandle, POSIX
  // fd) or, on a simulated GPU, its allocation's file. The agent maps the handle whole, as
  // the driver requires; RegisterFd with a "cuda:N" device does the same for a range that
  // runs to the allocation's end.
  absl::StatusOr<ferry::v1::RegisterMemoryResponse> RegisterCudaVmm(
      int fd, uint64_t allocation_size, uint64_t offset, uint64_t length,
      const std::string& device, const std::string& name = "",
      const std::vector<std::string>& allowed_peers = {});
  // GPU memory by CUDA IPC handle (cudaIpcGetMemHandle bytes), `offset` into its allocation.
  absl::StatusOr<ferry::v1::RegisterMemoryResponse> RegisterCudaIpc(
      const std::string& handle, uint64_t offset, uint64_t length, const std::string& device,
      const std::string& name = "", const std::vector<std::string>& allowed_peers = {});
  absl::Status DeregisterMemory(uint64_t id);
  // The transfer's result as it stands now (RUNNING while it runs); `failed_ops`: with the
  // failed ops' results.
  absl::StatusOr<ferry::v1::TransferResult> Poll(uint64_t transfer_id, bool failed_ops = false);

  // The GDR / staging policy, and changing it at run time (key=value settings).
  absl::StatusOr<ferry::v1::PolicyState> GetPolicy();
  // Run-time settings override the config file's policy until cleared (`clear_overrides`:
  // drop the earlier ones first; with no settings, back to the file's policy).
  absl::StatusOr<ferry::v1::PolicyState> SetPolicy(
      const std::vector<std::pair<std::string, std::string>>& settings,
      bool clear_overrides = false);

  ferry::v1::Agent::Stub& stub() { return *stub_; }
  const AgentSession& session() const { return *session_; }
  // The session, to share with a TensorClient or BlockClient.
  std::shared_ptr<AgentSession> shared_session() const { return session_; }

 private:
  // A call's context: its deadline and this client's session.
  std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout = absl::Seconds(30)) const;
  // Run on a Transfer call of its own.
  absl::StatusOr<ferry::v1::TransferResult> RunCall(const std::vector<OpSpec>& ops,
                                                    absl::Duration timeout, bool include_ops);
  // The client's transfer line; a new one when there is none yet or it ended.
  std::shared_ptr<TransferLine> Line();
  // What a connection to the transfer socket carries: small batches, large ones, polls.
  enum class SocketUse { kSmall, kBulk, kPolls };
  // Its connection to the agent's transfer socket for `use`, a new one when there is none
  // yet or it ended; null when the agent has none, the client does not reach it, or it is
  // not to be used (gRPC carries Run then).
  std::shared_ptr<SocketLine> Socket(SocketUse use);
  std::shared_ptr<SocketLine>& SocketLocked(SocketUse use) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The transfer socket's path (GetInfo.transfer_socket, asked once, waiting kSocketRetry
  // at most); "" when the agent offers none, it is off here, or it was not reached (or did
  // not answer GetInfo) within the last kSocketRetry.
  std::string TransferSocketPath();
  // A connect to it failed: gRPC carries the next kSocketRetry's transfers.
  void SocketUnreached();
  // Appends the per-op results after `result`'s page (from its ops_next), by Wait.
  absl::Status FetchRemainingOps(ferry::v1::TransferResult& result);

  // RegisterMemory for `fd`, passed over the agent's fd socket (allocation_size: 0 but for
  // a VMM handle, RegisterCudaVmm).
  absl::StatusOr<ferry::v1::RegisterMemoryResponse> RegisterDescriptor(
      int fd, uint64_t allocation_size, uint64_t offset, uint64_t length,
      const std::string& device, const std::string& name,
      const std::vector<std::string>& allowed_peers);
  // RegisterMemory with the request's memory fields set.
  absl::StatusOr<ferry::v1::RegisterMemoryResponse> Register(ferry::v1::RegisterMemoryRequest req);
  // The agent's fd socket (GetInfo.fd_socket), asked once.
  absl::StatusOr<std::string> FdSocket();

  std::shared_ptr<AgentSession> session_;
  std::unique_ptr<ferry::v1::Agent::Stub> stub_;
  absl::Mutex mu_;
  std::string fd_socket_ ABSL_GUARDED_BY(mu_);
  // After the channel and stub it uses: it ends its call when it goes.
  std::shared_ptr<TransferLine> line_ ABSL_GUARDED_BY(mu_);
  bool use_transfer_socket_ ABSL_GUARDED_BY(mu_) = true;
  // GetInfo.transfer_socket, asked once ("" when the agent has none); nullopt until then.
  std::optional<std::string> transfer_socket_ ABSL_GUARDED_BY(mu_);
  bool socket_moves_ ABSL_GUARDED_BY(mu_) = false;  // GetInfo.transfer_socket_moves
  bool socket_polls_ ABSL_GUARDED_BY(mu_) = false;  // GetInfo.transfer_socket_polls
  std::shared_ptr<SocketLine> socket_line_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<SocketLine> bulk_socket_line_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<SocketLine> poll_socket_line_ ABSL_GUARDED_BY(mu_);
  // After a connect to the transfer socket failed, Run uses gRPC until then.
  static constexpr absl::Duration kSocketRetry = absl::Seconds(1);
  absl::Time socket_retry_after_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// The transfer's own outcome as a status (OK, or the first failing op's code and message).
absl::Status TransferStatus(const ferry::v1::TransferResult& result);

}  // namespace ferry
