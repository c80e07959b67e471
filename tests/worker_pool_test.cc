// WorkerPool: work runs in the order queued, threads start only as work needs them and never
// past the limit, one blocked piece of work does not hold up the rest while a thread is
// free, and the destructor runs what is still queued.

#include "base/worker_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(WorkerPoolTest, OneThreadRunsWorkInTheOrderQueued) {
  std::vector<int> order;
  {
    WorkerPool pool(1, "test-pool");
    EXPECT_EQ(pool.threads(), 0u) << "a pool never used holds no thread";
    for (int i = 0; i < 100; ++i) pool.Run([&order, i] { order.push_back(i); });
    EXPECT_EQ(pool.threads(), 1u);
  }  // the destructor runs what is left
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(WorkerPoolTest, ABlockedWorkHoldsOneThreadAndTheOthersRunOn) {
  absl::Notification release;
  std::atomic<int> done{0};
  WorkerPool pool(3, "test-pool");
  pool.Run([&] {
    release.WaitForNotification();
    ++done;
  });
  absl::Notification second;
  pool.Run([&] {
    ++done;
    second.Notify();
  });
  EXPECT_TRUE(second.WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "work waited behind a blocked one with a thread free";
  for (int i = 0; i < 50; ++i) pool.Run([&] { ++done; });
  EXPECT_LE(pool.threads(), 3u);
  release.Notify();
  absl::Time until = absl::Now() + absl::Seconds(10);
  while (done.load() < 52 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(done.load(), 52);
}

TEST(WorkerPoolTest, WorkQueuedByWorkWhileStoppingStillRuns) {
  std::atomic<int> ran{0};
  absl::Notification started;
  absl::Notification release;
  std::thread releaser;
  {
    WorkerPool pool(1, "test-pool");
    pool.Run([&] {
      started.Notify();
      release.WaitForNotification();
      // Queued while the destructor waits for this thread.
      pool.Run([&] { ++ran; });
      ++ran;
    });
    started.WaitForNotification();
    releaser = std::thread([&] {
      absl::SleepFor(absl::Milliseconds(50));
      release.Notify();
    });
  }
  releaser.join();
  EXPECT_EQ(ran.load(), 2);
}

TEST(WorkerPoolTest, AHungLaneHoldsItsShareOfThreadsAndOtherLanesRunOn) {
  // A stopped peer: every work of lane "hung" blocks until released.
  absl::Notification release;
  std::atomic<int> hung_started{0}, hung_done{0}, healthy_done{0};
  {
    WorkerPool pool(8, "test-pool", /*per_lane=*/2);
    for (int i = 0; i < 16; ++i) {
      pool.Run("hung", [&] {
        ++hung_started;
        release.WaitForNotification();
        ++hung_done;
      });
    }
    // A healthy peer's 100 works finish while the hung ones wait (before: 8 threads, all
    // taken by the hung peer, and the healthy batch waited for them).
    for (int i = 0; i < 100; ++i) pool.Run("healthy", [&] { ++healthy_done; });
    absl::Time until = absl::Now() + absl::Seconds(10);
    while (healthy_done.load() < 100 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
    EXPECT_EQ(healthy_done.load(), 100);
    EXPECT_EQ(hung_started.load(), 2) << "a lane ran more than per_lane works at once";
    EXPECT_LE(pool.threads(), 8u);
    release.Notify();
  }  // the destructor runs the hung lane's queued works, two at a time
  EXPECT_EQ(hung_done.load(), 16);
}

}  // namespace
}  // namespace ferry
