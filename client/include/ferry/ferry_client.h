#pragma once
// libferry: the C++ client of a node's ferryd, as installed (<ferry/ferry_client.h>, CMake
// `find_package(ferry CONFIG)` -> ferry::client, or pkg-config `ferry`). Needs only the
// standard library and absl. Buffers are shared memory the agent owns; a Buffer maps one
// into this process, so filling it needs no copy through gRPC.
//
//   auto client = ferry::Client::Connect().value();     // this host's agent
//   auto buf = client->Alloc(64 << 20).value();
//   std::memcpy(buf->data(), tensor, 64 << 20);
//   absl::Status s = client->Write(*buf, 0, "node-b", "kv-cache", 0, 64 << 20);
//
// examples/cpp/ is a whole program. Every call returns absl::Status(Or); the codes are the
// agent's gRPC codes and the messages name what was wrong (a batch's refusal names the op
// and field). A Client may be used from several threads at once. A Client lives within one
// run of the agent: after a restart its calls answer UNAVAILABLE (Client::connected()).

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ferry/types.h"
#include "ferry/version.h"

namespace ferry {
inline namespace sdk {

class Client;

// One agent buffer mapped into this process. Unmaps on destruction; the agent's buffer is
// freed by Client::Free, or when the client's session ends (unless allocated to persist).
class Buffer {
 public:
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  uint64_t id() const { return info_.id; }
  const std::string& name() const { return info_.name; }
  const std::string& device() const { return info_.device; }
  uint64_t size() const { return info_.size; }
  // Host buffers and simulated GPUs: a host address. CUDA GPU buffers: a device address in
  // this process (use it with CUDA, not with the CPU).
  char* data() const { return data_; }
  const BufferInfo& info() const { return info_; }

 private:
  friend class Client;
  struct Mapping;  // the mapping libferry holds
  Buffer(std::unique_ptr<Mapping> mapping, BufferInfo info, char* data);

  std::unique_ptr<Mapping> mapping_;
  BufferInfo info_;
  char* data_;
};

class Client {
 public:
  // `target`: a Unix socket path, or "unix:PATH" / "HOST:PORT" (the agent's opt-in TCP
  // listener); "" is this host's agent: $FERRY_SOCKET, else /tmp/ferryd-<host name>.sock,
  // as ferryctl and Python look. Opens a session: what this client allocates or registers
  // is released when the Client is destroyed or the process ends, unless allocated to
  // persist. UNAVAILABLE when no agent answers within `timeout`, and at once when the socket
  // file does not exist (the message names the path and how to point at another agent).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& target = "",
                                                         absl::Duration timeout = absl::Seconds(5));
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client();

  // Whether this Client's session with its agent is open. It ends with the agent's run:
  // once the agent was killed, crashed or restarted (a new run on the same socket knows
  // nothing of it), this is false for good, and every call answers UNAVAILABLE at once,
  // without asking any agent, naming the run that went away (incarnation, start time). The
  // session's buffers, registrations and the notifications waiting for it went with that
  // run; a Buffer still mapped stays valid memory here (writing or destroying it is safe),
  // but no agent reads it any more. Connect again for a new Client and allocate and
  // register again: this Client does not reconnect by itself. True is no promise about the
  // next call (the agent may go meanwhile); that call then says so.
  bool connected() const;

  absl::StatusOr<AgentInfo> GetInfo();

  // Buffers of the agent's pools (host, or "cuda:N" in options.device), mapped here.
  absl::StatusOr<std::unique_ptr<Buffer>> Alloc(uint64_t size, const AllocOptions& options = {});
  absl::Status Free(uint64_t id);
  // Every buffer and registration this client may see (its own, and named ones).
  absl::StatusOr<std::vector<BufferInfo>> ListBuffers();
  // The size of the buffer `name` on `node` (NOT_FOUND when the node does not export it
  // to this one).
  absl::StatusOr<uint64_t> StatRemoteBuffer(const std::string& node, const std::string& name);

  // Memory this process allocated itself, so that transfers move it in place:
  // [address, address + length) of a MAP_SHARED mapping (a memfd, POSIX shm or a shared
  // file); private memory (malloc) is refused with what to do instead.
  absl::StatusOr<Registration> RegisterMemory(const void* address, uint64_t length,
                                              const std::string& name = "",
                                              const std::vector<std::string>& allowed_peers = {});
  // [offset, offset + length) of file `fd` (a memfd, a shm file).
  absl::StatusOr<Registration> RegisterFd(int fd, uint64_t offset, uint64_t length,
                                          const std::string& name = "",
                                          const std::vector<std::string>& allowed_peers = {});
  absl::Status DeregisterMemory(uint64_t id);

  // One WRITE (local -> peer) or READ (peer -> local) of `length` bytes, waited for.
  absl::Status Write(const Buffer& local, uint64_t local_offset, const std::string& peer,
                     const std::string& remote_buffer, uint64_t remote_offset, uint64_t length);
  absl::Status Read(const Buffer& local, uint64_t local_offset, const std::string& peer,
                    const std::string& remote_buffer, uint64_t remote_offset, uint64_t length);

  // A batch, validated whole before anything moves, in one round trip; the result's code is
  // the transfer's own (kOk when every op landed: TransferStatus). `include_ops`: every
  // op's result. DEADLINE_EXCEEDED when the agent has not answered by `timeout` + 5 s.
  absl::StatusOr<TransferResult> Run(const std::vector<Op>& ops,
                                     absl::Duration timeout = absl::Seconds(60),
                                     bool include_ops = false);
  // The same batch started and followed by id: Submit returns at once; Wait returns the
  // result once the transfer ended or DEADLINE_EXCEEDED after `wait`; Poll answers as it
  // stands (kRunning while it runs; with the failed ops' results); Cancel ends it.
  absl::StatusOr<uint64_t> Submit(const std::vector<Op>& ops,
                                  absl::Duration timeout = absl::ZeroDuration());
  absl::StatusOr<TransferResult> Wait(uint64_t transfer_id, absl::Duration wait,
                                      bool include_ops = false);
  absl::StatusOr<TransferResult> Poll(uint64_t transfer_id);
  absl::StatusOr<TransferResult> Cancel(uint64_t transfer_id);

  // KV-cache blocks: writes each block of local buffer `local_buffer` (an id: a Buffer's or a
  // registration's) into the peer's buffer `remote_buffer`, then, if `notification` is not
  // empty, delivers it to the peer's agent once every block landed; returns then, with the
  // bytes written. `notification_payload` travels with the notification (Notification::
  // payload there): at most 4096 bytes, and only with a notification named, else
  // INVALID_ARGUMENT naming notification_payload before anything moves. It comes last so
  // that the calls written before it (libferry 0.1) still compile.
  absl::StatusOr<uint64_t> WriteBlocks(uint64_t local_buffer, const std::string& peer,
                                       const std::string& remote_buffer,
                                       const std::vector<Block>& blocks,
                                       const std::string& notification = "",
                                       absl::Duration timeout = absl::Seconds(60),
                                       const std::string& notification_payload = "");
  // On the receiving node: takes notification `name` (from `from_node` if not empty),
  // waiting at most `timeout`. A notification of a batch that failed comes back as its
  // error.
  absl::StatusOr<Notification> WaitNotification(const std::string& name,
                                                const std::string& from_node = "",
                                                absl::Duration timeout = absl::Seconds(60));
  // Takes every pending notification whose name starts with `prefix` (at most `max_count`;
  // 0: all), oldest first, without waiting: none when none is there. One round trip on the
  // agent's transfer socket where the client reaches it. A notification of a batch that
  // failed is not told apart here: WaitNotification says so.
  absl::StatusOr<std::vector<Notification>> PollNotifications(const std::string& prefix = "",
                                                              uint32_t max_count = 0);

  // The GDR / staging policy, and run-time settings (key, value) over the config file's
  // (`clear_overrides`: drop the earlier ones first; none: back to the file's policy).
  absl::StatusOr<PolicyState> GetPolicy();
  absl::StatusOr<PolicyState> SetPolicy(
      const std::vector<std::pair<std::string, std::string>>& settings,
      bool clear_overrides = false);

 private:
  struct Session;  // the agent connection libferry holds
  explicit Client(std::unique_ptr<Session> session);

  std::unique_ptr<Session> session_;
};

// The transfer's own outcome as a status: OK once it succeeded, DEADLINE_EXCEEDED while it
// runs, else the first failing op's code and message.
absl::Status TransferStatus(const TransferResult& result);

// The version of the libferry this program runs with (FERRY_VERSION is the headers').
const char* Version();

}  // namespace sdk
}  // namespace ferry
