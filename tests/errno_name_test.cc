// ErrnoName: our own table (strerrorname_np needs glibc >= 2.32, issue 12).

#include "base/errno_name.h"

#include <cerrno>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(ErrnoNameTest, NamesWhatVerbsAndTheKernelReturn) {
  EXPECT_EQ(ErrnoName(ENOSYS), "ENOSYS");
  EXPECT_EQ(ErrnoName(ENOMEM), "ENOMEM");
  EXPECT_EQ(ErrnoName(EOPNOTSUPP), "EOPNOTSUPP");
  EXPECT_EQ(ErrnoName(EFAULT), "EFAULT");
  EXPECT_EQ(ErrnoName(ETIMEDOUT), "ETIMEDOUT");
  EXPECT_EQ(ErrnoName(0x7fff), "errno 32767");
}

}  // namespace
}  // namespace ferry
