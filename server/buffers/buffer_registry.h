#pragma once
// The agent's buffers: host pool memory or GPU pool memory, registered with the fabrics
// that can reach it, known by id and (optionally) by name, owned by the client session
// that allocated them (or by nobody: they persist until freed). Transfers in flight hold a
// shared_ptr, so freeing a buffer in use waits for them: the memory and the fabric key live
// until the last op that touches it lets go.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/buffers/buffer_memory.h"
#include "server/buffers/registration.h"
#include "transport/fabric.h"
#include "transport/memory/host_pool.h"

namespace ferry::server {

class GpuPools;

// Who a buffer belongs to: a local client's session, which frees it when it ends, or
// nobody (session 0): it persists until someone frees it.
struct BufferOwner {
  uint64_t session = 0;
  std::string label;  // "session 3 (ferryctl, pid 1234)", for ListBuffers
  // The uid of the local client that allocated it (SO_PEERCRED); -1: not known (over
  // local_tcp, or made by the agent itself). Only that uid, root or the admin group may
  // free it, map it or move its bytes (server/local/local_callers.h).
  int64_t uid = -1;
};

class Buffer {
 public:
  Buffer(uint64_t id, std::string name, std::unique_ptr<BufferMemory> memory,
         BufferRegistrations registrations, BufferOwner owner,
         std::vector<std::string> allowed_peers = {})
      : id_(id), name_(std::move(name)), allowed_peers_(std::move(allowed_peers)),
        memory_(std::move(memory)), regions_(std::move(registrations.regions)),
        attempts_(std::move(registrations.attempts)), owner_(std::move(owner)) {}

  uint64_t id() const { return id_; }
  const std::string& name() const { return name_; }
  // The peer nodes a named buffer is exported to; empty: every authenticated peer.
  const std::vector<std::string>& allowed_peers() const { return allowed_peers_; }
  // Whether peer `node` may resolve and reach it (a named buffer that lists it, or lists
  // nobody). Unnamed buffers are exported to nobody.
  bool ExportedTo(const std::string& node) const;
  // The owning session (0: the buffer persists). Changes only through BufferRegistry.
  uint64_t owner() const;
  std::string owner_label() const;
  int64_t owner_uid() const;
  uint64_t size() const { return memory_->size(); }
  char* data() const { return memory_->data(); }
  std::string device() const { return memory_->device(); }
  int gpu() const { return memory_->gpu(); }
  std::string backend() const { return memory_->backend(); }
  const BufferMemory& memory() const { return *memory_; }
  // The registration with `rail`'s fabric; nullptr if it has none (a GPU buffer the fabric
  // cannot reach directly).
  const fabric::MemoryRegion* region(const fabric::RailId& rail) const;
  // (rail, region) for every fabric the buffer is registered with.
  const RegionList& regions() const { return regions_; }
  // How each fabric registration of GPU memory went, or why it did not.
  const std::vector<RegistrationAttempt>& attempts() const { return attempts_; }
  // The fd socket that lends this buffer's file to its owner (BufferMemory::LendFile,
  // server/local/fd_inbox.h), for the client's ShmMapping; "" when the agent has none. Set
  // by the registry before anyone else sees the buffer.
  const std::string& fd_socket() const { return fd_socket_; }

 private:
  const uint64_t id_;
  const std::string name_;
  const std::vector<std::string> allowed_peers_;
  // Declared before regions_ so it is destroyed after them: every key is revoked (and
  // remote accesses drained) before the memory goes back to its pool.
  std::unique_ptr<BufferMemory> memory_;
  RegionList regions_;
  const std::vector<RegistrationAttempt> attempts_;
  friend class BufferRegistry;  // hands a buffer to another owner (Adopt); sets fd_socket_
  std::string fd_socket_;
  mutable absl::Mutex owner_mu_;
  BufferOwner owner_ ABSL_GUARDED_BY(owner_mu_);
};

// "cuda:3" -> 3, "host" or "" -> -1; INVALID_ARGUMENT naming "device" for anything else.
absl::StatusOr<int> GpuIndexOf(const std::string& device);

// The longest buffer name (a longer one names no buffer, and is refused as such).
inline constexpr size_t kMaxBufferName = 256;
// Names the agent gives a receive's landing buffer: written once by one sender, then
// unexported. Their ResolveBuffer answers are not kept (a revocation per receive would
// cost every receive a peer call).
inline constexpr char kLandingNamePrefix[] = "ferry.recv.";

class BufferRegistry {
 public:
  // The fabrics a buffer's memory is registered with (server/buffers/fabric_rails.h: the
  // NICs that may carry it).
  using FabricsFor = std::function<std::vector<fabric::Fabric*>(const BufferMemory&)>;
  // Host buffers are registered with each of the fabrics `fabrics_for` names for them; GPU
  // buffers (from `gpus`, which may be null) with each of those that can reach GPU memory
  // directly.
  BufferRegistry(memory::HostPool* pool, GpuPools* gpus, FabricsFor fabrics_for)
      : pool_(pool), gpus_(gpus), fabrics_for_(std::move(fabrics_for)) {}
  // Every buffer with every one of `fabrics`.
  BufferRegistry(memory::HostPool* pool, GpuPools* gpus, std::vector<fabric::Fabric*> fabrics)
      : BufferRegistry(pool, gpus, [fabrics](const BufferMemory&) { return fabrics; }) {}

  // Called with the names that stop being exported (Free, FreeFor, FreeOwnedBy, Unexport),
  // outside the registry's lock and before the registry lets go of the buffers: peers that
  // kept an answer for a name are told (server/peers/export_leases.h) while its keys still
  // reach it. Set once before use; an empty function (teardown) calls nothing.
  using Unexported = std::function<void(const std::vector<std::string>& names)>;
  void OnUnexport(Unexported hook) {
    absl::MutexLock lock(&mu_);
    on_unexport_ = std::move(hook);
  }

  // Ids count from `first` (base/run_ids.h: a run's own range, so that an id a client of
  // an earlier run still names is not a new client's buffer); from 1 unless set. Set once,
  // before the first buffer is made.
  void StartIdsAt(uint64_t first) {
    absl::MutexLock lock(&mu_);
    first_id_ = next_id_ = first;
  }

  // Buffers made from here on say that their files are lent by the fd socket `path`
  // (Buffer::fd_socket). Set once, when the fd socket starts.
  void LendFilesThrough(std::string path) {
    absl::MutexLock lock(&mu_);
    fd_socket_ = std::move(path);
  }

  // `device`: "" or "host", or "cuda:N". Named buffers are exported to peers (remote read
  // and write): to those in `allowed_peers`, or to every peer when it is empty; unnamed ones
  // to nobody. The scope holds on the tcp data plane too (MemoryRegion::RestrictToPeers);
  // verbs cannot scope an rkey, so there only ResolveBuffer's refusal keeps the key from
  // others. ALREADY_EXISTS for a name in use, NOT_FOUND for a GPU this agent does not have,
  // RESOURCE_EXHAUSTED when the pool is full, INVALID_ARGUMENT for allowed peers of an
  // unnamed buffer.
  absl::StatusOr<std::shared_ptr<Buffer>> Allocate(uint64_t size, const std::string& name,
                                                   const std::string& device = "host",
                                                   BufferOwner owner = {},
                                                   std::vector<std::string> allowed_peers = {});
  // A buffer over memory the agent did not allocate (a client's registration), registered
  // with the fabrics as Allocate's are and checked the same way (name, allowed peers). Its
  // fabric keys allow remote access even unnamed, so that the registration needs no second
  // one when a named block list exports it; unnamed, no peer can resolve it.
  absl::StatusOr<std::shared_ptr<Buffer>> AddClientMemory(
      std::unique_ptr<BufferMemory> memory, const std::string& name, BufferOwner owner,
      std::vector<std::string> allowed_peers = {});
  // Frees whoever owns it (the agent's own bookkeeping). NOT_FOUND for an unknown or
  // already freed id.
  absl::Status Free(uint64_t id);
  // Free on behalf of `session` (0: a caller outside any session): PERMISSION_DENIED for
  // a buffer another session owns; persisting buffers anyone may free.
  static constexpr uint64_t kAnySession = ~0ull;
  absl::Status FreeFor(uint64_t id, uint64_t session);
  // Frees every buffer `session` owns (the session ended). Returns how many.
  size_t FreeOwnedBy(uint64_t session);
  // Gives buffer `id` to `owner` (a receive's landing buffer to the receiving client).
  absl::Status Adopt(uint64_t id, BufferOwner owner);
  // Stops exporting a named buffer: peers can no longer resolve its name, and remote
  // access is taken from its registrations where the provider can (tcp); the buffer stays
  // usable locally. NOT_FOUND for an unknown id.
  absl::Status Unexport(uint64_t id);
  // NOT_FOUND naming `field` ("ops[3].local_buffer") for an unknown or freed id.
  absl::StatusOr<std::shared_ptr<Buffer>> Get(uint64_t id, const std::string& field) const;
  // The GPUs its GPU buffers live on (null: none), for whoever reads their bytes by copy.
  GpuPools* gpus() const { return gpus_; }
  absl::StatusOr<std::shared_ptr<Buffer>> FindByName(const std::string& name) const;
  std::vector<std::shared_ptr<Buffer>> List() const;
  size_t count() const;
  // Bytes of the live host buffers as the host pool counts them (rounded up to its
  // alignment): the pool's used bytes once no transfer holds a freed buffer.
  uint64_t host_bytes() const;
  // Bytes of the live client registrations (BufferMemory::registered).
  uint64_t registered_bytes() const;

 private:
  // NOT_FOUND naming `field`: "was freed" for an id we handed out, else "does not exist".
  absl::Status Unknown(const std::string& field, uint64_t id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Allocate's and AddClientMemory's checks of a name and its peers, before any memory is taken.
  absl::Status CheckExport(const std::string& name,
                           const std::vector<std::string>& allowed_peers) const;
  // Registers `memory` with its fabrics (`access`) and files it under a new id.
  absl::StatusOr<std::shared_ptr<Buffer>> Insert(std::unique_ptr<BufferMemory> memory,
                                                 uint32_t access, const std::string& name,
                                                 BufferOwner owner,
                                                 std::vector<std::string> allowed_peers);
  // Drops `buffer`'s name from by_name_ if the name still maps to it; true when it did.
  bool ForgetName(const Buffer& buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs on_unexport_ (copied under the lock) for `names`, if any.
  void TellUnexported(const std::vector<std::string>& names) ABSL_LOCKS_EXCLUDED(mu_);

  memory::HostPool* const pool_;
  GpuPools* const gpus_;
  const FabricsFor fabrics_for_;
  mutable absl::Mutex mu_;
  uint64_t first_id_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::shared_ptr<Buffer>> by_id_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint64_t> by_name_ ABSL_GUARDED_BY(mu_);
  Unexported on_unexport_ ABSL_GUARDED_BY(mu_);
  std::string fd_socket_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::server
