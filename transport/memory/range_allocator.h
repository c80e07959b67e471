#pragma once
// Carves a pool [0, capacity) into aligned ranges: first fit, neighbours coalesce on free.
// Not thread-safe; the pool that owns it locks.

#include <cstdint>
#include <map>

#include "absl/status/statusor.h"

namespace ferry::memory {

class RangeAllocator {
 public:
  RangeAllocator(uint64_t capacity, uint64_t alignment);

  // Offset of a new range of `size` bytes (rounded up to the alignment).
  // RESOURCE_EXHAUSTED when no free range is large enough.
  absl::StatusOr<uint64_t> Allocate(uint64_t size);
  // Returns a range from Allocate. INVALID_ARGUMENT for an offset it did not hand out.
  absl::Status Free(uint64_t offset);

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_; }
  uint64_t largest_free() const;
  // 0 when all free space is one range; towards 1 as it splinters (1 - largest / total free).
  double fragmentation() const;

 private:
  uint64_t RoundUp(uint64_t size) const;

  const uint64_t capacity_;
  const uint64_t alignment_;
  uint64_t used_ = 0;
  std::map<uint64_t, uint64_t> free_;   // offset -> size
  std::map<uint64_t, uint64_t> taken_;  // offset -> size
};

}  // namespace ferry::memory
