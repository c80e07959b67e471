// A node shared by tenants (issue 44): a second uid (made by dropping root to nobody in
// tests/tenant_attacker.cc) reaches none of the victim's data or handles and none of the
// node's settings. Rows checked: 3 (the victim's buffer through the node's own name), 4 (its
// transfers, pending receive, landing buffer, notifications; policy, NIC state, peers) and
// 9 (notifications are the receiving uid's). After the attack the victim's data, transfer,
// receive and notification are as they were, and the node's settings unchanged. Row 11: a
// non-root client maps what it allocated (the agent lends each buffer's own file over the
// fd socket), and no other uid gets that file.

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "client/agent_process.h"
#include "client/child_process.h"
#include "client/ferry_client.h"
#include "client/shared_memory.h"
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
constexpr uint64_t kKeptBytes = 64 << 10;  // a 4 KiB buffer takes the pool's 64 KiB alignment

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

  std::string Attack(uint64_t victim_transfer, const std::string& tag, uint64_t victim_buffer) {
    const std::string out = absl::StrCat(dir_, "/attacker.txt");
    auto pid = SpawnChild({FERRY_TENANT_ATTACKER, absl::StrCat(kNobody), agent_->socket(),
                           "node-t", "victim", absl::StrCat(victim_transfer), tag,
                           absl::StrCat(victim_buffer)},
                          out);
    EXPECT_TRUE(pid.ok()) << pid.status();
    int status = 0;
    if (pid.ok()) waitpid(*pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(out);
    return ReadFile(out);
  }

  // Runs tests/other_uid_alloc.cc as `uid` with `args` after its uid, socket and node.
  std::string AsUid(uint32_t uid, std::vector<std::string> args, const std::string& tag) {
    const std::string out = absl::StrCat(dir_, "/", tag, ".txt");
    std::vector<std::string> argv = {FERRY_OTHER_UID_ALLOC, absl::StrCat(uid), agent_->socket(),
                                     "node-t"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto pid = SpawnChild(argv, out);
    EXPECT_TRUE(pid.ok()) << pid.status();
    int status = 0;
    if (pid.ok()) waitpid(*pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(out);
    return ReadFile(out);
  }

  uint64_t PoolUsed() {
    auto info = client_->GetInfo();
    return info.ok() ? info->host_pool_used_bytes() : ~uint64_t{0};
  }
  // The agent's descriptors for buffer files (memfds; its own sockets and connections to
  // itself, made by the first transfer, stay).
  size_t AgentMemfds() {
    size_t n = 0;
    for (const std::string& t : AgentFdTargets()) n += absl::StartsWith(t, "/memfd:");
    return n;
  }
  // What each of the agent's descriptors is ("socket:[N]", "/memfd:ferry-pool (deleted)").
  std::vector<std::string> AgentFdTargets() {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(
             absl::StrCat("/proc/", agent_->pid(), "/fd"), ec)) {
      out.push_back(std::filesystem::read_symlink(e.path(), ec).string());
    }
    return out;
  }
  // Waits up to 10 s for `done`.
  template <typename F>
  bool Eventually(F done) {
    for (int i = 0; i < 200; ++i) {
      if (done()) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return done();
  }

  std::string dir_;
  std::unique_ptr<AgentProcess> agent_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<TensorClient> tensors_;
};

TEST_F(TenantIsolationTest, AnotherUidReachesNoneOfTheVictimsDataHandlesOrTheNodesSettings) {
  // The victim (root): a secret in "victim" (the attacker's Recv names its id), a landing
  // buffer, a finished transfer, a pending receive and an untaken notification.
  auto victim = client_->Alloc(1 << 20, "victim");
  auto landing = client_->Alloc(1 << 20, "landing");
  ASSERT_TRUE(victim.ok() && landing.ok());
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

  const std::string report = Attack(*transfer, "victim-tag", (*victim)->id());
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

TEST_F(TenantIsolationTest, ANonRootClientMapsWhatItAllocatedAndNoOtherUidGetsIt) {
  const uint64_t pool_before = PoolUsed();
  ASSERT_EQ(AgentMemfds(), 0u);
  ASSERT_EQ(pool_before, 0u);

  // Row 11: before, alloc failed "PERMISSION_DENIED: open(/proc/<pid>/fd/4) to map buffer".
  const std::string own = AsUid(kNobody, {"own"}, "own");
  EXPECT_EQ(CodeOf(Line(own, "alloc")), kOk) << own;
  EXPECT_EQ(CodeOf(Line(own, "write")), kOk) << own;
  EXPECT_EQ(CodeOf(Line(own, "read")), kOk) << own;
  EXPECT_THAT(own, HasSubstr("verified: 1\n"));
  EXPECT_EQ(CodeOf(Line(own, "borrow own")), kOk) << own;
  EXPECT_EQ(Line(own, "truncate own"), strerror(EPERM)) << "sealed: agent memory cannot shrink";
  ASSERT_EQ(CodeOf(Line(own, "persist")), kOk) << own;
  uint64_t kept = 0;
  ASSERT_TRUE(absl::SimpleAtoi(Line(own, "persisted"), &kept)) << own;

  // Another uid asks the fd socket for it: refused, naming both uids.
  const std::string steal = AsUid(kNobody - 1, {"steal", absl::StrCat(kept)}, "steal");
  EXPECT_EQ(CodeOf(Line(steal, "steal")), kPermissionDenied) << steal;
  EXPECT_THAT(Line(steal, "steal"), HasSubstr("belongs to uid 65534; uid 65533 may not use it"));
  // Root may (as it may free it).
  auto info = client_->GetInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(BorrowBufferFile(info->fd_socket(), kept).ok());

  // The client went: its session's buffers are freed, the persisting one stays until freed,
  // and each buffer's file is closed with it.
  EXPECT_TRUE(Eventually([&] { return PoolUsed() == kKeptBytes && AgentMemfds() == 1; }))
      << "pool used " << PoolUsed() << "; agent fds " << absl::StrJoin(AgentFdTargets(), " ");
  ASSERT_TRUE(client_->Free(kept).ok());
  EXPECT_TRUE(Eventually([&] { return PoolUsed() == 0 && AgentMemfds() == 0; }))
      << "pool used " << PoolUsed() << "; agent fds " << absl::StrJoin(AgentFdTargets(), " ");
}

}  // namespace
}  // namespace ferry
