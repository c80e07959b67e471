#pragma once
// The target side's registrations: key -> memory, with the checks an HCA makes before it
// touches memory (key known, range inside the region, access allowed), plus one an HCA
// cannot make: the region may be exported to some peers only.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "transport/tcp/wire.h"

namespace ferry::tcp {

// Why Acquire did not give access: the target's own record (counters, log). Peers are told
// only Refusal::kRefused, whatever the reason (wire.h).
// kFaulted: the region's memory went away under an earlier op (Access::MarkFaulted): its op
// is answered Refusal::kFault and the connection goes on.
enum class RegionCheck { kOk, kUnknownKey, kOutOfBounds, kAccess, kPeer, kFaulted };

class RegionTable {
 public:
  // Held while a remote op touches a region; Remove() waits for all of them.
  class Access {
   public:
    Access() = default;
    Access(RegionTable* table, uint32_t key, char* data, bool may_shrink)
        : table_(table), key_(key), data_(data), may_shrink_(may_shrink) {}
    Access(Access&& other) noexcept
        : table_(std::exchange(other.table_, nullptr)), key_(other.key_), data_(other.data_),
          may_shrink_(other.may_shrink_) {}
    Access& operator=(Access&&) = delete;
    ~Access() {
      if (table_ != nullptr) table_->Release(key_);
    }
    char* data() const { return data_; }
    // Registered with fabric::kMayShrink: its memory may go away under the op.
    bool may_shrink() const { return may_shrink_; }
    // The op found the memory gone: later ops on the region are answered kFault.
    void MarkFaulted() {
      if (table_ != nullptr) table_->MarkFaulted(key_);
    }

   private:
    RegionTable* table_ = nullptr;
    uint32_t key_ = 0;
    char* data_ = nullptr;
    bool may_shrink_ = false;
  };

  // Adds a region that peers address from `address` and whose bytes are at `memory` (the
  // same pointer for host memory; for device memory, its peer-memory mapping), and returns
  // its new key: random, non-zero and unique in the table, so that a peer cannot guess the
  // keys of regions it was not given (sequential keys were found by scanning in 0.01 s).
  // Fails only when the kernel gives no random bytes.
  absl::StatusOr<uint32_t> Add(const char* address, char* memory, uint64_t length,
                               uint32_t access);

  // Revokes `key`; returns once no remote op is inside the region.
  void Remove(uint32_t key);
  // Changes what remote ops may do from now on.
  void SetAccess(uint32_t key, uint32_t access);
  // The peer nodes whose connections may reach the region from now on; empty: every
  // admitted peer.
  void SetAllowedPeers(uint32_t key, const std::vector<std::string>& nodes);

  // Validates a request, from a connection admitted for peer node `peer`, for
  // [address, address+length) needing `access`. On kOk `out` holds the first byte and pins
  // the region until it is destroyed.
  RegionCheck Acquire(uint32_t key, uint64_t address, uint64_t length, uint32_t access,
                      const std::string& peer, std::optional<Access>& out);

 private:
  struct Entry {
    uint64_t address;  // what peers put in their requests for byte 0
    char* memory;      // where byte 0 is
    uint64_t length;
    uint32_t access;
    absl::flat_hash_set<std::string> allowed_peers;  // empty: all
    int users = 0;
    bool removing = false;
    bool faulted = false;
  };
  void Release(uint32_t key);
  void MarkFaulted(uint32_t key);

  absl::Mutex mu_;
  // Node map: Remove() waits on an entry by address while others are added.
  absl::node_hash_map<uint32_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ferry::tcp
