#pragma once
// Device address ranges and the host mapping behind each: how the simulation turns a device
// address, which the CPU cannot touch, into bytes that the one component allowed to move
// them can reach (a simulated GPU's copy engine; a NIC through peer_memory.h). A lookup
// checks bounds the way the hardware does: the whole range must lie in one live range.
//
// Thread-safe.

#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace ferry::memory {

class DeviceRanges {
 public:
  // Makes [device, device + length) reachable through `bytes` (its first byte; the pointer
  // owns that mapping). ALREADY_EXISTS when it overlaps a range already added,
  // INVALID_ARGUMENT when empty or wrapping.
  absl::Status Add(const void* device, uint64_t length, std::shared_ptr<char> bytes);
  // Forgets the range that starts at `device`. Bytes already handed out stay mapped until
  // their holders let go.
  void Remove(const void* device);

  // The bytes behind [address, address + length): a pointer to the byte at `address` that
  // keeps its mapping alive while held. Null when no one range holds all of it.
  std::shared_ptr<char> Find(const void* address, uint64_t length) const;

 private:
  struct Range {
    uint64_t length;
    std::shared_ptr<char> bytes;
  };
  mutable absl::Mutex mu_;
  std::map<uint64_t, Range> ranges_ ABSL_GUARDED_BY(mu_);  // by device start address
};

}  // namespace ferry::memory
