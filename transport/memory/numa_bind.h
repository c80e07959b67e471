#pragma once
// Placing memory on a NUMA node (the NIC's), before its pages are first touched.

#include <cstdint>
#include <string>

namespace ferry::memory {

// Binds [p, p+n) to NUMA node `numa` (hwloc membind, strict) before first touch. Returns how
// it went, in words ("NUMA node 0 (hwloc membind)", or "no NUMA binding (why)"); a failed
// binding leaves the memory where the kernel puts it.
std::string BindToNode(void* p, uint64_t n, int numa);

}  // namespace ferry::memory
