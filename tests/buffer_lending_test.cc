// The fd socket lends a buffer's own file to its owner and to nobody else (issue 44 row 11:
// a non-root client of a root agent could not open /proc/<agent pid>/fd/N to map what it
// allocated). The protocol through a real FdInbox and the client's BorrowBufferFile; who may
// borrow through LendBufferFile over a real registry and host pool. tenant_isolation_test
// does the same across two real uids and a real agent.

#include "server/local/buffer_lending.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/shared_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/local/fd_inbox.h"
#include "tests/agent_pair.h"
#include "transport/memory/host_pool.h"

namespace ferry::server {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kAlign = memory::HostPool::kAlignment;

class BufferLendingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pool = memory::HostPool::Create(16 * kAlign, "buffer_lending_test");
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    registry_ = std::make_unique<BufferRegistry>(pool_.get(), nullptr,
                                                 std::vector<fabric::Fabric*>{});
  }
  void TearDown() override {
    registry_.reset();
    if (pool_) {
      EXPECT_EQ(pool_->blocks(), 0u) << "every buffer's file is closed";
    }
  }

  // A buffer of `uid` holding `fill`.
  uint64_t BufferOf(int64_t uid, char fill) {
    BufferOwner owner;
    owner.uid = uid;
    auto b = registry_->Allocate(kAlign, "", "host", owner, {});
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return 0;
    std::memset((*b)->memory().data(), fill, kAlign);
    return (*b)->id();
  }

  std::unique_ptr<memory::HostPool> pool_;
  std::unique_ptr<BufferRegistry> registry_;
};

ucred Caller(uid_t uid, gid_t gid = 5000) { return ucred{getpid(), uid, gid}; }

TEST_F(BufferLendingTest, TheOwnerGetsExactlyItsBufferAnotherUidNothing) {
  const uint64_t mine = BufferOf(1000, 'm');
  const uint64_t theirs = BufferOf(1001, 't');
  const LocalCallers callers(/*admin_group=*/4242);

  auto file = LendBufferFile(callers, *registry_, mine, Caller(1000));
  ASSERT_TRUE(file.ok()) << file.status();
  struct stat st = {};
  ASSERT_EQ(fstat(file->get(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), kAlign) << "its buffer and nothing more";
  char c = 0;
  ASSERT_EQ(pread(file->get(), &c, 1, kAlign - 1), 1);
  EXPECT_EQ(c, 'm');
  EXPECT_NE(ftruncate(file->get(), 0), 0) << "a borrower cannot shrink agent memory";
  EXPECT_EQ(errno, EPERM);

  auto refused = LendBufferFile(callers, *registry_, theirs, Caller(1000));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(), HasSubstr("belongs to uid 1001; uid 1000 may not"));
  EXPECT_TRUE(LendBufferFile(callers, *registry_, theirs, Caller(0)).ok()) << "root";
  EXPECT_TRUE(LendBufferFile(callers, *registry_, theirs, Caller(1002, 4242)).ok()) << "admin";
  EXPECT_EQ(LendBufferFile(callers, *registry_, 999, Caller(1000)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(BufferLendingTest, TheFdSocketCarriesTheFileOrTheRefusal) {
  const uint64_t mine = BufferOf(getuid(), 'm');
  const std::string dir = MakeTempDir();
  auto inbox = FdInbox::Start(dir + "/fd.sock", 0600, static_cast<gid_t>(-1));
  ASSERT_TRUE(inbox.ok()) << inbox.status();
  (*inbox)->SetLender([&](uint64_t id, const ucred& caller) -> absl::StatusOr<UniqueFd> {
    EXPECT_EQ(caller.uid, getuid()) << "the kernel's, not ours";
    if (id != mine)
      return absl::PermissionDeniedError(absl::StrCat("buffer ", id, " is not yours"));
    auto b = registry_->Get(id, "buffer");
    if (!b.ok()) return b.status();
    return (*b)->memory().LendFile();
  });

  auto file = BorrowBufferFile((*inbox)->path(), mine);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_NE(fcntl(file->get(), F_GETFD) & FD_CLOEXEC, 0) << "never inherited by a child";
  void* p = mmap(nullptr, kAlign, PROT_READ | PROT_WRITE, MAP_SHARED, file->get(), 0);
  ASSERT_NE(p, MAP_FAILED);
  EXPECT_EQ(static_cast<char*>(p)[0], 'm');
  static_cast<char*>(p)[1] = 'w';  // the agent's buffer, written through the client's map
  auto b = registry_->Get(mine, "buffer");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->memory().data()[1], 'w');
  munmap(p, kAlign);

  auto refused = BorrowBufferFile((*inbox)->path(), mine + 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(refused.status().message(), absl::StrCat("buffer ", mine + 1, " is not yours"));

  // The descriptor-passing request still works beside it.
  UniqueFd memfd(memfd_create("buffer_lending_test", MFD_CLOEXEC));
  auto ticket = PassFd((*inbox)->path(), memfd.get());
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  EXPECT_TRUE((*inbox)->Take(*ticket, getuid()).ok());
  inbox->reset();

  // An inbox that lends nothing says so.
  auto bare = FdInbox::Start(dir + "/bare.sock", 0600, static_cast<gid_t>(-1));
  ASSERT_TRUE(bare.ok()) << bare.status();
  EXPECT_EQ(BorrowBufferFile((*bare)->path(), mine).status().code(),
            absl::StatusCode::kUnimplemented);
  bare->reset();
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace ferry::server
