// StreamCopy (base/stream_copy.h): every size around its threshold and the cache-line
// loop's edges, at every misalignment of source and destination, lands the bytes exactly
// and touches nothing around them.

#include "base/stream_copy.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(StreamCopyTest, EverySizeAndAlignmentLandsExactlyAndNothingAround) {
  std::mt19937 rng(7);
  std::vector<uint8_t> src(3 * kStreamCopyMin + 256);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  const size_t sizes[] = {0,   1,   15,  16,  63, 64, 65, kStreamCopyMin - 1, kStreamCopyMin,
                          kStreamCopyMin + 1, kStreamCopyMin + 63, 2 * kStreamCopyMin + 17,
                          3 * kStreamCopyMin};
  for (size_t n : sizes) {
    for (size_t src_off = 0; src_off < 16; src_off += 5) {
      for (size_t dst_off = 0; dst_off < 32; dst_off += 3) {
        std::vector<uint8_t> dst(src.size() + 64, 0xAB);
        StreamCopy(dst.data() + dst_off, src.data() + src_off, n);
        ASSERT_EQ(0, std::memcmp(dst.data() + dst_off, src.data() + src_off, n))
            << n << " bytes, src +" << src_off << ", dst +" << dst_off;
        for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(dst[i], 0xAB) << "before, " << n;
        for (size_t i = dst_off + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xAB) << "after, " << n;
      }
    }
  }
}

}  // namespace
}  // namespace ferry
