#pragma once
// A large copy whose destination is not read again soon (a transfer's landing buffer):
// non-temporal stores, which write whole cache lines to memory without reading them first
// and without evicting the cache. glibc's memcpy takes that path only above its
// non-temporal threshold (3/4 of the shared cache per thread: hundreds of MiB on a VM that
// reports a large L3), so a copy cut into slices ran at 6.2 GB/s where one 256 MiB memcpy
// ran at 9.3 and these stores at 7.9 (2-core VM, memfd pages, 8 MiB slices).

#include <cstddef>

namespace ferry {

// Copies `n` bytes from `src` to `dst` (not overlapping). Below kStreamCopyMin, or where
// SSE2 is missing, a plain memcpy.
void StreamCopy(void* dst, const void* src, size_t n);

inline constexpr size_t kStreamCopyMin = 4096;

}  // namespace ferry
