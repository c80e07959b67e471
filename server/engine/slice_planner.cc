#include "server/engine/slice_planner.h"

#include <algorithm>

namespace ferry::server {

std::vector<SliceRange> PlanSlices(uint64_t length, uint64_t slice_bytes) {
  constexpr uint64_t kAlign = 4096;
  slice_bytes = std::max(slice_bytes / kAlign * kAlign, kAlign);
  if (length <= slice_bytes) return {{0, length}};
  uint64_t count = (length + slice_bytes - 1) / slice_bytes;
  // Equal pieces, rounded up to the alignment: never more than slice_bytes each.
  uint64_t piece = ((length + count - 1) / count + kAlign - 1) / kAlign * kAlign;
  std::vector<SliceRange> out;
  out.reserve(count);
  for (uint64_t offset = 0; offset < length; offset += piece) {
    out.push_back({offset, std::min(piece, length - offset)});
  }
  return out;
}

}  // namespace ferry::server
