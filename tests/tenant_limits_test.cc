// Per-client limits of a node shared by tenants (issue 44), on the agent's parts themselves:
// a notification flood to one receiver drops only that receiver's oldest (row 9); idle
// connections on the fd socket hold up nobody (row 10); registrations stop short of the
// descriptor limit (row 5).

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/unique_fd.h"
#include "client/shared_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/buffers/open_files.h"
#include "server/local/fd_inbox.h"
#include "server/tensors/notification_board.h"
#include "tests/agent_pair.h"

namespace ferry::server {
namespace {

using ::testing::HasSubstr;

ferry::v1::Notification Note(const std::string& name, const std::string& from) {
  ferry::v1::Notification n;
  n.set_name(name);
  n.set_from_node(from);
  return n;
}

TEST(NotificationBoardTest, AFloodToOneReceiverNeverDropsAnothers) {
  NotificationBoard board(/*capacity=*/100);
  board.Post(Note("victim/req-1", "node-b"), /*owner=*/1000);
  // 300 from node-x to uid 2000 (an attacker's own list), and 300 from node-b to uid 1000
  // under other names: each receiver keeps its newest 100, nobody else's is touched.
  for (int i = 0; i < 300; ++i) board.Post(Note(absl::StrCat("flood/", i), "node-x"), 2000);
  EXPECT_EQ(board.size_for(1000), 1u);
  EXPECT_EQ(board.size_for(2000), 100u);
  auto taken = board.Take("victim/req-1", "", 1000, absl::Now(), nullptr);
  EXPECT_TRUE(taken.ok()) << taken.status();
  // The flood kept its newest.
  EXPECT_FALSE(board.Take("flood/0", "", 2000, absl::Now(), nullptr).ok());
  EXPECT_TRUE(board.Take("flood/299", "", 2000, absl::Now(), nullptr).ok());
}

TEST(NotificationBoardTest, ATakerGetsItsOwnAndUnownedNeverAnothersUids) {
  NotificationBoard board;
  board.Post(Note("mine", "node-b"), 1000);
  board.Post(Note("theirs", "node-b"), 2000);
  board.Post(Note("nobodys", "node-b"), NotificationBoard::kAnyone);
  EXPECT_FALSE(board.Take("theirs", "", 1000, absl::Now(), nullptr).ok());
  EXPECT_FALSE(board.TakePrefix("the", 1000, absl::Now()).has_value());
  EXPECT_TRUE(board.Take("mine", "", 1000, absl::Now(), nullptr).ok());
  EXPECT_TRUE(board.TakePrefix("nob", 1000, absl::Now()).has_value());
  // A caller known by its certificate only (local_tcp) takes any.
  EXPECT_TRUE(board.Take("theirs", "", NotificationBoard::kAnyone, absl::Now(), nullptr).ok());
  EXPECT_EQ(board.size(), 0u);
}

TEST(FdInboxTest, IdleConnectionsHoldUpNobody) {
  const std::string dir = MakeTempDir();
  auto inbox = FdInbox::Start(dir + "/fd.sock", 0600, static_cast<gid_t>(-1));
  ASSERT_TRUE(inbox.ok()) << inbox.status();
  // Clients connect and say nothing (before: each held the accept thread 1 s, and 20 of them
  // made every other RegisterMemory wait 20 s): as many as one uid may keep waiting, but one.
  std::vector<UniqueFd> idle;
  for (size_t i = 0; i + 1 < FdInbox::kMaxPendingPerUid; ++i) {
    UniqueFd s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", (*inbox)->path().c_str());
    ASSERT_EQ(connect(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    idle.push_back(std::move(s));
  }
  UniqueFd memfd(memfd_create("tenant_limits_test", MFD_CLOEXEC));
  ASSERT_TRUE(memfd.valid());
  const absl::Time start = absl::Now();
  auto ticket = PassFd((*inbox)->path(), memfd.get());
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  EXPECT_LT(took, absl::Milliseconds(500)) << "a descriptor waited behind idle connections";
  std::printf("a descriptor passed in %s beside %zu idle connections\n",
              absl::FormatDuration(took).c_str(), idle.size());
  // One more fills the uid's share; the next is closed at once.
  UniqueFd last(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  {
    sockaddr_un addr = {};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", (*inbox)->path().c_str());
    ASSERT_EQ(connect(last.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  }
  absl::SleepFor(absl::Milliseconds(50));
  UniqueFd extra(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", (*inbox)->path().c_str());
  ASSERT_EQ(connect(extra.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  char byte = 0;
  timeval tv = {2, 0};
  setsockopt(extra.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  EXPECT_EQ(recv(extra.get(), &byte, 1, 0), 0) << "over the cap, the connection ends";
  idle.clear();
  inbox->reset();
  std::system(("rm -rf " + dir).c_str());
}

TEST(OpenFilesTest, RegistrationsStopShortOfTheDescriptorLimitNamingIt) {
  rlimit saved = {};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit lower = saved;
  lower.rlim_cur = 4000;
  if (lower.rlim_cur > saved.rlim_max) GTEST_SKIP() << "hard limit below 4000";
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lower), 0);
  // kReservedFds (1024) are kept for the agent's own sockets.
  EXPECT_TRUE(RoomForClientFd(2975).ok());
  absl::Status full = RoomForClientFd(2976);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("holds 2976 client descriptors"));
  EXPECT_THAT(full.message(), HasSubstr("RLIMIT_NOFILE is 4000 and 1024 are kept"));
  // Under a limit too low for that (a container's 128), half is kept: a client's buffer,
  // which holds one descriptor, still fits.
  lower.rlim_cur = 128;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lower), 0);
  EXPECT_TRUE(RoomForClientFd(63).ok());
  full = RoomForClientFd(64);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("RLIMIT_NOFILE is 128 and 64 are kept"));
  // The agent raises its soft limit to the hard one at start.
  EXPECT_EQ(RaiseOpenFileLimit(), saved.rlim_max == RLIM_INFINITY ? UINT64_MAX : saved.rlim_max);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
}

}  // namespace
}  // namespace ferry::server
