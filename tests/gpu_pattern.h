#pragma once
// The byte pattern the GPU tests and their IPC helper process write and check: a function
// of a seed and the byte's position in the slab, so a misplaced or stale copy shows.

#include <cstdint>
#include <cstring>

namespace ferry::testing {

inline uint8_t PatternByte(uint32_t seed, uint64_t position) {
  uint64_t x = position * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull;
  return static_cast<uint8_t>((x >> 29) ^ (x >> 47));
}

// Fills `data` with the pattern of slab bytes [position, position + n).
inline void FillPattern(void* data, uint64_t n, uint32_t seed, uint64_t position) {
  auto* p = static_cast<uint8_t*>(data);
  for (uint64_t i = 0; i < n; ++i) p[i] = PatternByte(seed, position + i);
}

// The first index where `data` differs from the pattern, or n when it matches.
inline uint64_t FirstMismatch(const void* data, uint64_t n, uint32_t seed, uint64_t position) {
  auto* p = static_cast<const uint8_t*>(data);
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i] != PatternByte(seed, position + i)) return i;
  }
  return n;
}

}  // namespace ferry::testing
