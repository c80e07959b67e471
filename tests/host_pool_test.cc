// The host pool commits a buffer's pages when it is allocated, and only then: a transfer
// into a new buffer takes no page fault, and the pool costs nothing until used.

#include "transport/memory/host_pool.h"

#include <unistd.h>

#include <algorithm>

#include "gtest/gtest.h"
#include "tests/page_faults.h"

namespace ferry::memory {
namespace {

constexpr uint64_t kAlign = HostPool::kAlignment;

TEST(HostPoolTest, ABufferIsInMemoryWhenAllocatedAndTheRestOfThePoolIsNot) {
  auto pool = HostPool::Create(64 * kAlign, "host_pool_test");
  ASSERT_TRUE(pool.ok()) << pool.status();
  char* const base = (*(*pool)->Allocate(kAlign))->data();  // freed at once: the pool's start
  auto block = (*pool)->Allocate(8 * kAlign);
  ASSERT_TRUE(block.ok()) << block.status();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(ResidentPages((*block)->data(), (*block)->size()), (*block)->size() / page)
      << "every page of a new buffer is in memory";
  EXPECT_EQ(ResidentPages(base, (*pool)->size()), (*block)->size() / page)
      << "the rest of the pool holds no memory";

  // Mapped here too: writing the whole buffer takes no page fault.
  const long before = MinorFaults();
  TouchPages((*block)->data(), (*block)->size());
  EXPECT_EQ(MinorFaults() - before, 0);
}

TEST(HostPoolTest, AFreedBufferGivesItsPagesBackAndTheNextOneStartsZeroed) {
  auto pool = HostPool::Create(16 * kAlign, "host_pool_test");
  ASSERT_TRUE(pool.ok()) << pool.status();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  char* data;
  {
    auto block = (*pool)->Allocate(4 * kAlign);
    ASSERT_TRUE(block.ok()) << block.status();
    data = (*block)->data();
    std::fill(data, data + (*block)->size(), 'x');
  }
  EXPECT_EQ(ResidentPages(data, 4 * kAlign), 0u);
  auto again = (*pool)->Allocate(4 * kAlign);
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ((*again)->data(), data) << "the allocator reuses the freed range";
  EXPECT_EQ(ResidentPages(data, 4 * kAlign), 4 * kAlign / page);
  for (uint64_t i = 0; i < (*again)->size(); ++i) ASSERT_EQ(data[i], 0) << "byte " << i;
}

}  // namespace
}  // namespace ferry::memory
