// The rule every client uses to find its agent (client/agent_channel.h): the default socket,
// and a socket that does not exist refused at once, naming the path and the way out.

#include "client/agent_channel.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

// A temporary folder, removed with what is in it.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/agent_channel_test.XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::system(absl::StrCat("rm -rf ", path_).c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Sets an environment variable for one scope, as it was before afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value == nullptr) {
      unsetenv(name);
    } else {
      setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    if (old_.has_value()) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

std::string HostName() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

TEST(DefaultAgentSocketTest, FerrySocketElseTheHostsName) {
  {
    ScopedEnv env("FERRY_SOCKET", "/run/ferry/ferryd.sock");
    EXPECT_EQ(DefaultAgentSocket(), "/run/ferry/ferryd.sock");
  }
  // Unset and empty alike: ferryd's default when its config names neither node nor socket.
  const std::string by_host = absl::StrCat("/tmp/ferryd-", HostName(), ".sock");
  {
    ScopedEnv env("FERRY_SOCKET", nullptr);
    EXPECT_EQ(DefaultAgentSocket(), by_host);
  }
  {
    ScopedEnv env("FERRY_SOCKET", "");
    EXPECT_EQ(DefaultAgentSocket(), by_host);
  }
}

TEST(ConnectAgentChannelTest, AMissingSocketFailsAtOnceNamingThePathAndTheAgentsBesideIt) {
  TempDir dir;
  // Another agent's socket in the same folder: the hint names it.
  const std::string other = dir.path() + "/ferryd-node-a.sock";
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  ASSERT_LT(other.size(), sizeof(addr.sun_path));
  other.copy(addr.sun_path, other.size());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);

  const std::string missing = dir.path() + "/ferryd-vm.sock";
  const absl::Time start = absl::Now();
  auto channel = ConnectAgentChannel(missing, absl::Seconds(10));
  EXPECT_LT(absl::Now() - start, absl::Seconds(1)) << "waited for a socket that is not there";
  ASSERT_FALSE(channel.ok());
  EXPECT_EQ(channel.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(channel.status().message(),
              HasSubstr(absl::StrCat("no ferryd socket at ", missing, " (no such file)")));
  EXPECT_THAT(channel.status().message(), HasSubstr("--socket PATH"));
  EXPECT_THAT(channel.status().message(), HasSubstr("FERRY_SOCKET=PATH"));
  EXPECT_THAT(channel.status().message(), HasSubstr(absl::StrCat("sockets there: ", other)));
  close(fd);

  // "" is the default rule.
  ScopedEnv env("FERRY_SOCKET", missing.c_str());
  auto by_default = ConnectAgentChannel("", absl::Seconds(10));
  ASSERT_FALSE(by_default.ok());
  EXPECT_THAT(by_default.status().message(), HasSubstr(missing));
}

// An agent that holds the socket's lock is starting (or restarting): the client waits for
// it, up to its timeout, as for an agent that does not answer yet.
TEST(ConnectAgentChannelTest, ASocketWhoseLockIsHeldIsWaitedFor) {
  TempDir dir;
  const std::string socket_path = dir.path() + "/ferryd-starting.sock";
  int lock = open((socket_path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(flock(lock, LOCK_EX | LOCK_NB), 0);
  const absl::Time start = absl::Now();
  auto channel = ConnectAgentChannel(socket_path, absl::Milliseconds(300));
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(250));
  ASSERT_FALSE(channel.ok());
  EXPECT_THAT(channel.status().message(), HasSubstr("no ferryd answers at unix:" + socket_path));
  EXPECT_THAT(channel.status().message(), HasSubstr("FERRY_SOCKET=PATH"));
  close(lock);

  // A lock file left by an agent that has gone (nobody holds it) is no reason to wait.
  const absl::Time again = absl::Now();
  auto gone = ConnectAgentChannel(socket_path, absl::Seconds(10));
  EXPECT_LT(absl::Now() - again, absl::Seconds(1));
  EXPECT_THAT(gone.status().message(), HasSubstr("no ferryd socket at " + socket_path));
}

}  // namespace
}  // namespace ferry
