#pragma once
// A 64-bit checksum fast enough for hundreds of MiB (word at a time), for the demo and the
// checks that compare what landed with what was sent. Not cryptographic.

#include <cstdint>
#include <cstring>

namespace ferry {

inline uint64_t Checksum(const char* p, uint64_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t v;
    std::memcpy(&v, p + i, 8);
    h = (h ^ v) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  for (; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 0x100000001b3ull;
  return h;
}

}  // namespace ferry
