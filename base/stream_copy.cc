#include "base/stream_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace ferry {

void StreamCopy(void* dst, const void* src, size_t n) {
#if defined(__SSE2__)
  if (n >= kStreamCopyMin) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    // Streaming stores need a 16-byte aligned destination: the head goes by memcpy.
    const size_t head = std::min(n, (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15);
    std::memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    // A cache line (64 bytes) per round: four loads, four streaming stores.
    for (size_t lines = n / 64; lines > 0; --lines) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
      const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
      s += 64;
      d += 64;
    }
    // Streaming stores are weakly ordered: fence them before anyone is told the copy is done.
    _mm_sfence();
    std::memcpy(d, s, n % 64);
    return;
  }
#endif
  std::memcpy(dst, src, n);
}

}  // namespace ferry
