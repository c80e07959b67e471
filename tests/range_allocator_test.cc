#include "transport/memory/range_allocator.h"

#include "gtest/gtest.h"

namespace ferry::memory {
namespace {

TEST(RangeAllocatorTest, AllocatesAlignedRangesAndCoalescesOnFree) {
  RangeAllocator a(1 << 20, 64 << 10);
  auto x = a.Allocate(1);
  auto y = a.Allocate((64 << 10) + 1);
  auto z = a.Allocate(64 << 10);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok());
  EXPECT_EQ(*x, 0u);
  EXPECT_EQ(*y, 64u << 10);
  EXPECT_EQ(*z, 192u << 10);
  EXPECT_EQ(a.used(), 256u << 10);
  ASSERT_TRUE(a.Free(*y).ok());
  EXPECT_GT(a.fragmentation(), 0.0);
  ASSERT_TRUE(a.Free(*x).ok());
  ASSERT_TRUE(a.Free(*z).ok());
  EXPECT_EQ(a.used(), 0u);
  EXPECT_EQ(a.fragmentation(), 0.0);
  EXPECT_EQ(a.largest_free(), 1u << 20);
}

TEST(RangeAllocatorTest, RefusesWhatDoesNotFit) {
  RangeAllocator a(1 << 20, 4096);
  EXPECT_EQ(a.Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.Allocate((1 << 20) + 1).status().code(), absl::StatusCode::kResourceExhausted);
  auto half = a.Allocate(1 << 19);
  ASSERT_TRUE(half.ok());
  EXPECT_EQ(a.Allocate((1 << 19) + 1).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.Free(12345).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(a.Free(*half).ok());
  EXPECT_EQ(a.Free(*half).code(), absl::StatusCode::kInvalidArgument) << "double free";
}

}  // namespace
}  // namespace ferry::memory
