#pragma once
// An in-process fabric for unit tests (never linked into ferryd): fabrics in one process find
// each other by address, and ops really move bytes, with memcpy, between their regions. It
// keeps every promise of transport/fabric.h and refuses what the real providers refuse, so a
// test that passes here does not lean on leniency the hardware lacks:
//
// - Register checks its arguments as ibv_reg_mr(3) does (null address, zero length, unknown
//   access bits: EINVAL -> INVALID_ARGUMENT); keys are random, never 0, unique per fabric.
//   remote_address() is NOT the virtual address (a random per-fabric bias is added), so code
//   that hands peers a local pointer instead of remote_address() fails here. Device memory
//   (kDeviceMemory) registers only where the peer-memory table maps it (a simulated GPU's,
//   transport/memory/peer_memory.h; otherwise FAILED_PRECONDITION, as tcp), and its bytes
//   then move through that mapping, never through the device address.
// - Post refuses now, as the tcp and verbs providers do (tests/fabric_conformance_test.cc):
//   a null region, an empty slice or one outside its region -> OUT_OF_RANGE; a region of
//   another fabric (verbs: an lkey of another PD) -> INVALID_ARGUMENT; a broken or closed
//   endpoint -> UNAVAILABLE; more than `max_outstanding` ops (ibv_post_send(3): ENOMEM, send
//   queue full) -> RESOURCE_EXHAUSTED.
// - The target checks what an HCA checks before it touches memory: key unknown or revoked
//   -> PERMISSION_DENIED; range outside the region -> OUT_OF_RANGE; access the region was not
//   registered for -> PERMISSION_DENIED; the target's memory is untouched in every case.
// - Completions run exactly once per accepted op, on the initiating fabric's completion thread,
//   never on the posting thread and never under a lock of the fake. Ops run in posting order.
// - Close() fails outstanding ops UNAVAILABLE and returns after their completions ran.
//   Destroying a region revokes its key and waits for accesses in progress.
// - Breaking the rules of the contract that cannot be refused at the call (a region that
//   outlives its fabric, a local region destroyed while an op still uses it) is recorded in
//   ContractViolations(); the op concerned fails FAILED_PRECONDITION (verbs: the WR completes
//   with IBV_WC_LOC_PROT_ERR, which the provider maps so).
//
// Fault injection and live accounting are on FakeFabric and FakeEndpoint below.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/fabric.h"

namespace ferry::fake {

struct FakeFabricOptions {
  // What provider() says, and so the name buffers and plans know the fabric by.
  std::string provider = "fake";
  // RegisterDmabuf registers `data` like Register (the fake reads no DMA-BUF, but checks the
  // fd is open: ibv_reg_dmabuf_mr(3) fails with EBADF); off: UNIMPLEMENTED, as tcp.
  bool dmabuf = false;
  // RestrictToLocal works in place (tcp); off: UNIMPLEMENTED (verbs cannot re-register).
  bool restrict_to_local = true;
  // A refused op breaks the endpoint, as an R_Key violation moves a verbs QP to the error
  // state; the ops behind it then fail UNAVAILABLE. Off: the endpoint survives (tcp).
  bool refusal_breaks_endpoint = false;
  // Ops one endpoint may have outstanding (0: unlimited); one more is RESOURCE_EXHAUSTED.
  uint32_t max_outstanding = 0;
};

// Live counters of one fabric, read with FakeFabric::stats().
struct FakeFabricStats {
  // Our side, as initiator.
  uint64_t posts = 0;          // ops accepted (Post returned OK)
  uint64_t refused_posts = 0;  // Post returned an error
  uint64_t completions = 0;    // completions that ran (== posts once idle)
  uint64_t failed_completions = 0;
  uint64_t outstanding = 0;     // accepted, completion not yet returned
  uint64_t held = 0;            // of those, waiting for ReleaseCompletions()
  uint64_t bytes_written = 0;   // landed in peers' memory by our WRITEs
  uint64_t bytes_read = 0;      // read from peers into our memory
  uint64_t live_endpoints = 0;  // endpoints we initiated and have not closed
  uint64_t connects = 0;        // endpoints we initiated, in all
  // Our side, as target.
  uint64_t registrations = 0;       // successful Register / RegisterDmabuf, in all
  uint64_t live_regions = 0;        // regions not yet destroyed
  uint64_t remote_accesses = 0;     // peers' ops that touched our memory
  uint64_t remote_refusals = 0;     // peers' ops we refused (key, range, access)
  uint64_t immediates = 0;          // delivered to our immediate handler
  uint64_t incoming_endpoints = 0;  // peers' endpoints to us, open
};

namespace internal {
struct Core;
struct Link;
enum class OpKind : int;
}  // namespace internal

class FakeFabric : public fabric::Fabric {
 public:
  explicit FakeFabric(FakeFabricOptions options = {});
  // Stops serving, breaks our endpoints (their ops fail UNAVAILABLE) and joins the completion
  // thread. Regions still alive are a contract violation (transport/fabric.h: "The region
  // must not outlive the fabric"); they are recorded and stay harmless.
  ~FakeFabric() override;
  FakeFabric(const FakeFabric&) = delete;
  FakeFabric& operator=(const FakeFabric&) = delete;

  // --- fabric::Fabric ---
  std::string provider() const override;
  // Unique in the process ("fake-<provider>-<n>"); BeginConnect finds the fabric by it.
  std::string address() const override;
  absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> Register(void* data, uint64_t length,
                                                                 uint32_t access) override;
  absl::StatusOr<std::unique_ptr<fabric::MemoryRegion>> RegisterDmabuf(
      void* data, uint64_t length, const fabric::DmabufHandle& dmabuf, uint32_t access) override;
  // UNAVAILABLE when no fabric has that address (tcp: connection refused).
  absl::StatusOr<std::unique_ptr<fabric::PendingConnection>> BeginConnect(
      const std::string& peer_address) override;
  // INVALID_ARGUMENT for a request BeginConnect did not make for this fabric; UNAVAILABLE
  // once StopServing ran.
  absl::StatusOr<std::string> AcceptConnect(const std::string& request,
                                            const fabric::PeerInstance& from) override;
  void StopServing() override;
  void SetImmediateHandler(ImmediateHandler handler) override;

  // --- fault injection ---
  // Ops accepted on our endpoints wait, untouched (no byte moves, no completion), until
  // ReleaseCompletions(): a stalled network, for deadline and cancel paths. Close() and
  // breaks still fail held ops (UNAVAILABLE) at once.
  void HoldCompletions();
  void ReleaseCompletions();
  // Waits until at least `n` ops are held; false on timeout.
  bool AwaitHeld(uint64_t n, absl::Duration timeout);
  // The next `n` ops accepted on our endpoints complete with `status` (no byte moves).
  void FailNextOps(int n, absl::Status status);
  // The next `n` posts on our endpoints return `status` now (not accepted).
  void RefuseNextPosts(int n, absl::Status status);
  // The next `n` Register / RegisterDmabuf calls return `status`.
  void FailNextRegistrations(int n, absl::Status status);
  // The next `n` BeginConnect calls return `status`.
  void FailNextConnects(int n, absl::Status status);
  // Every endpoint we initiated breaks now, as a link failure would: outstanding ops fail
  // UNAVAILABLE, later posts are refused UNAVAILABLE. New connections still work.
  void BreakEndpoints();

  // --- inspection ---
  FakeFabricStats stats() const;
  // Waits until no op of ours is outstanding and no immediate is waiting; false on timeout.
  bool AwaitIdle(absl::Duration timeout);
  // What every fake in this process recorded as broken contract, and a reset for the next test.
  static std::vector<std::string> ContractViolations();
  static void ClearContractViolations();

 private:
  std::shared_ptr<internal::Core> core_;
};

// What FakeFabric connections are; reach it with std::dynamic_pointer_cast<FakeEndpoint>.
class FakeEndpoint : public fabric::Endpoint {
 public:
  explicit FakeEndpoint(std::shared_ptr<internal::Link> link);
  // Closes: a dropped endpoint fails its ops like a closed one.
  ~FakeEndpoint() override;

  absl::Status PostWrite(const fabric::LocalSlice& src, const fabric::RemoteSlice& dst,
                         fabric::Completion done) override;
  absl::Status PostWriteWithImmediate(const fabric::LocalSlice& src, const fabric::RemoteSlice& dst,
                                      uint32_t imm, fabric::Completion done) override;
  absl::Status PostRead(const fabric::LocalSlice& dst, const fabric::RemoteSlice& src,
                        fabric::Completion done) override;
  // One op for the whole list (FakeFabricStats counts it once), its pieces landing in order
  // until one is refused, as an HCA runs a chain of WRs.
  absl::Status PostWriteList(const fabric::MemoryRegion* region, const fabric::RemoteSlice& base,
                             std::span<const fabric::Piece> pieces,
                             fabric::Completion done) override;
  absl::Status PostReadList(const fabric::MemoryRegion* region, const fabric::RemoteSlice& base,
                            std::span<const fabric::Piece> pieces,
                            fabric::Completion done) override;
  bool broken() const override;
  void Close() override;

  // Breaks this connection now, as a link failure would: outstanding ops fail UNAVAILABLE
  // (saying `why`), later posts are refused UNAVAILABLE.
  void Break(const std::string& why = "broken by the test");
  const std::string& peer_address() const;

 private:
  absl::Status PostList(internal::OpKind kind, const fabric::MemoryRegion* region,
                        const fabric::RemoteSlice& base, std::span<const fabric::Piece> pieces,
                        fabric::Completion done);
  // `pieces` make it a gathered op; `local` is then the whole region.
  absl::Status Post(internal::OpKind kind, const fabric::LocalSlice& local,
                    const fabric::RemoteSlice& remote, uint32_t imm, fabric::Completion done,
                    std::vector<fabric::Piece> pieces = {});

  std::shared_ptr<internal::Link> link_;
};

}  // namespace ferry::fake
