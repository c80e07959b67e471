#pragma once
// CRC32C (Castagnoli, the iSCSI / ext4 / RocksDB checksum): MoveBlocks' verify compares each
// block's on both sides. The SSE4.2 instruction where the CPU has it, else slice-by-8
// tables (a few times slower). Crc32c("123456789") == 0xe3069283.

#include <cstdint>

namespace ferry {

// The CRC of `n` bytes at `p`, continuing from `crc` (the CRC of the bytes before them; 0
// for none), so that a block may be fed in pieces.
uint32_t Crc32c(const void* p, uint64_t n, uint32_t crc = 0);
// The same by the tables alone, whatever the CPU has (tests compare the two).
uint32_t Crc32cPortable(const void* p, uint64_t n, uint32_t crc = 0);

}  // namespace ferry
