// A node shared by tenants (issue 44): a second uid (made by dropping root to nobody in
// tests/tenant_attacker.cc) reaches none of the victim's data or handles and none of the
// node's settings. Rows checked: 3 (the victim's buffer through the node's own name), 4 (its
// transfers, pending receive, landing buffer, notifications; policy, NIC state, peers) and
// 9 (notifications are the receiving uid's). After the attack the victim's data, transfer,
// receive and notification are as they were, and the node's settings unchanged.

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "client/agent_process.h"
#include "client/child_process.h"
#include "client/ferry_client.h"
#include "client/tensor_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent_pair.h"
#include "tests/report_lines.h"
#include "tests/text_file.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kNobody = 65534;  // Debian's nobody / nogroup
constexpr int kPermissionDenied = 7, kOk = 0;

class TenantIsolationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root: the attacker drops to uid 65534";
    dir_ = MakeTempDir();
    chmod(dir_.c_str(), 0755);  // the attacker must reach the socket in our folder
    AgentSpec spec{"node-t", dir_, 0, {}, ""};
    spec.local_mode = "0666";
    auto agent = AgentProcess::Start(spec);
    ASSERT_TRUE(agent.ok()) << agent.status();
    agent_ = std::move(*agent);
    auto c = Client::Connect(agent_->socket());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
  }
  void TearDown() override {
    tensors_.reset();
    client_.reset();
    if (agent_) agent_->Stop();
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }

  std::string Attack(uint64_t victim_transfer, const std::string& tag) {
    const std::string out = absl::StrCat(dir_, "/attacker.txt");
    auto pid = SpawnChild({FERRY_TENANT_ATTACKER, absl::StrCat(kNobody), agent_->socket(),
                           "node-t", "victim", absl::StrCat(victim_transfer), tag},
                          out);
    EXPECT_TRUE(pid.ok()) << pid.status();
    int status = 0;
    if (pid.ok()) waitpid(*pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(out);
    return ReadFile(out);
  }

  std::string dir_;
  std::unique_ptr<AgentProcess> agent_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<TensorClient> tensors_;
};

TEST_F(TenantIsolationTest, AnotherUidReachesNoneOfTheVictimsDataHandlesOrTheNodesSettings) {
  // The victim (root): a secret in "victim" (the attacker's Recv names its id, 1), a
  // landing buffer, a finished transfer, a pending receive and an untaken notification.
  auto victim = client_->Alloc(1 << 20, "victim");
  auto landing = client_->Alloc(1 << 20, "landing");
  ASSERT_TRUE(victim.ok() && landing.ok());
  ASSERT_EQ((*victim)->id(), 1u);
  std::memset((*victim)->data(), 'S', 1 << 20);
  auto transfer = client_->Submit({{ferry::v1::WRITE, (*victim)->id(), 0, "node-t", "landing", 0,
                                    4096}});
  ASSERT_TRUE(transfer.ok()) << transfer.status();
  auto done = client_->Wait(*transfer, absl::Seconds(20));
  ASSERT_TRUE(done.ok() && done->state() == ferry::v1::SUCCEEDED) << done.status();
  tensors_ = std::make_unique<TensorClient>(client_->shared_session());
  absl::Notification received;
  absl::Status recv_status;
  tensors_->RecvAsync("node-t", "victim-tag", {}, {.timeout = absl::Seconds(30)},
                      [&](absl::StatusOr<ReceivedTensor> r) {
                        recv_status = r.status();
                        received.Notify();
                      });
  auto blocks = tensors_->WriteBlocks((*victim)->id(), "node-t", "landing", {{0, 8192, 4096}},
                                      "victim/req-1");
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  auto policy_before = client_->GetPolicy();
  ASSERT_TRUE(policy_before.ok());
  // The receive is posted before the attacker looks for it.
  for (int i = 0; i < 100; ++i) {
    auto pending = tensors_->ListPending();
    if (pending.ok() && pending->recvs_size() == 1) break;
    absl::SleepFor(absl::Milliseconds(20));
  }

  const std::string report = Attack(*transfer, "victim-tag");
  for (const char* what :
       {"self write", "self read", "self stat", "self blocks", "wait", "cancel", "watch",
        "set policy", "nic down", "add peer", "remove peer", "tensor cancel",
        "recv into victim"}) {
    EXPECT_EQ(CodeOf(Line(report, what)), kPermissionDenied) << what << "\n" << report;
  }
  EXPECT_THAT(Line(report, "self write"),
              HasSubstr("remote_buffer: buffer 'victim' of this node belongs to uid 0"));
  EXPECT_THAT(Line(report, "wait"), HasSubstr("transfer_id: transfer"));
  EXPECT_THAT(Line(report, "set policy"),
              HasSubstr("Agent.SetPolicy is an operator call"));
  EXPECT_THAT(Line(report, "tensor cancel"), HasSubstr("belongs to another uid"));
  EXPECT_THAT(report, HasSubstr("transfers seen: 0\n"));
  EXPECT_THAT(report, HasSubstr("buffers seen: 1\n"));  // its own
  EXPECT_THAT(report, HasSubstr("pending seen: 0\n"));
  EXPECT_THAT(report, HasSubstr("notifications seen: 0\n"));
  EXPECT_THAT(report, HasSubstr("notifications taken: 0\n"));
  EXPECT_EQ(CodeOf(Line(report, "own alloc")), kOk) << report;
  EXPECT_EQ(CodeOf(Line(report, "own free")), kOk) << report;

  // Everything of the victim's is as it was.
  EXPECT_EQ(std::string((*victim)->data(), 64), std::string(64, 'S'));
  auto note = tensors_->WaitNotification("victim/req-1", "", {.timeout = absl::Seconds(5)});
  EXPECT_TRUE(note.ok()) << note.status();
  auto still = client_->Wait(*transfer, absl::Seconds(1));
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->state(), ferry::v1::SUCCEEDED);
  EXPECT_FALSE(received.HasBeenNotified()) << "the victim's receive ended: " << recv_status;
  auto cancelled = tensors_->Cancel("node-t", "victim-tag");
  EXPECT_TRUE(cancelled.ok()) << cancelled.status();
  received.WaitForNotificationWithTimeout(absl::Seconds(10));
  auto policy_after = client_->GetPolicy();
  ASSERT_TRUE(policy_after.ok());
  EXPECT_EQ(policy_after->generation(), policy_before->generation());
  auto info = client_->GetInfo();
  ASSERT_TRUE(info.ok());
  ASSERT_GT(info->nics_size(), 0);
  for (const auto& nic : info->nics()) EXPECT_EQ(nic.health(), "ok") << nic.rail();
  // node-t is still its own peer, where it was: transfers to it work.
  EXPECT_TRUE(client_->Write(**victim, 0, "node-t", "landing", 0, 4096).ok());
}

}  // namespace
}  // namespace ferry
