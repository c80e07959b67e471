#pragma once
// How a direct op is cut into slices: pieces of at most `slice_bytes`, so that the slices
// of concurrent transfers to one peer can take turns on the wire (a 4 KiB op then waits
// for a few slices, not behind a whole 4 GiB batch). A pure function.

#include <cstdint>
#include <vector>

namespace ferry::server {

struct SliceRange {
  uint64_t offset = 0;  // from the op's start
  uint64_t length = 0;
};

// Slices of an op of `length` bytes (> 0): one when it fits `slice_bytes`, else equal
// pieces of at most `slice_bytes`, each a multiple of 4 KiB but the last (page-aligned
// parts keep the provider's own striping and the NIC's DMA aligned).
std::vector<SliceRange> PlanSlices(uint64_t length, uint64_t slice_bytes);

}  // namespace ferry::server
