// FaultGuard (base/fault_guard.h): a client's file shrinking under a CPU read or write of
// the agent fails that access, not the process; a fault outside any guard still kills, as
// it always did; and the guarded checksum of a registration (server/buffers/guarded_touch.h)
// fails DATA_LOSS and marks the buffer broken, while a sealed memfd needs no guard at all.

#include "base/fault_guard.h"

#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/buffers/client_memory.h"
#include "server/buffers/guarded_touch.h"
#include "server/tensors/block_checksum.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

constexpr size_t kBytes = 1 << 20;

// A memfd of kBytes mapped shared, whose file the test shrinks: what a client does to the
// agent when it truncates memory it registered (or torch's share_memory_ file is resized).
struct ShrinkableFile {
  ShrinkableFile() {
    fd = memfd_create("fault_guard_test", MFD_CLOEXEC);  // no MFD_ALLOW_SEALING: unsealable
    EXPECT_GE(fd, 0);
    EXPECT_EQ(ftruncate(fd, kBytes), 0);
    void* p = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    EXPECT_NE(p, MAP_FAILED);
    data = static_cast<char*>(p);
    std::memset(data, 'x', kBytes);
  }
  ~ShrinkableFile() {
    munmap(data, kBytes);
    close(fd);
  }
  int fd = -1;
  char* data = nullptr;
};

// A volatile read loop the compiler keeps: the access the guard must survive.
uint64_t SumBytes(const char* p, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; i += 512) sum += static_cast<const volatile char*>(p)[i];
  return sum;
}

TEST(FaultGuardTest, AReadPastTheShrunkFilesEndFailsTheAccessNotTheProcess) {
  ShrinkableFile file;
  {
    FaultGuard guard(file.data, kBytes);
    EXPECT_EQ(SumBytes(file.data, kBytes), uint64_t{'x'} * (kBytes / 512));
    EXPECT_FALSE(guard.faulted());
  }
  ASSERT_EQ(ftruncate(file.fd, 4096), 0);
  uint64_t sum = 0;
  bool faulted = false;
  {
    FaultGuard guard(file.data, kBytes);
    sum = SumBytes(file.data, kBytes);
    std::memset(file.data + kBytes / 2, 'y', 4096);  // a write lands nowhere, and lives
    faulted = guard.faulted();
  }
  EXPECT_TRUE(faulted);
  // What was read past the fault is zeros (the first page was read before it, or after:
  // either way no more than its bytes count).
  EXPECT_LE(sum, uint64_t{'x'} * (kBytes / 512));
}

TEST(FaultGuardTest, GuardsNestAndTheInnermostHoldingTheAddressTakesTheFault) {
  ShrinkableFile outer_file, inner_file;
  ASSERT_EQ(ftruncate(inner_file.fd, 0), 0);
  FaultGuard outer(outer_file.data, kBytes);
  {
    FaultGuard inner(inner_file.data, kBytes);
    SumBytes(inner_file.data, kBytes);
    EXPECT_TRUE(inner.faulted());
  }
  EXPECT_FALSE(outer.faulted());
  EXPECT_EQ(SumBytes(outer_file.data, 4096), uint64_t{'x'} * 8);
}

TEST(FaultGuardDeathTest, AFaultOutsideEveryGuardStillKills) {
  ShrinkableFile file, other;
  ASSERT_EQ(ftruncate(file.fd, 0), 0);
  // A guard over other memory does not make this fault ours to survive.
  EXPECT_EXIT(
      {
        FaultGuard guard(other.data, kBytes);
        SumBytes(file.data, kBytes);
        std::_Exit(0);
      },
      // Killed by SIGBUS; under ASan its own handler reports the fault and exits 1.
      [](int status) {
        return (WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS) ||
               (WIFEXITED(status) && WEXITSTATUS(status) != 0);
      },
      "");
}

TEST(GuardedTouchTest, AChecksumOfAShrunkRegistrationIsDataLossAndTheBufferIsBroken) {
  UniqueFd fd(memfd_create("guarded_touch_test", MFD_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(ftruncate(fd.get(), kBytes), 0);
  const int raw = fd.get();
  auto memory = server::MapClientFile(std::move(fd), 0, kBytes);
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_GT((*memory)->shrinkable_range().second, 0u) << "an unsealed memfd can shrink";
  server::Buffer buffer(7, "shrinks", *std::move(memory), {}, {});
  std::vector<char> scratch;
  auto before = server::BlockCrc32c(buffer, 0, kBytes, nullptr, scratch);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_EQ(ftruncate(raw, 0), 0);  // the client shrinks it (the agent holds the fd)
  auto after = server::BlockCrc32c(buffer, 0, kBytes, nullptr, scratch);
  EXPECT_EQ(after.status().code(), absl::StatusCode::kDataLoss) << after.status();
  EXPECT_THAT(after.status().message(), HasSubstr("buffer 7 (client memory): its file shrank"));
  EXPECT_TRUE(buffer.memory().broken());
  auto again = server::BlockCrc32c(buffer, 0, 4096, nullptr, scratch);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("buffer 7 is broken"));
}

TEST(GuardedTouchTest, ASealedMemfdCannotShrinkAndNeedsNoGuard) {
  UniqueFd fd(memfd_create("guarded_touch_test", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  ASSERT_TRUE(fd.valid());
  ASSERT_EQ(ftruncate(fd.get(), kBytes), 0);
  const int raw = fd.get();
  auto memory = server::MapClientFile(std::move(fd), 0, kBytes);
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_EQ((*memory)->shrinkable_range().second, 0u);
  EXPECT_NE(ftruncate(raw, 0), 0) << "F_SEAL_SHRINK let the file shrink";
}

TEST(ClientMemoryTest, AFileOnDiskIsRefusedNamingWhatToRegisterInstead) {
  char path[] = "/var/tmp/ferry-disk-file-XXXXXX";
  int raw = mkstemp(path);
  ASSERT_GE(raw, 0);
  unlink(path);
  UniqueFd fd(raw);
  ASSERT_EQ(ftruncate(fd.get(), kBytes), 0);
  auto memory = server::MapClientFile(std::move(fd), 0, kBytes);
  if (memory.ok()) GTEST_SKIP() << "/var/tmp is on tmpfs here: no disk file to try";
  EXPECT_EQ(memory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(memory.status().message(), HasSubstr("not tmpfs or hugetlbfs"));
}

}  // namespace
}  // namespace ferry
