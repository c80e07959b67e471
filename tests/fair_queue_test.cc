// The engine's slicing and per-peer fair queue, through their public interfaces, against a
// fake endpoint that completes ops only when the test says so (as a slow wire would).

#include <deque>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "server/engine/fair_queue.h"
#include "server/engine/slice_planner.h"
#include "tests/fakes/held_endpoint.h"

namespace ferry::server {
namespace {

using fake::HeldEndpoint;

TEST(SlicePlannerTest, SmallOpsStayWholeLargeOnesAreCutIntoAlignedEqualSlices) {
  auto one = PlanSlices(4096, 1 << 20);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].length, 4096u);
  auto exact = PlanSlices(4 << 20, 1 << 20);
  ASSERT_EQ(exact.size(), 4u);
  for (const auto& s : exact) EXPECT_EQ(s.length, 1u << 20);
  auto odd = PlanSlices((3 << 20) + 1, 1 << 20);
  ASSERT_EQ(odd.size(), 4u);
  uint64_t total = 0, expect = 0;
  for (const auto& s : odd) {
    EXPECT_EQ(s.offset, expect);
    EXPECT_LE(s.length, 1u << 20);
    if (&s != &odd.back()) EXPECT_EQ(s.length % 4096, 0u);
    expect += s.length;
    total += s.length;
  }
  EXPECT_EQ(total, (3u << 20) + 1);
  // A slice size below the alignment is the alignment.
  EXPECT_EQ(PlanSlices(16384, 100).size(), 4u);
}

std::vector<SliceWork> Slices(const std::shared_ptr<HeldEndpoint>& ep, int count, uint64_t length,
                              uint64_t base, int* done, int* cancelled = nullptr,
                              absl::Status* last = nullptr) {
  std::vector<SliceWork> out;
  for (int i = 0; i < count; ++i) {
    out.push_back({ep, false, {nullptr, 0, length}, {base + static_cast<uint64_t>(i), 0},
                   [done, cancelled, last](absl::Status s) {
                     ++*done;
                     if (cancelled != nullptr && absl::IsCancelled(s)) ++*cancelled;
                     if (last != nullptr) *last = s;
                   }});
  }
  return out;
}

TEST(FairQueueTest, TheWindowBoundsWhatIsPostedAndCompletionsPostMore) {
  auto ep = std::make_shared<HeldEndpoint>();
  auto queue = std::make_shared<FairQueue>(4 << 20);
  int done = 0;
  queue->Enqueue(1, Slices(ep, 16, 1 << 20, 0, &done), nullptr);
  EXPECT_EQ(ep->posted(), 4u);
  EXPECT_EQ(queue->in_flight_bytes(), 4u << 20);
  EXPECT_EQ(queue->queued(), 12u);
  while (ep->CompleteOne()) {
  }
  EXPECT_EQ(done, 16);
  EXPECT_EQ(queue->in_flight_bytes(), 0u);
  EXPECT_EQ(queue->queued(), 0u);
}

// Slices that do not divide the window: the one that would overshoot it waits.
TEST(FairQueueTest, ASliceThatWouldOvershootTheWindowWaits) {
  auto ep = std::make_shared<HeldEndpoint>();
  auto queue = std::make_shared<FairQueue>(4 << 20);
  int done = 0;
  queue->Enqueue(1, Slices(ep, 3, 3 << 19, 0, &done), nullptr);  // 1.5 MiB each
  EXPECT_EQ(ep->posted(), 2u);
  EXPECT_EQ(queue->in_flight_bytes(), 3u << 20);
  while (ep->CompleteOne()) {
  }
  EXPECT_EQ(done, 3);
  EXPECT_EQ(queue->in_flight_bytes(), 0u);
}

TEST(FairQueueTest, ASmallOpPostedBehindAHugeBatchGoesOutAtTheNextTurn) {
  auto ep = std::make_shared<HeldEndpoint>();
  auto queue = std::make_shared<FairQueue>(4 << 20);
  int big_done = 0, small_done = 0;
  queue->Enqueue(1, Slices(ep, 4096, 1 << 20, 0, &big_done), nullptr);  // 4 GiB
  queue->Enqueue(2, Slices(ep, 1, 4096, 1ull << 40, &small_done), nullptr);
  // The first completion frees room for the batch's turn, the second for the small op's.
  ASSERT_TRUE(ep->CompleteOne());
  ASSERT_TRUE(ep->CompleteOne());
  size_t posted = ep->posted();
  ASSERT_GE(posted, 4u);
  bool small_posted = false;
  for (size_t i = 0; i < posted; ++i) small_posted |= ep->address(i) == (1ull << 40);
  EXPECT_TRUE(small_posted) << "the 4 KiB op still waits behind the batch";
  for (int i = 0; i < 8; ++i) ep->CompleteOne();
  EXPECT_EQ(small_done, 1);
  EXPECT_LT(big_done, 20);
  // The rest of the batch, as a real endpoint's Close would settle it: held completions keep
  // the queue alive, which keeps the endpoint alive (LeakSanitizer, make test-asan).
  while (ep->CompleteOne()) {
  }
  EXPECT_EQ(big_done, 4096);
}

// Issue 44 row 7: turns go to owners first. A uid with 100 transfers waiting and a uid
// with one share the wire slice for slice: the one's 10 slices are all done within the
// first 21 completions after it came (the hoard had the first slice on the wire), not after
// the hoard's 100 transfers had their turns.
TEST(FairQueueTest, AnOwnerWithManyTransfersGetsOneTurnAsAnOwnerWithOneDoes) {
  auto ep = std::make_shared<HeldEndpoint>();
  auto queue = std::make_shared<FairQueue>(1 << 20);  // one 1 MiB slice on the wire at once
  int hoard_done = 0, small_done = 0;
  for (uint64_t id = 1; id <= 100; ++id) {
    queue->Enqueue(id, Slices(ep, 10, 1 << 20, id << 20, &hoard_done), nullptr, /*owner=*/1000);
  }
  queue->Enqueue(1000, Slices(ep, 10, 1 << 20, 1ull << 40, &small_done), nullptr, 2000);
  for (int i = 0; i < 21 && small_done < 10; ++i) ASSERT_TRUE(ep->CompleteOne());
  EXPECT_EQ(small_done, 10) << "uid 2000's transfer waited behind uid 1000's hoard";
  EXPECT_LE(hoard_done, 11);
  while (ep->CompleteOne()) {
  }
  EXPECT_EQ(hoard_done, 1000);
}

// One transfer alone keeps the solo window on the wire; a second one brings it back to the
// shared window: its slices go once what is in flight fits that, then the two take turns;
// alone again (and the hold passed: none here), the first grows back to the solo window.
TEST(FairQueueTest, ATransferAloneHasTheSoloWindowUntilAnotherOneWaits) {
  auto ep = std::make_shared<HeldEndpoint>();
  auto queue = std::make_shared<FairQueue>(FairQueueWindows{.window_bytes = 4 << 20,
                                                            .solo_window_bytes = 16 << 20,
                                                            .shared_hold = absl::ZeroDuration()});
  int first_done = 0, second_done = 0;
  queue->Enqueue(1, Slices(ep, 64, 1 << 20, 0, &first_done), nullptr);
  EXPECT_EQ(ep->posted(), 16u);
  EXPECT_EQ(queue->in_flight_bytes(), 16u << 20);
  queue->Enqueue(2, Slices(ep, 4, 1 << 20, 1ull << 40, &second_done), nullptr);
  EXPECT_EQ(ep->posted(), 16u) << "the newcomer's slices went before the excess drained";
  // 12 complete: 4 MiB in flight, a full shared window; nothing new goes.
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(ep->CompleteOne());
  EXPECT_EQ(ep->posted(), 4u);
  EXPECT_EQ(queue->in_flight_bytes(), 4u << 20);
  // From here each completion posts one slice, the two transfers taking turns.
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(ep->CompleteOne());
    EXPECT_EQ(queue->in_flight_bytes(), 4u << 20);
  }
  size_t second_posted = 0;
  for (size_t i = 0; i < ep->posted(); ++i) second_posted += ep->address(i) >= (1ull << 40);
  EXPECT_EQ(second_posted + second_done, 3u) << "the two did not take turns";
  // The second's last slice goes: nothing else waits but the first, which refills the solo
  // window while the second's slices are still on the wire.
  ASSERT_TRUE(ep->CompleteOne());
  EXPECT_EQ(queue->in_flight_bytes(), 16u << 20);
  while (second_done < 4) ASSERT_TRUE(ep->CompleteOne());
  EXPECT_EQ(queue->in_flight_bytes(), 16u << 20);
  while (ep->CompleteOne()) {
  }
  EXPECT_EQ(first_done, 64);
  EXPECT_EQ(queue->in_flight_bytes(), 0u);
  EXPECT_EQ(queue->queued(), 0u);
}

// A small op beside a solo transfer makes the peer shared for the hold (an hour here): the
// transfer drops to the shared window, the small op goes at its turn, and the transfer stays
// at the shared window after the small op is gone.
TEST(FairQueueTest, AnotherTransferKeepsThePeerSharedForTheHold) {
  auto ep = std::make_shared<HeldEndpoint>();
  auto queue = std::make_shared<FairQueue>(FairQueueWindows{
      .window_bytes = 4 << 20, .solo_window_bytes = 16 << 20, .shared_hold = absl::Hours(1)});
  int big_done = 0, small_done = 0;
  queue->Enqueue(1, Slices(ep, 64, 1 << 20, 0, &big_done), nullptr);
  EXPECT_EQ(ep->posted(), 16u);
  queue->Enqueue(2, Slices(ep, 1, 4096, 1ull << 40, &small_done), nullptr);
  // No completion refills past the shared window: above it, each one lowers what is in
  // flight by at least the smallest slice.
  uint64_t before = queue->in_flight_bytes();
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(ep->CompleteOne());
    const uint64_t now = queue->in_flight_bytes();
    EXPECT_LE(now, std::max<uint64_t>(4u << 20, before - 4096)) << "completion " << i;
    before = now;
  }
  EXPECT_EQ(small_done, 1);
  EXPECT_LE(queue->in_flight_bytes(), 4u << 20) << "alone again, the batch took the solo window";
  EXPECT_GE(queue->in_flight_bytes(), 3u << 20);
  while (ep->CompleteOne()) {
  }
  EXPECT_EQ(big_done, 64);
  EXPECT_EQ(queue->in_flight_bytes(), 0u);
}

TEST(FairQueueTest, SlicesOfAnEndedTransferAreNotPostedAndReportCancelled) {
  auto ep = std::make_shared<HeldEndpoint>();
  auto queue = std::make_shared<FairQueue>(2 << 20);
  int done = 0, cancelled = 0;
  bool wanted = true;
  queue->Enqueue(1, Slices(ep, 10, 1 << 20, 0, &done, &cancelled),
                 MakeWanted([&wanted] { return wanted; }));
  EXPECT_EQ(ep->posted(), 2u);
  wanted = false;  // cancelled: the two on the wire finish, the other eight never go
  while (ep->CompleteOne()) {
  }
  EXPECT_EQ(done, 10) << "every slice reports once";
  EXPECT_EQ(cancelled, 8);
  EXPECT_EQ(queue->in_flight_bytes(), 0u);
}

TEST(FairQueueTest, APostRefusedNowCompletesWithTheRefusalAndFreesTheWindow) {
  auto ep = std::make_shared<HeldEndpoint>();
  ep->Refuse();
  auto queue = std::make_shared<FairQueue>(1 << 20);
  int done = 0;
  absl::Status last;
  queue->Enqueue(1, Slices(ep, 5, 1 << 20, 0, &done, nullptr, &last), nullptr);
  EXPECT_EQ(done, 5);
  EXPECT_EQ(last.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(queue->in_flight_bytes(), 0u);
}

}  // namespace
}  // namespace ferry::server
