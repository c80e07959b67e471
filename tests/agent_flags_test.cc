// ferryd's command line (server/agent/agent_flags.h): flags are checked as the file's keys
// are and override it in order; `ferryd --print-config` prints a config ferryd reads back.

#include "server/agent/agent_flags.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry::server {
namespace {

using ::testing::HasSubstr;

absl::StatusOr<config::Config> Load(const std::vector<std::string>& args) {
  auto line = ParseAgentCommandLine(args);
  if (!line.ok()) return line.status();
  return LoadAgentConfig(*line);
}

std::string ErrorOf(const std::vector<std::string>& args) {
  auto c = Load(args);
  EXPECT_FALSE(c.ok()) << absl::StrJoin(args, " ");
  return c.ok() ? "" : std::string(c.status().message());
}

TEST(AgentFlagsTest, UsageMistakesAreNamed) {
  EXPECT_THAT(ErrorOf({"--bogus"}), HasSubstr("unknown flag '--bogus'"));
  EXPECT_THAT(ErrorOf({"--node"}), HasSubstr("--node: missing value"));
  // --help and --version are answered whatever else the line holds.
  auto help = ParseAgentCommandLine({"--bogus", "--help"});
  ASSERT_TRUE(help.ok());
  EXPECT_TRUE(help->help);
  auto line = ParseAgentCommandLine({"--config", "f.yaml", "--print-config", "--node", "a"});
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_TRUE(line->print_config);
  EXPECT_EQ(line->config_path, "f.yaml");
  EXPECT_EQ(line->settings.size(), 1u);
  EXPECT_THAT(AgentUsage(), HasSubstr("--metrics-listen HOST:PORT"));
}

// Each flag is its key's row of the table: the file's checks, the file's messages.
TEST(AgentFlagsTest, FlagsAreCheckedAsTheFileIs) {
  EXPECT_THAT(ErrorOf({"--log-level", "loud"}), HasSubstr("--log-level: 'loud' is not one of"));
  // The file takes 1..63 (a session admits 64 sockets, one is the express connection); the
  // flag once took 64.
  EXPECT_THAT(ErrorOf({"--tcp-connections", "64"}),
              HasSubstr("--tcp-connections: 64 is outside 1..63"));
  EXPECT_THAT(ErrorOf({"--host-pool", "1KiB"}), HasSubstr("--host-pool: must be at least 1 MiB"));
  EXPECT_THAT(ErrorOf({"--metrics-listen", "nowhere"}),
              HasSubstr("--metrics-listen: 'nowhere' is not host:port"));
  EXPECT_THAT(ErrorOf({"--set", "verbs.retry_cnt=8"}),
              HasSubstr("--set: key 'verbs.retry_cnt': 8 is outside 0..7"));
  EXPECT_THAT(ErrorOf({"--set", "verbs.retry_cnt"}), HasSubstr("is not KEY=VALUE"));
  EXPECT_THAT(ErrorOf({"--set", "verbs.retries=1"}), HasSubstr("unknown key 'verbs.retries'"));
  EXPECT_THAT(ErrorOf({"--peer", "b=nowhere"}), HasSubstr("--peer: 'nowhere' is not host:port"));
  // The rules between keys, after the flags.
  EXPECT_THAT(ErrorOf({"--set", "verbs.send_queue_depth=16"}),
              HasSubstr("key 'verbs.signal_every': 64 exceeds send_queue_depth 16"));
  // And the loopback rule of a config without mutual TLS.
  EXPECT_THAT(ErrorOf({"--peer-listen", "0.0.0.0:7100"}), HasSubstr("listen.peer"));
}

// Issue 47's second agent: the example, with its own node, socket, peer and metrics ports.
TEST(AgentFlagsTest, FlagsOverrideTheFileInOrder) {
  auto c = Load({"--config", FERRY_SOURCE_DIR "/config/ferry.example.yaml", "--node", "node-b",
                 "--socket", "/tmp/ferryd-node-b.sock", "--peer-listen", "[::1]:7101",
                 "--metrics-listen", "127.0.0.1:9465", "--peer", "node-a=127.0.0.1:7100", "--set",
                 "nics.allow=[mlx5_0, mlx5_1]", "--set", "limits.per_uid_buffers=0", "--set",
                 "metrics.listen=127.0.0.1:9466"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->node, "node-b");
  EXPECT_EQ(c->local_socket, "/tmp/ferryd-node-b.sock");
  EXPECT_EQ(c->peer_listen, "[::1]:7101");
  EXPECT_EQ(c->metrics_listen, "127.0.0.1:9466");  // the later flag wins
  EXPECT_EQ(c->peers.at("node-a"), "127.0.0.1:7100");
  EXPECT_EQ(c->nics.allow, (std::vector<std::string>{"mlx5_0", "mlx5_1"}));
  EXPECT_EQ(c->per_uid_buffers, 0u);
  // Off again, as the example has it.
  auto off = Load({"--metrics-listen", "127.0.0.1:9465", "--metrics-listen", ""});
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->metrics_listen, "");
}

// Runs `ferryd ARGS` to its end: its exit code, its stdout in `out`.
int Ferryd(const std::string& args, std::string* out) {
  FILE* pipe = popen(absl::StrCat(FERRY_FERRYD, " ", args, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  out->clear();
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out->append(buffer, n);
  int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(AgentFlagsTest, PrintedConfigIsReadBackAndPrintsTheSame) {
  char dir_template[] = "/tmp/ferry-print-config-XXXXXX";
  ASSERT_NE(mkdtemp(dir_template), nullptr);
  const std::string dir = dir_template, printed = dir + "/printed.yaml";
  for (const std::string args :
       {std::string(""), absl::StrCat("--config " FERRY_SOURCE_DIR, "/config/ferry.example.yaml"),
        absl::StrCat("--config " FERRY_SOURCE_DIR, "/config/ferry.node-b.example.yaml ",
                     "--set verbs.retry_cnt=5 --metrics-listen 127.0.0.1:9465 ",
                     "--set 'tcp.rails={mlx5_0: 10.0.0.1}' --peer node-a=127.0.0.1:7100")}) {
    std::string first, second;
    ASSERT_EQ(Ferryd(args + " --print-config", &first), 0) << args << "\n" << first;
    std::ofstream(printed) << first;
    ASSERT_EQ(Ferryd("--print-config --config " + printed, &second), 0) << second;
    EXPECT_EQ(second, first) << args;
    EXPECT_THAT(first, HasSubstr("\nlimits:\n  max_op_bytes: 1GiB\n"));
  }
  std::string out;
  ASSERT_EQ(Ferryd("--print-config --set verbs.retry_cnt=5 --metrics-listen 127.0.0.1:9465", &out),
            0);
  EXPECT_THAT(out, HasSubstr("\n  retry_cnt: 5\n"));
  EXPECT_THAT(out, HasSubstr("\nmetrics:\n  listen: 127.0.0.1:9465\n"));
  // A bad value is refused as at start, and nothing is printed.
  EXPECT_EQ(Ferryd("--print-config --set verbs.retry_cnt=9", &out), 2);
  EXPECT_THAT(out, HasSubstr("key 'verbs.retry_cnt': 9 is outside 0..7"));
  unlink(printed.c_str());
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace ferry::server
