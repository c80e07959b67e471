#pragma once
// Range checks that cannot overflow, for offsets and lengths that come off the wire.

#include <cstdint>

namespace ferry {

// [offset, offset + length) lies inside [0, size).
inline bool RangeFits(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

}  // namespace ferry
