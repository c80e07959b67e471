// libferry's notifications as a program sees them (<ferry/ferry_client.h> only, linked to
// libferry.so): a WriteBlocks payload reaches the receiver byte for byte through
// WaitNotification and PollNotifications, and one over 4096 bytes is refused before
// anything moves. Run by tests/sdk_with_agent.sh, which starts the agent and names it in
// $FERRY_SOCKET; the notifications go to the agent's own node, so one agent is enough.
#include <ferry/ferry_client.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace {

using ::testing::HasSubstr;

constexpr uint64_t kSize = 64 << 10;
constexpr size_t kMaxPayload = 4096;  // the agent's limit (NotificationBoard::kMaxPayloadBytes)

// `size` bytes that no truncation or C-string copy keeps: every byte value, NULs included.
std::string Payload(size_t size, unsigned seed) {
  std::string p(size, '\0');
  for (size_t i = 0; i < size; ++i) p[i] = static_cast<char>((i * 131 + seed) & 0xff);
  return p;
}

class SdkNotificationsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto client = ferry::Client::Connect();  // $FERRY_SOCKET
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
    auto info = client_->GetInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    node_ = info->node;
    // A name of the test's own: the last test's buffer goes with its session, which the
    // agent may end after this one began.
    target_name_ =
        std::string("sdk-") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ferry::AllocOptions named;
    named.name = target_name_;
    auto target = client_->Alloc(kSize, named);
    ASSERT_TRUE(target.ok()) << target.status();
    target_ = std::move(*target);
    std::memset(target_->data(), 0, kSize);
    auto source = client_->Alloc(kSize);
    ASSERT_TRUE(source.ok()) << source.status();
    source_ = std::move(*source);
    for (uint64_t i = 0; i < kSize; ++i) source_->data()[i] = static_cast<char>(i * 7 + 3);
  }

  // Two blocks of the source into the named target, notifying `name` with `payload`.
  absl::StatusOr<uint64_t> WriteBlocks(const std::string& name, const std::string& payload) {
    const std::vector<ferry::Block> blocks = {{0, 4096, 4096}, {8192, 0, 4096}};
    return client_->WriteBlocks(source_->id(), node_, target_name_, blocks, name, absl::Seconds(30),
                                payload);
  }

  std::unique_ptr<ferry::Client> client_;
  std::string node_;
  std::string target_name_;
  std::unique_ptr<ferry::Buffer> target_;
  std::unique_ptr<ferry::Buffer> source_;
};

TEST_F(SdkNotificationsTest, WaitNotificationCarriesTheWholePayload) {
  const std::string payload = Payload(kMaxPayload, 1);
  ASSERT_EQ(payload[0], '\1');
  ASSERT_NE(payload.find('\0'), std::string::npos);
  auto written = WriteBlocks("sdk-wait/full", payload);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(*written, 8192u);

  auto note = client_->WaitNotification("sdk-wait/full", node_, absl::Seconds(10));
  ASSERT_TRUE(note.ok()) << note.status();
  EXPECT_EQ(note->from_node, node_);
  EXPECT_EQ(note->blocks, 2u);
  EXPECT_EQ(note->bytes, 8192u);
  ASSERT_EQ(note->payload.size(), kMaxPayload);
  EXPECT_TRUE(note->payload == payload) << "the payload's bytes differ";
  EXPECT_EQ(std::memcmp(target_->data() + 4096, source_->data(), 4096), 0);
}

TEST_F(SdkNotificationsTest, PollNotificationsCarriesEachPayload) {
  const std::string with_nul("a\0b", 3);
  const std::string full = Payload(kMaxPayload, 2);
  ASSERT_TRUE(WriteBlocks("sdk-poll/nul", with_nul).ok());
  ASSERT_TRUE(WriteBlocks("sdk-poll/full", full).ok());
  ASSERT_TRUE(WriteBlocks("sdk-poll/none", "").ok());

  auto polled = client_->PollNotifications("sdk-poll/");
  ASSERT_TRUE(polled.ok()) << polled.status();
  ASSERT_EQ(polled->size(), 3u);
  EXPECT_EQ((*polled)[0].name, "sdk-poll/nul");
  EXPECT_EQ((*polled)[0].payload, with_nul);
  EXPECT_EQ((*polled)[1].name, "sdk-poll/full");
  ASSERT_EQ((*polled)[1].payload.size(), kMaxPayload);
  EXPECT_TRUE((*polled)[1].payload == full) << "the payload's bytes differ";
  EXPECT_EQ((*polled)[2].name, "sdk-poll/none");
  EXPECT_EQ((*polled)[2].payload, "");
  EXPECT_LT((*polled)[0].sequence, (*polled)[1].sequence);
}

TEST_F(SdkNotificationsTest, AnOversizePayloadIsRefusedAndNothingMoves) {
  auto written = WriteBlocks("sdk-big/refused", Payload(kMaxPayload + 1, 3));
  ASSERT_FALSE(written.ok());
  EXPECT_EQ(written.status().code(), absl::StatusCode::kInvalidArgument) << written.status();
  EXPECT_THAT(written.status().message(), HasSubstr("notification_payload"));
  EXPECT_THAT(written.status().message(), HasSubstr("4097"));

  auto polled = client_->PollNotifications("sdk-big/");
  ASSERT_TRUE(polled.ok()) << polled.status();
  EXPECT_TRUE(polled->empty()) << polled->size() << " notifications delivered";
  const std::vector<char> zeros(kSize, 0);
  EXPECT_EQ(std::memcmp(target_->data(), zeros.data(), kSize), 0) << "refused blocks landed";
}

TEST_F(SdkNotificationsTest, APayloadWithoutANotificationIsRefused) {
  auto written = WriteBlocks("", "orphan");
  ASSERT_FALSE(written.ok());
  EXPECT_EQ(written.status().code(), absl::StatusCode::kInvalidArgument) << written.status();
  EXPECT_THAT(written.status().message(), HasSubstr("notification_payload"));
}

}  // namespace
