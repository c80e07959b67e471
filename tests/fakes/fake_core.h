#pragma once
// The inside of the fake fabric (tests/fakes/fake_fabric.h), shared by its fabric, endpoint
// and region: one Core per fabric holds its registrations, its op queue and its completion
// thread; one Link per connection. Not for tests to use directly.

#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "tests/fakes/fake_fabric.h"
#include "transport/fabric.h"

namespace ferry::fake::internal {

enum class OpKind : int { kWrite, kWriteImm, kRead };

const char* OpName(OpKind kind);

// A fault to inject `n` more times.
struct Injection {
  int n = 0;
  absl::Status status;
  bool Take(absl::Status* out) {
    if (n <= 0) return false;
    --n;
    *out = status;
    return true;
  }
};

struct Op {
  std::shared_ptr<Link> link;
  OpKind kind = OpKind::kWrite;
  uint32_t local_key = 0;  // the local region, by key in the initiator's table
  uint64_t local_offset = 0;
  uint64_t length = 0;
  fabric::RemoteSlice remote;
  uint32_t imm = 0;
  // A gathered op (PostWriteList / PostReadList): its pieces past `remote` (the base); empty
  // for a single op of `length` bytes at `local_offset` and `remote`.
  std::vector<fabric::Piece> pieces;
  fabric::Completion done;
  // Not OK: the op completes with it and touches no memory (injected, or flushed by a break).
  absl::Status fail;
};

// One registration, as the fabric that owns it knows it.
struct RegionEntry {
  char* data = nullptr;  // where byte 0 is for memcpy (device memory: its peer mapping)
  uint64_t length = 0;
  uint64_t remote_base = 0;
  uint32_t access = 0;
  int users = 0;  // accesses in progress (local or remote); Remove waits for 0
  bool removing = false;
  std::shared_ptr<char> peer_pages;  // device memory: the pinned peer-memory mapping
};

class Pin;

// Everything of one fabric that endpoints, regions and peers may reach; shared, so that a
// peer's op never touches a destroyed fabric.
struct Core {
  Core(FakeFabricOptions o, std::string a, uint64_t bias)
      : options(std::move(o)), address(std::move(a)), remote_bias(bias) {}

  bool OnThread() const { return std::this_thread::get_id() == thread_id; }

  // The completion thread: immediates for us, failed ops, then (unless held) ops to execute.
  void Run();
  bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return stopping || !immediates.empty() || !failing.empty() || (!hold && !queue.empty());
  }
  // Runs `op`'s completion with no lock held, then counts it.
  void Complete(std::unique_ptr<Op> op, absl::Status status) ABSL_LOCKS_EXCLUDED(mu);
  // Moves the bytes of one op (no lock held); the op's status.
  absl::Status Execute(Op& op) ABSL_LOCKS_EXCLUDED(mu);
  // `link` fails: its waiting ops move to `failing`, and posts are refused from now on.
  void BreakLocked(Link& link, absl::Status why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

  // Checks an access as an HCA does before it touches memory; on success `pin` holds the
  // region until it is destroyed.
  absl::Status AcquireRemote(uint32_t key, uint64_t address, uint64_t length, uint32_t access,
                             absl::FunctionRef<std::string()> what, Pin* pin)
      ABSL_LOCKS_EXCLUDED(mu);
  absl::Status AcquireLocal(uint32_t key, uint64_t offset, absl::FunctionRef<std::string()> what,
                            Pin* pin)
      ABSL_LOCKS_EXCLUDED(mu);
  void Unpin(uint32_t key) ABSL_LOCKS_EXCLUDED(mu);
  void RemoveRegion(uint32_t key) ABSL_LOCKS_EXCLUDED(mu);
  void PushImmediate(uint32_t imm) ABSL_LOCKS_EXCLUDED(mu);

  const FakeFabricOptions options;
  const std::string address;
  // Added to a region's virtual address to make its remote address (see fake_fabric.h).
  const uint64_t remote_bias;

  mutable absl::Mutex mu;
  std::mt19937 rng ABSL_GUARDED_BY(mu){std::random_device{}()};
  // Node map: RemoveRegion waits on an entry by address while others come and go.
  absl::node_hash_map<uint32_t, RegionEntry> regions ABSL_GUARDED_BY(mu);
  std::deque<std::unique_ptr<Op>> queue ABSL_GUARDED_BY(mu);    // to execute, in post order
  std::deque<std::unique_ptr<Op>> failing ABSL_GUARDED_BY(mu);  // to complete with op->fail
  std::deque<uint32_t> immediates ABSL_GUARDED_BY(mu);
  bool hold ABSL_GUARDED_BY(mu) = false;
  bool stopping ABSL_GUARDED_BY(mu) = false;
  bool serving ABSL_GUARDED_BY(mu) = true;
  bool in_handler ABSL_GUARDED_BY(mu) = false;
  Injection fail_ops ABSL_GUARDED_BY(mu);
  Injection refuse_posts ABSL_GUARDED_BY(mu);
  Injection fail_registrations ABSL_GUARDED_BY(mu);
  Injection fail_connects ABSL_GUARDED_BY(mu);
  // Connections AcceptConnect answered whose initiator has not finished yet, by nonce.
  absl::flat_hash_set<std::string> accepted ABSL_GUARDED_BY(mu);
  std::vector<std::weak_ptr<Link>> outgoing ABSL_GUARDED_BY(mu);
  std::vector<std::weak_ptr<Link>> incoming ABSL_GUARDED_BY(mu);
  fabric::Fabric::ImmediateHandler handler ABSL_GUARDED_BY(mu);
  FakeFabricStats stats ABSL_GUARDED_BY(mu);
  std::thread thread;
  std::thread::id thread_id;  // set before the thread runs anything, then constant
};

// One connection: initiator -> target. Its state is guarded by the initiator's mutex.
struct Link {
  Link(std::shared_ptr<Core> i, std::weak_ptr<Core> t, std::string p)
      : initiator(std::move(i)), target(std::move(t)), peer(std::move(p)) {}
  const std::shared_ptr<Core> initiator;
  const std::weak_ptr<Core> target;
  const std::string peer;
  absl::Status broken;  // OK while connected
  bool closed = false;
  uint64_t outstanding = 0;  // accepted ops whose completion has not returned
};

// Holds a region while an op touches it.
class Pin {
 public:
  Pin() = default;
  Pin(const Pin&) = delete;
  Pin& operator=(const Pin&) = delete;
  ~Pin() {
    if (core_ != nullptr) core_->Unpin(key_);
  }
  void Set(Core* core, uint32_t key, char* data) {
    core_ = core;
    key_ = key;
    data_ = data;
  }
  char* data() const { return data_; }

 private:
  Core* core_ = nullptr;
  uint32_t key_ = 0;
  char* data_ = nullptr;
};

// Process-wide: address -> fabric, and the contract violations every fake saw.
struct Registry {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, std::weak_ptr<Core>> fabrics ABSL_GUARDED_BY(mu);
  uint64_t next ABSL_GUARDED_BY(mu) = 1;
  std::mt19937_64 rng ABSL_GUARDED_BY(mu){std::random_device{}()};
  std::vector<std::string> violations ABSL_GUARDED_BY(mu);
};

Registry& Global();
// The live fabric at `address`, or null.
std::shared_ptr<Core> Find(const std::string& address);
// Prints and keeps a broken rule of transport/fabric.h (FakeFabric::ContractViolations).
void RecordViolation(std::string what);

// A registration. Destroying it revokes its key and waits for the accesses in progress
// (transport/fabric.h MemoryRegion); it keeps the Core alive, so one that outlives its fabric
// (a recorded violation) is harmless.
class FakeRegion : public fabric::MemoryRegion {
 public:
  FakeRegion(std::shared_ptr<Core> core, void* data, uint64_t length, uint32_t key,
             uint64_t remote_address, std::string registration)
      : core_(std::move(core)),
        data_(data),
        length_(length),
        key_(key),
        remote_address_(remote_address),
        registration_(std::move(registration)) {}
  ~FakeRegion() override { core_->RemoveRegion(key_); }

  void* data() const override { return data_; }
  uint64_t length() const override { return length_; }
  uint64_t remote_address() const override { return remote_address_; }
  uint32_t key() const override { return key_; }
  std::string registration() const override { return registration_; }
  absl::Status RestrictToLocal() override {
    if (!core_->options.restrict_to_local) return MemoryRegion::RestrictToLocal();
    absl::MutexLock lock(&core_->mu);
    auto it = core_->regions.find(key_);
    if (it != core_->regions.end()) it->second.access = fabric::kLocal;
    return absl::OkStatus();
  }
  const Core* core() const { return core_.get(); }

 private:
  const std::shared_ptr<Core> core_;
  void* const data_;
  const uint64_t length_;
  const uint32_t key_;
  const uint64_t remote_address_;
  const std::string registration_;
};

}  // namespace ferry::fake::internal
