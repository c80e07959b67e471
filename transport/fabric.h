#pragma once
// The fabric interface: verbs-shaped one-sided memory access, written once for every
// provider (tcp now, verbs on rdma-core next). The engine talks only to these classes.
//
// Shape, as in ibverbs: register memory -> region with a key; connect -> endpoint; post
// WRITE / WRITE-with-immediate / READ against (remote address, key); each posted op
// completes exactly once.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "transport/completion.h"
#include "transport/parts_completion.h"
#include "transport/rail_id.h"

namespace ferry::fabric {

// What a region lets the fabric do with it. Peers get only what a buffer's role needs.
enum Access : uint32_t {
  kLocal = 0,             // source of our writes / destination of our reads
  kRemoteWrite = 1u << 0, // peers may WRITE into it
  kRemoteRead = 1u << 1,  // peers may READ from it
  // Device (GPU) memory the CPU cannot touch: providers must move it by DMA only (verbs:
  // never IBV_SEND_INLINE, whose data libmlx5 copies with the CPU) and a provider that
  // moves bytes with the CPU (tcp) refuses to register it, unless a peer-memory client maps
  // it (transport/memory/peer_memory.h; only the simulation's GPUs are mapped there).
  kDeviceMemory = 1u << 2,
  // Memory another process may shrink under us (a client's file it can truncate, not sealed
  // against it): a provider that moves its bytes with the CPU must fail the op that finds it
  // gone, never fault or drop a connection other ops share (tcp: EFAULT is that op's error,
  // and a READ answered from it is copied under a FaultGuard, base/fault_guard.h). DMA
  // providers (verbs) ignore it: the NIC reports such an access as a completion error.
  kMayShrink = 1u << 3,
};

// Memory registered with one fabric. Destroying it revokes the key: new remote accesses are
// refused, and the destructor waits for remote accesses already in progress to finish, so
// the memory may be released right after.
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  virtual void* data() const = 0;
  virtual uint64_t length() const = 0;
  // What a peer puts in RemoteSlice to reach byte 0 (verbs: the virtual address).
  virtual uint64_t remote_address() const = 0;
  // The key a peer must present (verbs: rkey).
  virtual uint32_t key() const = 0;
  // How the memory was registered, for results and `ferryctl` (e.g. "tcp", "ibv_reg_mr").
  virtual std::string registration() const = 0;
  // Takes remote access away (the buffer stops being exported); local use goes on and
  // remote accesses already in progress finish. UNIMPLEMENTED where the provider cannot
  // change access in place.
  virtual absl::Status RestrictToLocal() {
    return absl::UnimplementedError(registration() + ": access cannot be changed in place");
  }
  // Scopes the region to peers: from now on only connections AcceptConnect admitted for a
  // node in `nodes` (PeerInstance::node) may reach it; empty: every admitted peer. Others
  // are refused as a bad key is. UNIMPLEMENTED where the provider cannot: verbs cannot
  // scope an rkey to some QPs without memory windows (type 2 MWs bound per QP, which ferry
  // does not use), so there the agent relies on ResolveBuffer not handing the key out.
  virtual absl::Status RestrictToPeers(const std::vector<std::string>& nodes) {
    return absl::UnimplementedError(registration() + ": cannot limit a key to some peers");
  }
};

// A byte range of one of our regions.
struct LocalSlice {
  const MemoryRegion* region = nullptr;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Where an op lands on (or reads from) the peer: address within an exported region + key.
struct RemoteSlice {
  uint64_t address = 0;
  uint32_t key = 0;
};

// One piece of a gathered op (Endpoint::PostWriteList): `length` bytes at `local_offset` of
// the op's local region and at `remote_offset` past the op's remote base. What the scattered
// blocks of a paged KV cache become: many pieces between the same two regions.
struct Piece {
  uint64_t local_offset = 0;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

// Completion (what runs when a posted op is done): transport/completion.h.

// A connection to one peer's fabric. Thread-safe: any thread may post.
class Endpoint {
 public:
  virtual ~Endpoint() = default;

  // Each Post either returns an error now (the op was not accepted, `done` never runs) or
  // returns OK and `done` runs later. `src`/`dst` must stay registered until `done` runs.
  virtual absl::Status PostWrite(const LocalSlice& src, const RemoteSlice& dst,
                                 Completion done) = 0;
  // Like PostWrite; after the data has landed the peer's immediate handler sees `imm`.
  virtual absl::Status PostWriteWithImmediate(const LocalSlice& src, const RemoteSlice& dst,
                                              uint32_t imm, Completion done) = 0;
  virtual absl::Status PostRead(const LocalSlice& dst, const RemoteSlice& src,
                                Completion done) = 0;

  // Gathered ops: every piece between `region` and the peer's region at `base` (its byte 0
  // and key), as one op with one completion, which is OK when every piece landed. The pieces
  // may land in any order, and when the op fails some may have landed and others not (verbs:
  // a chain of WRs stops at the first error): the caller treats all of them as failed. The
  // span is read during the call only. Refused now, as a single op is: an empty list or an
  // empty piece -> INVALID_ARGUMENT, a piece outside `region` -> OUT_OF_RANGE.
  // By default each piece is its own op (joined into one completion); providers that can
  // move them together (tcp: one request, one frame table, one ack) override it.
  virtual absl::Status PostWriteList(const MemoryRegion* region, const RemoteSlice& base,
                                     std::span<const Piece> pieces, Completion done) {
    return PostPieces(false, region, base, pieces, std::move(done));
  }
  virtual absl::Status PostReadList(const MemoryRegion* region, const RemoteSlice& base,
                                    std::span<const Piece> pieces, Completion done) {
    return PostPieces(true, region, base, pieces, std::move(done));
  }

  // True once the connection failed; posts then return UNAVAILABLE and the owner should
  // connect again.
  virtual bool broken() const = 0;

  // Fails every outstanding op (UNAVAILABLE) and closes the connection. Idempotent; returns
  // after every completion has run.
  virtual void Close() = 0;

  // The list checks every provider makes before it accepts a gathered op (see PostWriteList):
  // OK, or the error to refuse it with. `provider` prefixes the message.
  static absl::Status CheckPieces(const std::string& provider, const MemoryRegion* region,
                                  std::span<const Piece> pieces) {
    if (pieces.empty()) return absl::InvalidArgumentError(provider + ": an empty piece list");
    if (region == nullptr) return absl::OutOfRangeError(provider + ": no local region");
    for (const Piece& p : pieces) {
      if (p.length == 0) return absl::InvalidArgumentError(provider + ": an empty piece");
      if (p.local_offset > region->length() || p.length > region->length() - p.local_offset) {
        return absl::OutOfRangeError(provider + ": local piece [" + std::to_string(p.local_offset) +
                                     ", +" + std::to_string(p.length) + ") is outside its region");
      }
    }
    return absl::OkStatus();
  }

 private:
  // The default gathered op: a single op per piece, their completions joined. A piece
  // refused after others were accepted fails the op through the joined completion.
  absl::Status PostPieces(bool read, const MemoryRegion* region, const RemoteSlice& base,
                          std::span<const Piece> pieces, Completion done) {
    if (absl::Status ok = CheckPieces("fabric", region, pieces); !ok.ok()) return ok;
    auto joined =
        std::make_shared<PartsCompletion>(static_cast<int>(pieces.size()), std::move(done));
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      const LocalSlice local{region, p.local_offset, p.length};
      const RemoteSlice remote{base.address + p.remote_offset, base.key};
      Completion part = [joined](absl::Status s) { joined->PartDone(std::move(s)); };
      absl::Status s = read ? PostRead(local, remote, std::move(part))
                            : PostWrite(local, remote, std::move(part));
      if (s.ok()) continue;
      if (i == 0) return s;  // nothing accepted: refused now, `done` never runs
      for (size_t rest = i; rest < pieces.size(); ++rest) joined->PartDone(s);
      break;
    }
    return absl::OkStatus();
  }
};

// The initiator's half of a connection handshake. The bytes travel to the peer's agent
// through the Peer gRPC Connect call (no separate socket), which answers with the target's
// half: verbs exchanges QP number, PSN, LID/GID and MTU this way; tcp asks for a session and
// gets the secret its data sockets must present (transport/tcp/session_secrets.h).
class PendingConnection {
 public:
  virtual ~PendingConnection() = default;
  // What the peer's Fabric::AcceptConnect must see.
  virtual const std::string& request() const = 0;
  // Completes the connection with the peer's reply.
  virtual absl::StatusOr<std::shared_ptr<Endpoint>> Finish(const std::string& reply) = 0;
};

// A DMA-BUF that exports memory (GPU memory through cuMemGetHandleForAddressRange): the
// bytes [offset, offset+length) of `fd`.
struct DmabufHandle {
  int fd = -1;
  uint64_t offset = 0;
};

// Who is connecting, as the agent's peer service knows it: the node name and that agent's
// incarnation (new on every restart; 0 = unknown). A provider whose target-side resources
// outlive a silent peer (verbs: an RC QP never notices that its initiator is gone) frees
// those of an older incarnation of the same node when a newer one connects.
struct PeerInstance {
  std::string node;
  uint64_t incarnation = 0;
};

// One provider instance on this node: owns the registrations and accepts peers.
class Fabric {
 public:
  virtual ~Fabric() = default;

  virtual std::string provider() const = 0;
  // The provider and NIC this instance runs on: what buffers and bounce chunks key their
  // registrations by. Providers bound to one NIC name it (verbs: the device).
  virtual RailId rail() const { return {provider(), ""}; }
  // What peers pass to Connect (tcp: "host:port" of the data listener).
  virtual std::string address() const = 0;
  // OK while the fabric can carry traffic; UNAVAILABLE with the reason while it cannot
  // (verbs: the port went down, the device was lost), when new connections are refused
  // and the agent offers peers its other fabrics. Any thread; cheap.
  virtual absl::Status health() const { return absl::OkStatus(); }

  // Registers [data, data+length). The region must not outlive the fabric.
  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> Register(void* data, uint64_t length,
                                                                 uint32_t access) = 0;
  // Registers memory exported as a DMA-BUF, addressed locally and by peers at `data` (its
  // virtual address). The fd may be closed after the call. UNIMPLEMENTED for providers that
  // cannot (tcp: it only moves host memory it can map).
  virtual absl::StatusOr<std::unique_ptr<MemoryRegion>> RegisterDmabuf(
      void* data, uint64_t length, const DmabufHandle& dmabuf, uint32_t access) {
    return absl::UnimplementedError(provider() + ": DMA-BUF registration is not supported");
  }

  // Initiator: starts a connection to the peer whose Hello advertised `peer_address` for
  // this provider.
  virtual absl::StatusOr<std::unique_ptr<PendingConnection>> BeginConnect(
      const std::string& peer_address) = 0;
  // Target: answers the request of initiator `from` (verbs: creates and readies its QP; tcp:
  // issues the session secret its data sockets must present). The reply goes back through
  // the same Connect call. `from` must be the authenticated peer: the connection is admitted
  // as that node, and RestrictToPeers scopes regions by it.
  virtual absl::StatusOr<std::string> AcceptConnect(const std::string& request,
                                                    const PeerInstance& from) = 0;

  // Endpoints an initiator opens to one peer fabric through this one, to stripe over
  // (verbs: `qps_per_peer` RC QPs; tcp: 1, its endpoint stripes over its own sockets).
  virtual uint32_t endpoints_per_peer() const { return 1; }

  // What peers moved through this fabric into and out of our memory (tcp counts the
  // frames it serves; verbs: the port's counters, where the NIC does the work unseen).
  struct Served {
    uint64_t written_bytes = 0;  // peers' WRITEs into our regions
    uint64_t read_bytes = 0;     // peers' READs from our regions
    uint64_t ops = 0;
  };
  virtual Served served() const { return {}; }

  // Takes the fabric out of service for a while (an operator's `ferryctl nics down`, a
  // NIC under maintenance): health() answers UNAVAILABLE with `why`, incoming
  // connections are closed and new ones refused, so peers' ops through it fail UNAVAILABLE
  // and move to their other rails. Our own endpoints and regions stay. Resume undoes it.
  // UNIMPLEMENTED where the provider cannot.
  virtual absl::Status Suspend(const std::string& why) {
    return absl::UnimplementedError(provider() + ": cannot be suspended");
  }
  virtual void Resume() {}

  // Stops serving peers: refuses new incoming connections and closes the ones there are,
  // so that their ops in flight fail UNAVAILABLE (a stopping agent) rather than as revoked
  // keys once the agent frees its buffers. Our own endpoints and regions stay usable.
  // Idempotent; the agent calls it first when it stops.
  virtual void StopServing() {}

  // Called on a provider thread for every WRITE-with-immediate that landed in our memory.
  // Set it before peers connect: verbs keeps receives posted only on connections accepted
  // while a handler is set, and elsewhere the initiator's PostWriteWithImmediate fails
  // FAILED_PRECONDITION.
  using ImmediateHandler = std::function<void(uint32_t imm)>;
  virtual void SetImmediateHandler(ImmediateHandler handler) = 0;

  // Called on a provider thread when the keys of the fabric's regions changed (verbs: its
  // device came back and every region was registered again): answers peers kept with the old
  // keys must go. Providers whose keys never change never call it.
  virtual void SetKeysChangedHandler(std::function<void(const std::string& why)> handler) {}
};

}  // namespace ferry::fabric

namespace ferry::fabric {

// The whole handshake between two fabrics in one process (tests, benchmarks).
inline absl::StatusOr<std::shared_ptr<Endpoint>> ConnectDirect(Fabric& initiator, Fabric& target,
                                                               const PeerInstance& from = {}) {
  auto pending = initiator.BeginConnect(target.address());
  if (!pending.ok()) return pending.status();
  auto reply = target.AcceptConnect((*pending)->request(), from);
  if (!reply.ok()) return reply.status();
  return (*pending)->Finish(*reply);
}

}  // namespace ferry::fabric
