// CRC32C against published check values (RFC 3720 appendix B.4, the "123456789" check), the
// instruction path against the tables, and a CRC fed in pieces against one call.

#include "base/crc32c.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(Crc32cTest, MatchesPublishedCheckValues) {
  const std::string check = "123456789";
  EXPECT_EQ(Crc32c(check.data(), check.size()), 0xe3069283u);
  EXPECT_EQ(Crc32cPortable(check.data(), check.size()), 0xe3069283u);
  std::vector<unsigned char> bytes(32, 0);
  EXPECT_EQ(Crc32c(bytes.data(), 32), 0x8a9136aau);  // 32 bytes of zeros
  std::memset(bytes.data(), 0xff, 32);
  EXPECT_EQ(Crc32c(bytes.data(), 32), 0x62a8ab43u);  // 32 bytes of 0xff
  for (int i = 0; i < 32; ++i) bytes[i] = static_cast<unsigned char>(i);
  EXPECT_EQ(Crc32c(bytes.data(), 32), 0x46dd794eu);  // 0x00 .. 0x1f
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
}

TEST(Crc32cTest, TheInstructionAgreesWithTheTablesAndPiecesAgreeWithTheWhole) {
  std::mt19937 rng(7);
  std::vector<unsigned char> data(70000);
  for (auto& b : data) b = static_cast<unsigned char>(rng());
  for (uint64_t n : {1, 7, 8, 9, 63, 4096, 4099, 70000}) {
    for (uint64_t start : {0, 1, 5}) {
      if (start + n > data.size()) continue;
      const uint32_t whole = Crc32c(data.data() + start, n);
      EXPECT_EQ(whole, Crc32cPortable(data.data() + start, n)) << n << " bytes at " << start;
      const uint64_t cut = n / 3;
      EXPECT_EQ(Crc32c(data.data() + start + cut, n - cut, Crc32c(data.data() + start, cut)),
                whole)
          << n << " bytes cut at " << cut;
    }
  }
  // One bit flipped anywhere changes it.
  const uint32_t before = Crc32c(data.data(), 4096);
  data[1234] ^= 0x10;
  EXPECT_NE(Crc32c(data.data(), 4096), before);
}

}  // namespace
}  // namespace ferry
