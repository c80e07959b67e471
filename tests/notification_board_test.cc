// NotificationBoard::Poll, the non-blocking drain a connector calls every engine step (issue
// 46): every matching notification the taker may have, oldest first, each taken once, never
// another uid's; bounded by max_count and by one answer's bytes, saying when more wait. And
// the payload's limit (CheckNotificationPayload), which MoveBlocks, WriteBlocks and a peer's
// Notify all apply.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/tensors/notification_board.h"

namespace ferry::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

ferry::v1::Notification Note(const std::string& name, const std::string& payload = "") {
  ferry::v1::Notification n;
  n.set_name(name);
  n.set_from_node("node-a");
  n.set_payload(payload);
  return n;
}

std::vector<std::string> Names(const ferry::v1::PollNotificationsResponse& r) {
  std::vector<std::string> names;
  for (const auto& n : r.notifications()) names.push_back(n.name());
  return names;
}

TEST(NotificationBoardPollTest, AnEmptyBoardAnswersNoneAtOnce) {
  NotificationBoard board;
  const ferry::v1::PollNotificationsResponse r = board.Poll("", 0, 1000);
  EXPECT_EQ(r.notifications_size(), 0);
  EXPECT_FALSE(r.more());
}

TEST(NotificationBoardPollTest, TakesEveryMatchingOneOldestFirstWithItsPayloadOnce) {
  NotificationBoard board;
  board.Post(Note("req-1/done", "blocks 1,2"), 1000);
  board.Post(Note("other/x"), 1000);
  board.Post(Note("req-2/done", std::string(4096, '\xff')), 1000);
  const ferry::v1::PollNotificationsResponse r = board.Poll("req-", 0, 1000);
  EXPECT_THAT(Names(r), ElementsAre("req-1/done", "req-2/done"));
  EXPECT_FALSE(r.more());
  EXPECT_EQ(r.notifications(0).payload(), "blocks 1,2");
  EXPECT_EQ(r.notifications(1).payload(), std::string(4096, '\xff'));
  EXPECT_LT(r.notifications(0).sequence(), r.notifications(1).sequence());
  // Taken: neither a poll nor a wait gets them again; the other prefix is still there.
  EXPECT_EQ(board.Poll("req-", 0, 1000).notifications_size(), 0);
  EXPECT_FALSE(board.Take("req-1/done", "", 1000, absl::InfinitePast(), nullptr).ok());
  EXPECT_THAT(Names(board.Poll("", 0, 1000)), ElementsAre("other/x"));
  EXPECT_EQ(board.size(), 0u);
}

TEST(NotificationBoardPollTest, NeverReturnsAnotherUidsButUnownedOnesToAll) {
  NotificationBoard board;
  board.Post(Note("theirs"), 2000);
  board.Post(Note("mine"), 1000);
  board.Post(Note("unowned"), NotificationBoard::kAnyone);
  EXPECT_THAT(Names(board.Poll("", 0, 1000)), ElementsAre("mine", "unowned"));
  EXPECT_EQ(board.size_for(2000), 1u);
  EXPECT_THAT(Names(board.Poll("", 0, 2000)), ElementsAre("theirs"));
}

TEST(NotificationBoardPollTest, MaxCountTakesTheOldestAndSaysMoreWait) {
  NotificationBoard board;
  for (int i = 0; i < 5; ++i) board.Post(Note(absl::StrCat("n/", i)), 1000);
  const ferry::v1::PollNotificationsResponse first = board.Poll("n/", 2, 1000);
  EXPECT_THAT(Names(first), ElementsAre("n/0", "n/1"));
  EXPECT_TRUE(first.more());
  const ferry::v1::PollNotificationsResponse rest = board.Poll("n/", 0, 1000);
  EXPECT_THAT(Names(rest), ElementsAre("n/2", "n/3", "n/4"));
  EXPECT_FALSE(rest.more());
}

TEST(NotificationBoardPollTest, OneAnswerStaysUnderItsByteBound) {
  NotificationBoard board;
  // 600 of 4 KiB: about 2.4 MiB, more than one answer holds.
  constexpr int kNotes = 600;
  for (int i = 0; i < kNotes; ++i) {
    board.Post(Note(absl::StrCat("big/", i), std::string(NotificationBoard::kMaxPayloadBytes, 'p')),
               1000);
  }
  int taken = 0;
  int polls = 0;
  while (true) {
    const ferry::v1::PollNotificationsResponse r = board.Poll("big/", 0, 1000);
    ++polls;
    EXPECT_LE(r.ByteSizeLong(), NotificationBoard::kMaxPollBytes + 4096);
    EXPECT_EQ(r.notifications(0).name(), absl::StrCat("big/", taken));  // in order
    taken += r.notifications_size();
    if (!r.more()) break;
  }
  EXPECT_EQ(taken, kNotes);
  EXPECT_GE(polls, 3);
}

// A peer that floods one uid with full payloads holds at most payload_capacity bytes of them
// on the board (65536 notifications x 4 KiB would be 256 MiB): the oldest go first, another
// receiver's stay, and the bytes of taken ones are given back.
TEST(NotificationBoardPollTest, PayloadBytesPerReceiverAreBounded) {
  NotificationBoard board(/*capacity=*/65536, /*payload_capacity=*/3 * 4096);
  const std::string full(4096, 'p');
  board.Post(Note("other", full), 2000);
  for (int i = 0; i < 5; ++i) board.Post(Note(absl::StrCat("n", i), full), 1000);
  EXPECT_THAT(Names(board.Poll("", 0, 1000)), ElementsAre("n2", "n3", "n4"));
  EXPECT_THAT(Names(board.Poll("", 0, 2000)), ElementsAre("other"));
  // Taken, their bytes no longer count: three full ones fit again.
  for (int i = 5; i < 8; ++i) board.Post(Note(absl::StrCat("n", i), full), 1000);
  EXPECT_THAT(Names(board.Poll("", 0, 1000)), ElementsAre("n5", "n6", "n7"));
  // One larger than the whole bound (a board made that small) goes alone, leaving it empty.
  NotificationBoard tiny(/*capacity=*/8, /*payload_capacity=*/10);
  tiny.Post(Note("big", std::string(11, 'b')), 1000);
  EXPECT_EQ(tiny.size(), 0u);
  tiny.Post(Note("small", "ok"), 1000);
  EXPECT_THAT(Names(tiny.Poll("", 0, 1000)), ElementsAre("small"));
}

TEST(NotificationPayloadTest, AtMost4096BytesAndOnlyWithANotification) {
  EXPECT_TRUE(CheckNotificationPayload("", "", "notification_payload").ok());
  EXPECT_TRUE(
      CheckNotificationPayload(std::string(4096, 'x'), "req-1", "notification_payload").ok());
  const absl::Status big =
      CheckNotificationPayload(std::string(4097, 'x'), "req-1", "notification_payload");
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.message(), HasSubstr("notification_payload: 4097 bytes is more than 4096"));
  const absl::Status orphan = CheckNotificationPayload("x", "", "notification_payload");
  EXPECT_EQ(orphan.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(orphan.message(), HasSubstr("notification_payload: a payload travels with"));
}

}  // namespace
}  // namespace ferry::server
