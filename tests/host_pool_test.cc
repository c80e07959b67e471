// The host pool commits a buffer's pages when it is allocated, and only then: a transfer
// into a new buffer takes no page fault, and the pool costs nothing until used. Each buffer
// is a file of its own, sealed against resizing, that the agent can hand its owner.

#include "transport/memory/host_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

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

TEST(HostPoolTest, ABufferIsAFileOfItsOwnThatNobodyCanResize) {
  auto pool = HostPool::Create(16 * kAlign, "host_pool_test");
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto a = (*pool)->Allocate(kAlign + 1);
  auto b = (*pool)->Allocate(kAlign);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*pool)->blocks(), 2u);
  struct stat sa = {}, sb = {};
  ASSERT_EQ(fstat((*a)->file(), &sa), 0);
  ASSERT_EQ(fstat((*b)->file(), &sb), 0);
  EXPECT_NE(sa.st_ino, sb.st_ino) << "two buffers, two files";
  EXPECT_EQ(static_cast<uint64_t>(sa.st_size), 2 * kAlign) << "the buffer's span, no more";

  // Whoever holds the file can neither shrink it (the agent's next touch would SIGBUS), nor
  // grow it, nor add a seal (F_SEAL_FUTURE_WRITE would stop the agent's hole punch).
  const int seals = fcntl((*a)->file(), F_GET_SEALS);
  EXPECT_EQ(seals & (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL),
            F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  EXPECT_NE(ftruncate((*a)->file(), 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate((*a)->file(), 4 * kAlign), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(fcntl((*a)->file(), F_ADD_SEALS, F_SEAL_WRITE), 0);
  EXPECT_EQ(errno, EPERM);

  // The file holds the buffer's bytes from offset 0: what a client maps is the agent's.
  std::memset((*a)->data(), 'a', (*a)->size());
  void* p = mmap(nullptr, (*a)->size(), PROT_READ | PROT_WRITE, MAP_SHARED, (*a)->file(), 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(static_cast<char*>(p)[kAlign], 'a');
  static_cast<char*>(p)[0] = 'c';
  EXPECT_EQ((*a)->data()[0], 'c');
  munmap(p, (*a)->size());

  // Freed: a holder of the file keeps none of the pool's memory and reads zeroes.
  const int held = fcntl((*a)->file(), F_DUPFD_CLOEXEC, 0);
  ASSERT_GE(held, 0);
  a->reset();
  EXPECT_EQ((*pool)->blocks(), 1u);
  char c = 'x';
  ASSERT_EQ(pread(held, &c, 1, 0), 1);
  EXPECT_EQ(c, 0);
  struct stat after = {};
  ASSERT_EQ(fstat(held, &after), 0);
  EXPECT_EQ(after.st_blocks, 0) << "the hole was punched";
  close(held);
}

}  // namespace
}  // namespace ferry::memory
