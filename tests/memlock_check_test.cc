// ferryd's start-up RLIMIT_MEMLOCK warning, with the limit and the need passed in.

#include "server/agent/memlock_check.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry::server {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1 << 20;

const topology::MemlockNeed kNeed{(1024 + 64) * kMiB,
                                  "host pool 1 GiB + 1 bounce pool(s) of 64 MiB"};

TEST(MemlockCheckTest, ALimitBelowWhatVerbsRegistersSaysWhatToRaise) {
  std::string w = MemlockWarning({8 * kMiB, /*ipc_lock=*/false}, kNeed, /*verbs_in_use=*/true);
  EXPECT_THAT(w, HasSubstr("RLIMIT_MEMLOCK is 8 MiB"));
  EXPECT_THAT(w, HasSubstr("below the 1088 MiB this agent registers"));
  EXPECT_THAT(w, HasSubstr("host pool 1 GiB + 1 bounce pool(s) of 64 MiB"));
  EXPECT_THAT(w, HasSubstr("LimitMEMLOCK=infinity"));
  EXPECT_THAT(w, HasSubstr("ulimit -l unlimited"));
  EXPECT_THAT(w, HasSubstr("IPC_LOCK"));
  EXPECT_THAT(w, HasSubstr("ENOMEM"));
  // Just below is still below.
  EXPECT_NE(MemlockWarning({kNeed.bytes - 1, false}, kNeed, true), "");
}

TEST(MemlockCheckTest, NothingToSayWhenTheLimitDoesNotApply) {
  // Unlimited, enough, or exactly enough.
  EXPECT_EQ(MemlockWarning({std::nullopt, false}, kNeed, true), "");
  EXPECT_EQ(MemlockWarning({4096 * kMiB, false}, kNeed, true), "");
  EXPECT_EQ(MemlockWarning({kNeed.bytes, false}, kNeed, true), "");
  // CAP_IPC_LOCK lifts the limit for registrations.
  EXPECT_EQ(MemlockWarning({64 << 10, /*ipc_lock=*/true}, kNeed, true), "");
  // tcp pins nothing: no verbs fabric, no warning, whatever the limit.
  EXPECT_EQ(MemlockWarning({64 << 10, false}, kNeed, /*verbs_in_use=*/false), "");
}

}  // namespace
}  // namespace ferry::server
