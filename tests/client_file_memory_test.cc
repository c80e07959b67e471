// A client's file registered with the agent (RegisterMemory) is mapped with its pages in
// place: a transfer into it takes no page fault, as into the host pool's buffers.

#include <sys/mman.h>
#include <unistd.h>

#include "gtest/gtest.h"
#include "server/buffers/client_memory.h"
#include "tests/page_faults.h"

namespace ferry::server {
namespace {

TEST(ClientFileMemoryTest, TheAgentsMappingHasEveryPageBeforeTheFirstTransfer) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  UniqueFd fd(memfd_create("client_file_memory_test", MFD_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(ftruncate(fd.get(), static_cast<off_t>(256 * page)), 0);
  // Offset by a page and a bit: the mapping starts at the page before the range.
  auto memory = MapClientFile(std::move(fd), page + 100, 200 * page);
  ASSERT_TRUE(memory.ok()) << memory.status();
  char* const data = (*memory)->data();
  EXPECT_EQ(ResidentPages(data - 100, 201 * page), 201u);
  const long before = MinorFaults();
  TouchPages(data, (*memory)->size());
  EXPECT_EQ(MinorFaults() - before, 0) << "the agent's writes into a registered file fault";
}

}  // namespace
}  // namespace ferry::server
