// The local API's owners (issue 15): the agent knows each local client's uid from the
// socket (SO_PEERCRED), records it as the owner of what the client allocates, and another
// uid may not free, map, move or borrow the session of it, unless root or in the admin
// group. The socket's mode and group come from config. A second uid needs root to make
// (the helper drops to it); elsewhere the tests say why they skip.

#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/agent_process.h"
#include "client/child_process.h"
#include "base/unique_fd.h"
#include "client/ferry_client.h"
#include "client/shared_memory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent_pair.h"
#include "tests/report_lines.h"
#include "tests/text_file.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

constexpr uint32_t kNobody = 65534;  // Debian's nobody / nogroup
constexpr int kPermissionDenied = 7, kOk = 0, kNotFound = 5, kUnavailable = 14;

// The agent's fd socket, as GetInfo names it.
std::string FdSocketOf(Client& c) {
  auto info = c.GetInfo();
  EXPECT_TRUE(info.ok());
  return info.ok() ? info->fd_socket() : "";
}

// The helper's report: "<what>: <code> <message>" lines.
std::string RunAsNobody(const std::string& dir, const std::string& socket, uint64_t victim,
                        uint64_t session, uint64_t ticket = 0) {
  const std::string out = absl::StrCat(dir, "/other-uid.txt");
  std::vector<std::string> args = {FERRY_OTHER_UID_CLIENT, absl::StrCat(kNobody), socket,
                                   absl::StrCat(victim),   absl::StrCat(session), "node-u",
                                   "landing"};
  if (ticket != 0) args.push_back(absl::StrCat(ticket));
  auto pid = SpawnChild(args, out);
  EXPECT_TRUE(pid.ok()) << pid.status();
  int status = 0;
  if (pid.ok()) waitpid(*pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFile(out);
  return ReadFile(out);
}

class LocalAccessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root: the helper drops to uid 65534";
    dir_ = MakeTempDir();
    // The helper (uid nobody) must reach the socket, which lives in our folder.
    chmod(dir_.c_str(), 0755);
  }
  void TearDown() override {
    client_.reset();
    if (agent_) agent_->Stop();
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }
  void Start(const std::string& mode, const std::string& extra = "") {
    AgentSpec spec{"node-u", dir_, 0, {}, extra};
    spec.local_mode = mode;
    auto agent = AgentProcess::Start(spec);
    ASSERT_TRUE(agent.ok()) << agent.status();
    agent_ = std::move(*agent);
    auto c = Client::Connect(agent_->socket());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = std::move(*c);
    auto victim = client_->Alloc(1 << 20, "victim");
    auto landing = client_->Alloc(1 << 20, "landing");
    ASSERT_TRUE(victim.ok() && landing.ok());
    victim_ = std::move(*victim);
    landing_ = std::move(*landing);
  }

  std::string dir_;
  std::unique_ptr<AgentProcess> agent_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<Buffer> victim_, landing_;
};

TEST_F(LocalAccessTest, AnotherUidCannotFreeMapMoveOrBorrowTheSession) {
  Start("0666");
  auto buffers = client_->ListBuffers();
  ASSERT_TRUE(buffers.ok());
  EXPECT_THAT(buffers->front().owner(), HasSubstr("uid 0"));
  // A descriptor of ours, passed to the fd socket: its ticket is ours alone.
  UniqueFd memfd(memfd_create("local-access-test", MFD_CLOEXEC));
  ASSERT_TRUE(memfd.valid());
  ASSERT_EQ(ftruncate(memfd.get(), 4096), 0);
  auto ticket = PassFd(FdSocketOf(*client_), memfd.get());
  ASSERT_TRUE(ticket.ok()) << ticket.status();
  std::string report =
      RunAsNobody(dir_, agent_->socket(), victim_->id(), client_->session().id(), *ticket);
  EXPECT_EQ(CodeOf(Line(report, "ticket")), kPermissionDenied) << report;
  EXPECT_THAT(Line(report, "ticket"), HasSubstr("passed by uid 0, not uid 65534"));
  // Still ours to use.
  {
    grpc::ClientContext ctx;
    client_->session().Attach(&ctx);
    ferry::v1::RegisterMemoryRequest req;
    req.set_fd_ticket(*ticket);
    req.set_length(4096);
    ferry::v1::RegisterMemoryResponse resp;
    grpc::Status s = client_->stub().RegisterMemory(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_TRUE(client_->DeregisterMemory(resp.buffer().id()).ok());
  }
  EXPECT_EQ(CodeOf(Line(report, "free")), kPermissionDenied) << report;
  EXPECT_THAT(Line(report, "free"), HasSubstr("belongs to uid 0; uid 65534 may not use it"));
  EXPECT_EQ(CodeOf(Line(report, "session")), kPermissionDenied) << report;
  EXPECT_THAT(Line(report, "session"), HasSubstr("ferry-session: session"));
  EXPECT_EQ(CodeOf(Line(report, "submit")), kPermissionDenied) << report;
  EXPECT_THAT(Line(report, "submit"), HasSubstr("ops[0].local_buffer: buffer"));
  EXPECT_EQ(CodeOf(Line(report, "socket move")), kPermissionDenied) << report;
  EXPECT_THAT(Line(report, "socket move"), HasSubstr("move.session: session"));
  EXPECT_EQ(CodeOf(Line(report, "list mapping=absent")), kOk) << report;
  // Its own: allocated as uid 65534, freed by it.
  EXPECT_EQ(CodeOf(Line(report, "own alloc")), kOk) << report;
  EXPECT_EQ(Line(report, "own owner"), "uid 65534") << report;
  EXPECT_EQ(CodeOf(Line(report, "own free")), kOk) << report;
  // Ours is untouched and still ours.
  auto after = client_->ListBuffers();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->size(), 2u);
}

TEST_F(LocalAccessTest, TheAdminGroupMayActOnEveryUidsBuffers) {
  Start("0666", "security:\n  mode: insecure\n  admin_group: nogroup\n");
  std::string report =
      RunAsNobody(dir_, agent_->socket(), victim_->id(), client_->session().id());
  // uid 65534 is in nogroup: our session, our buffer in its Submit, its mapping are its to use.
  EXPECT_EQ(CodeOf(Line(report, "session")), kOk) << report;
  EXPECT_EQ(CodeOf(Line(report, "submit")), kOk) << report;
  EXPECT_THAT(report, HasSubstr("list mapping=/")) << report;
  // Its move in our session passes the session check; our session has no list 1.
  EXPECT_EQ(CodeOf(Line(report, "socket move")), kNotFound) << report;
  EXPECT_THAT(Line(report, "socket move"), HasSubstr("list: list 1 does not exist")) << report;
  // Freeing a buffer another session holds stays that session's (or its end's) business,
  // whoever asks: sessions free what they own.
  EXPECT_THAT(Line(report, "free"), HasSubstr("only its owner frees it")) << report;
}

TEST_F(LocalAccessTest, TheSocketsModeAndGroupComeFromConfig) {
  AgentSpec spec{"node-u", dir_, 0, {}, ""};
  spec.local_mode = "0600";
  spec.local_group = "nogroup";
  auto agent = AgentProcess::Start(spec);
  ASSERT_TRUE(agent.ok()) << agent.status();
  agent_ = std::move(*agent);
  struct stat st = {};
  ASSERT_EQ(stat(agent_->socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_gid, kNobody);
  // Owner-only: another uid cannot even connect.
  std::string report = RunAsNobody(dir_, agent_->socket(), 1, 1);
  EXPECT_EQ(CodeOf(Line(report, "free")), kUnavailable) << report;
}

TEST(LocalAccessConfigTest, AnUnknownGroupStopsTheAgentNamingTheKey) {
  std::string dir = MakeTempDir();
  AgentSpec spec{"node-g", dir, 0, {}, ""};
  spec.local_group = "no-such-group-here";
  auto agent = AgentProcess::Start(spec);
  EXPECT_FALSE(agent.ok());
  EXPECT_THAT(ReadFile(absl::StrCat(dir, "/node-g.log")),
              HasSubstr("listen.local_group: no group named 'no-such-group-here'"));
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace ferry
