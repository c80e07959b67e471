// Real ferryd processes over real sockets: the demo's flows, big batches, every bad input,
// a peer killed mid-transfer, and a peer restarting.

#include <signal.h>
#include <sys/stat.h>
#include <stdlib.h>

#include <cstring>
#include <fstream>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/agent_process.h"
#include "client/dev_pki.h"
#include "tests/agent_pair.h"
#include "client/ferry_client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

class AgentIntegrationTest : public SharedPairTest<AgentIntegrationTest> {
 public:
  static constexpr char kYaml[] = "limits:\n  max_op_bytes: 64MiB\n";
};

TEST_F(AgentIntegrationTest, WriteThenReadBack64MiB) {
  auto src = A().Alloc(64 << 20);
  auto dst = B().Alloc(64 << 20, "bulk-64");
  auto back = A().Alloc(64 << 20);
  ASSERT_TRUE(src.ok() && dst.ok() && back.ok());
  Fill(**src, 1);
  ASSERT_TRUE(A().Write(**src, 0, "node-b", "bulk-64", 0, 64 << 20).ok());
  EXPECT_EQ(0, std::memcmp((*src)->data(), (*dst)->data(), 64 << 20));
  ASSERT_TRUE(A().Read(**back, 0, "node-b", "bulk-64", 0, 64 << 20).ok());
  EXPECT_EQ(0, std::memcmp((*src)->data(), (*back)->data(), 64 << 20));
  for (auto* b : {&*src, &*back}) EXPECT_TRUE(A().Free((*b)->id()).ok());
  EXPECT_TRUE(B().Free((*dst)->id()).ok());
}

TEST_F(AgentIntegrationTest, BatchOf4096ScatteredOpsLandsAndReportsEachOp) {
  constexpr int kOps = 4096;
  constexpr uint64_t kBlock = 4096;
  auto src = A().Alloc(kOps * kBlock);
  auto dst = B().Alloc(kOps * kBlock, "kv-4096");
  ASSERT_TRUE(src.ok() && dst.ok());
  Fill(**src, 2);
  std::vector<uint64_t> slot(kOps);
  std::iota(slot.begin(), slot.end(), 0);
  std::shuffle(slot.begin(), slot.end(), std::mt19937(3));
  std::vector<OpSpec> ops;
  for (int i = 0; i < kOps; ++i) {
    ops.push_back({ferry::v1::WRITE, (*src)->id(), i * kBlock, "node-b", "kv-4096",
                   slot[i] * kBlock, kBlock});
  }
  auto result = A().Run(ops, absl::Seconds(60), /*include_ops=*/true);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_TRUE(TransferStatus(*result).ok()) << TransferStatus(*result);
  ASSERT_EQ(result->ops_size(), kOps);
  EXPECT_EQ(result->bytes(), kOps * kBlock);
  for (int i = 0; i < kOps; ++i) {
    EXPECT_EQ(result->ops(i).code(), 0);
    EXPECT_EQ(result->ops(i).bytes(), kBlock);
    EXPECT_EQ(result->ops(i).provider(), "tcp");
    ASSERT_EQ(0,
              std::memcmp((*src)->data() + i * kBlock, (*dst)->data() + slot[i] * kBlock, kBlock))
        << i;
  }
  // And the same blocks read back in one READ batch.
  auto back = A().Alloc(kOps * kBlock);
  ASSERT_TRUE(back.ok());
  for (auto& op : ops) op.type = ferry::v1::READ, op.local_buffer = (*back)->id();
  auto read = A().Run(ops);
  ASSERT_TRUE(read.ok() && TransferStatus(*read).ok());
  EXPECT_EQ(0, std::memcmp((*src)->data(), (*back)->data(), kOps * kBlock));
}

TEST_F(AgentIntegrationTest, WatchStreamsProgressToTheEnd) {
  auto src = A().Alloc(16 << 20);
  auto dst = B().Alloc(16 << 20, "watched");
  ASSERT_TRUE(src.ok() && dst.ok());
  std::vector<OpSpec> ops;
  for (int i = 0; i < 256; ++i)
    ops.push_back(
        {ferry::v1::WRITE, (*src)->id(), i * 65536ull, "node-b", "watched", i * 65536ull, 65536});
  auto id = A().Submit(ops);
  ASSERT_TRUE(id.ok());
  ferry::v1::TransferProgress last;
  int updates = 0;
  ASSERT_TRUE(A().Watch(*id,
                        [&](const ferry::v1::TransferProgress& p) {
                          last = p;
                          ++updates;
                        })
                  .ok());
  EXPECT_GE(updates, 1);
  EXPECT_EQ(last.state(), ferry::v1::SUCCEEDED);
  EXPECT_EQ(last.ops_done(), 256u);
  EXPECT_EQ(last.bytes_done(), 16u << 20);
}

// Every kind of bad op is refused for the whole batch, with the field named, and the good
// op in the same batch moves nothing.
TEST_F(AgentIntegrationTest, BadInputIsRefusedWithTheFieldNamedAndNothingMoves) {
  auto src = A().Alloc(1 << 20);
  auto dst = B().Alloc(1 << 20, "guarded");
  auto freed = A().Alloc(4096);
  ASSERT_TRUE(src.ok() && dst.ok() && freed.ok());
  std::memset((*src)->data(), 'x', 1 << 20);
  ASSERT_TRUE(A().Free((*freed)->id()).ok());
  const uint64_t s = (*src)->id();
  OpSpec good{ferry::v1::WRITE, s, 0, "node-b", "guarded", 0, 4096};
  struct Case {
    const char* what;
    OpSpec bad;
    absl::StatusCode code;
    const char* field;
  } cases[] = {
      {"unknown buffer",
       {ferry::v1::WRITE, 999999, 0, "node-b", "guarded", 0, 16},
       absl::StatusCode::kNotFound,
       "ops[1].local_buffer"},
      {"freed buffer",
       {ferry::v1::WRITE, (*freed)->id(), 0, "node-b", "guarded", 0, 16},
       absl::StatusCode::kNotFound,
       "was freed"},
      {"local out of range",
       {ferry::v1::WRITE, s, (1 << 20) - 8, "node-b", "guarded", 0, 16},
       absl::StatusCode::kOutOfRange,
       "ops[1].local_offset"},
      {"remote out of range",
       {ferry::v1::WRITE, s, 0, "node-b", "guarded", (1 << 20) - 8, 16},
       absl::StatusCode::kOutOfRange,
       "ops[1].remote_offset"},
      {"offset overflow",
       {ferry::v1::WRITE, s, 0, "node-b", "guarded", ~0ull - 4, 16},
       absl::StatusCode::kOutOfRange,
       "ops[1].remote_offset"},
      {"unknown peer",
       {ferry::v1::WRITE, s, 0, "node-z", "guarded", 0, 16},
       absl::StatusCode::kNotFound,
       "ops[1].target: targets[1].peer"},
      {"unknown remote buffer",
       {ferry::v1::WRITE, s, 0, "node-b", "nope", 0, 16},
       absl::StatusCode::kNotFound,
       "ops[1].target: targets[1].remote_buffer"},
      {"zero length",
       {ferry::v1::WRITE, s, 0, "node-b", "guarded", 0, 0},
       absl::StatusCode::kInvalidArgument,
       "ops[1].length"},
      {"oversize",
       {ferry::v1::WRITE, s, 0, "node-b", "guarded", 0, 65ull << 20},
       absl::StatusCode::kInvalidArgument,
       "max_op_bytes"},
      {"no type",
       {ferry::v1::OP_TYPE_UNSPECIFIED, s, 0, "node-b", "guarded", 0, 16},
       absl::StatusCode::kInvalidArgument,
       "ops[1].type"},
  };
  for (const Case& c : cases) {
    auto id = A().Submit({good, c.bad});
    EXPECT_EQ(id.status().code(), c.code) << c.what << ": " << id.status();
    EXPECT_THAT(std::string(id.status().message()), HasSubstr(c.field)) << c.what;
  }
  auto empty = A().Submit({});
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::count((*dst)->data(), (*dst)->data() + (1 << 20), 0), 1 << 20)
      << "a refused batch wrote";
}

TEST_F(AgentIntegrationTest, BufferNamesAreUniqueAndFreedNamesAreGone) {
  auto one = B().Alloc(4096, "unique-name");
  ASSERT_TRUE(one.ok());
  auto two = B().Alloc(4096, "unique-name");
  EXPECT_EQ(two.status().code(), absl::StatusCode::kAlreadyExists);
  ASSERT_TRUE(B().Free((*one)->id()).ok());
  EXPECT_EQ(B().Free((*one)->id()).code(), absl::StatusCode::kNotFound);
  auto src = A().Alloc(4096);
  ASSERT_TRUE(src.ok());
  absl::Status s = A().Write(**src, 0, "node-b", "unique-name", 0, 4096);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_EQ(A().Alloc(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(A().Alloc(1ull << 40).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST_F(AgentIntegrationTest, WaitOnUnknownTransferIsNotFound) {
  EXPECT_EQ(A().Wait(123456789, absl::Seconds(1)).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(AgentIntegrationTest, FreeingATargetDuringTransfersNeverCorruptsOrCrashes) {
  auto src = A().Alloc(32 << 20);
  ASSERT_TRUE(src.ok());
  for (int round = 0; round < 3; ++round) {
    auto dst = B().Alloc(32 << 20, "vanishing");
    ASSERT_TRUE(dst.ok());
    std::vector<OpSpec> ops;
    for (int i = 0; i < 64; ++i)
      ops.push_back({ferry::v1::WRITE, (*src)->id(), 0, "node-b", "vanishing", 0, 32 << 20});
    auto id = A().Submit(ops);
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_TRUE(B().Free((*dst)->id()).ok());
    auto result = A().Wait(*id, absl::Seconds(60));
    ASSERT_TRUE(result.ok()) << result.status();
    // Either it all landed before the free, or the ops after it were refused cleanly.
    // Not PERMISSION_DENIED: the buffer was freed, and the message says which.
    if (result->state() == ferry::v1::FAILED) {
      EXPECT_EQ(result->code(), static_cast<int>(absl::StatusCode::kAborted)) << result->message();
      EXPECT_THAT(result->message(), HasSubstr("'vanishing' on node-b was freed"));
    }
  }
  auto info = B().GetInfo();
  ASSERT_TRUE(info.ok());
}

TEST(AgentFailureTest, PeerKilledMidTransferFailsUnavailableAndTheSurvivorServesOn) {
  Pair pair;
  ASSERT_TRUE(pair.Start().ok());
  auto src = pair.ca->Alloc(64 << 20);
  auto dst = pair.cb->Alloc(64 << 20, "doomed");
  ASSERT_TRUE(src.ok() && dst.ok());
  std::vector<OpSpec> ops;
  for (int i = 0; i < 128; ++i)
    ops.push_back({ferry::v1::WRITE, (*src)->id(), 0, "node-b", "doomed", 0, 64 << 20});
  absl::Time start = absl::Now();
  auto id = pair.ca->Submit(ops, absl::Seconds(30));
  ASSERT_TRUE(id.ok()) << id.status();
  pair.b->Kill();
  auto result = pair.ca->Wait(*id, absl::Seconds(40));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->state(), ferry::v1::FAILED);
  EXPECT_EQ(result->code(), static_cast<int>(absl::StatusCode::kUnavailable)) << result->message();
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "failed only at the deadline";

  // The survivor still serves, refuses the dead peer cleanly, and talks to it again once it
  // is back (a new incarnation: new keys, new endpoint).
  ASSERT_TRUE(pair.ca->GetInfo().ok());
  auto refused = pair.ca->Submit({{ferry::v1::WRITE, (*src)->id(), 0, "node-b", "doomed", 0, 16}});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  ASSERT_TRUE(pair.StartB().ok());
  auto fresh = pair.cb->Alloc(64 << 20, "doomed");
  ASSERT_TRUE(fresh.ok());
  Fill(**src, 9);
  absl::Status s = pair.ca->Write(**src, 0, "node-b", "doomed", 0, 64 << 20);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(0, std::memcmp((*src)->data(), (*fresh)->data(), 64 << 20));
}

TEST(AgentFailureTest, TransferToAStoppedPeerEndsAtItsDeadline) {
  Pair pair;
  ASSERT_TRUE(pair.Start().ok());
  auto src = pair.ca->Alloc(64 << 20);
  auto dst = pair.cb->Alloc(64 << 20, "frozen");
  ASSERT_TRUE(src.ok() && dst.ok());
  std::vector<OpSpec> ops;
  for (int i = 0; i < 64; ++i)
    ops.push_back({ferry::v1::WRITE, (*src)->id(), 0, "node-b", "frozen", 0, 64 << 20});
  auto id = pair.ca->Submit(ops, absl::Seconds(2));
  ASSERT_TRUE(id.ok()) << id.status();
  kill(pair.b->pid(), SIGSTOP);
  auto result = pair.ca->Wait(*id, absl::Seconds(10));
  kill(pair.b->pid(), SIGCONT);
  ASSERT_TRUE(result.ok()) << result.status();
  if (result->state() == ferry::v1::FAILED) {
    EXPECT_EQ(result->code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded))
        << result->message();
  }
  EXPECT_NE(result->state(), ferry::v1::RUNNING);
}

TEST(AgentConfigTest, BadConfigStopsTheAgentWithFileLineAndKey) {
  std::string dir = MakeTempDir();
  AgentSpec spec{"node-x", dir, 0, {}, "tcp:\n  connections: lots\n"};
  spec.security = "";  // the line number below counts the generated lines before extra_yaml
  auto agent = AgentProcess::Start(spec);
  ASSERT_FALSE(agent.ok());
  EXPECT_THAT(std::string(agent.status().message()),
              HasSubstr("node-x.yaml:6: key 'tcp.connections'"));
  std::system(("rm -rf " + dir).c_str());
}

TEST(AgentConfigTest, LocalSocketIsGroupOnlyAndTheTcpListenerIsOptIn) {
  std::string dir = MakeTempDir();
  auto port = PickFreePort();
  ASSERT_TRUE(port.ok());
  std::string local_tcp = absl::StrCat("127.0.0.1:", *port);
  AgentSpec spec{"node-l", dir, 0, {}, ""};
  spec.local_tcp = local_tcp;
  auto agent = AgentProcess::Start(spec);
  ASSERT_TRUE(agent.ok()) << agent.status();
  struct stat st = {};
  ASSERT_EQ(stat((*agent)->socket().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0660u);
  // Over TCP only with a certificate of the agent's CA (tests/peer_channel.h's DevPki).
  auto refused = Client::Connect(local_tcp, absl::Milliseconds(500));
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("FERRY_TLS_CA"));
  auto pki = DevPki::Open(dir);
  ASSERT_TRUE(pki.ok());
  auto mine = pki->Issue("ferryctl-user");
  ASSERT_TRUE(mine.ok());
  setenv("FERRY_TLS_CA", pki->ca().c_str(), 1);
  setenv("FERRY_TLS_CERT", mine->cert.c_str(), 1);
  setenv("FERRY_TLS_KEY", mine->key.c_str(), 1);
  setenv("FERRY_TLS_NODE", "node-l", 1);
  auto over_tcp = Client::Connect(local_tcp);
  ASSERT_TRUE(over_tcp.ok()) << over_tcp.status();
  auto info = (*over_tcp)->GetInfo();
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->node(), "node-l");
  (*agent)->Stop();
  // Without the opt-in nothing listens there.
  auto plain = AgentProcess::Start({"node-m", dir, 0, {}, ""});
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(Client::Connect(local_tcp, absl::Milliseconds(300)).ok());
  for (const char* var : {"FERRY_TLS_CA", "FERRY_TLS_CERT", "FERRY_TLS_KEY", "FERRY_TLS_NODE"}) {
    unsetenv(var);
  }
  std::system(("rm -rf " + dir).c_str());
}

TEST(AgentTopologyTest, AgentServesThePlanOfItsTopologyFileAndLogsEachGpu) {
  std::string dir = MakeTempDir();
  AgentSpec spec{"node-t", dir, 0, {},
                 absl::StrCat("topology: ", FERRY_FIXTURES, "/topology/dual_socket_sys.xml\n",
                              "policy:\n  gdr_max_path: SYS\n")};
  auto agent = AgentProcess::Start(spec);
  ASSERT_TRUE(agent.ok()) << agent.status();
  auto client = Client::Connect((*agent)->socket());
  ASSERT_TRUE(client.ok());
  ferry::v1::GetTopologyResponse topo;
  grpc::ClientContext ctx;
  ASSERT_TRUE((*client)->stub().GetTopology(&ctx, {}, &topo).ok());
  // The config's policy took effect: SYS is allowed, so the GPU goes GDR.
  EXPECT_THAT(topo.json(), HasSubstr("\"nic\":\"mlx5_0\""));
  EXPECT_THAT(topo.json(), HasSubstr("\"mode\":\"gdr\""));
  EXPECT_THAT(topo.text(), HasSubstr("GPU0"));
  (*agent)->Stop();
  std::ifstream log((*agent)->log_path());
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_THAT(text, HasSubstr("GPU 0000:3b:00.0 and mlx5_0 are SYS apart"));
  std::system(("rm -rf " + dir).c_str());
}

TEST(AgentTopologyTest, MissingTopologyFileStopsTheAgent) {
  std::string dir = MakeTempDir();
  AgentSpec spec{"node-t", dir, 0, {}, "topology: /nonexistent/topo.xml\n"};
  auto agent = AgentProcess::Start(spec);
  ASSERT_FALSE(agent.ok());
  EXPECT_THAT(std::string(agent.status().message()), HasSubstr("/nonexistent/topo.xml"));
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace ferry
