// Discovery on a real etcd, and peers added at run time, with real agents on loopback:
// three agents find each other through etcd and write to each other, a fourth joins and is
// reachable without restarts, a killed one disappears when its lease lapses and a stopped one
// at once (it revokes its lease); the config file's peers stay whatever etcd says; AddPeer /
// RemovePeer (and `ferryctl peers add/remove`) add and drop a peer, across SIGHUP reloads,
// and refuse bad input naming the field.

#include <signal.h>
#include <stdio.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/agent_process.h"
#include "client/ferry_client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/peers/discovery.h"
#include "tests/agent_pair.h"
#include "tests/etcd_process.h"
#include "tests/text_file.h"

namespace ferry {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;

constexpr uint64_t kBlock = 64 << 10;
constexpr absl::Duration kLeaseTtl = absl::Seconds(2);
constexpr const char* kPrefix = "/ferry-test/nodes/";

std::set<std::string> PeersOf(Client& c) {
  auto info = c.GetInfo();
  if (!info.ok()) return {"<GetInfo failed: " + std::string(info.status().message()) + ">"};
  return {info->peers().begin(), info->peers().end()};
}

// Polls until `c`'s peers include every one of `present` and none of `absent`; how long that
// took, or a failure naming what it saw.
absl::StatusOr<absl::Duration> AwaitPeers(Client& c, const std::set<std::string>& present,
                                          const std::set<std::string>& absent,
                                          absl::Duration timeout = absl::Seconds(10)) {
  const absl::Time start = absl::Now();
  std::set<std::string> seen;
  while (absl::Now() - start < timeout) {
    seen = PeersOf(c);
    bool ok = true;
    for (const auto& p : present) ok &= seen.contains(p);
    for (const auto& p : absent) ok &= !seen.contains(p);
    if (ok) return absl::Now() - start;
    absl::SleepFor(absl::Milliseconds(25));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "wanted [", absl::StrJoin(present, ","), "] and not [", absl::StrJoin(absent, ","),
      "], saw [", absl::StrJoin(seen, ","), "]"));
}

// `ferryctl --socket SOCKET args...`: exit code and what it printed (stdout and stderr).
int Ferryctl(const std::string& socket, const std::string& args, std::string* output) {
  const std::string command =
      absl::StrCat(FERRY_FERRYCTL, " --socket ", socket, " ", args, " 2>&1");
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return -1;
  output->clear();
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof(chunk), p)) > 0) output->append(chunk, n);
  const int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(NodeRecordTest, RoundTripsAndRefusesMalformedRecordsNamingTheField) {
  server::NodeRecord record{"node-a", "10.0.0.1:7100", {"verbs", "tcp"}, 0xfedcba9876543211};
  const std::string text = server::EncodeNodeRecord(record);
  EXPECT_EQ(text,
            R"({"node":"node-a","address":"10.0.0.1:7100","providers":["verbs","tcp"],)"
            R"("incarnation":"fedcba9876543211"})");
  auto back = server::DecodeNodeRecord(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->node, record.node);
  EXPECT_EQ(back->address, record.address);
  EXPECT_EQ(back->providers, record.providers);
  EXPECT_EQ(back->incarnation, record.incarnation);  // all 64 bits: not a JSON number
  EXPECT_THAT(std::string(server::DecodeNodeRecord("nonsense").status().message()),
              HasSubstr("not a JSON object"));
  EXPECT_THAT(std::string(server::DecodeNodeRecord(R"({"address":"h:1","incarnation":"1"})")
                              .status()
                              .message()),
              HasSubstr("node: "));
  EXPECT_THAT(
      std::string(server::DecodeNodeRecord(R"({"node":"n","address":"h","incarnation":"1"})")
                      .status()
                      .message()),
      HasSubstr("address: 'h' is not host:port"));
  EXPECT_THAT(std::string(server::DecodeNodeRecord(R"({"node":"n","address":"h:1"})")
                              .status()
                              .message()),
              HasSubstr("incarnation: "));
}

TEST(EtcdClientTest, PrefixEndIsTheFirstKeyAfterThePrefix) {
  EXPECT_EQ(server::EtcdClient::PrefixEnd("/ferry/nodes/"), "/ferry/nodes0");
  EXPECT_EQ(server::EtcdClient::PrefixEnd("a\xff"), "b");
  EXPECT_EQ(server::EtcdClient::PrefixEnd("\xff\xff"), std::string(1, '\0'));
}

TEST(EtcdClientTest, NoEtcdIsUnavailableNamingTheEndpoint) {
  auto port = PickFreePort();  // nobody listens there
  ASSERT_TRUE(port.ok());
  const std::string endpoint = absl::StrCat("127.0.0.1:", *port);
  server::EtcdClient etcd({endpoint}, absl::Seconds(1));
  auto lease = etcd.Grant(absl::Seconds(5));
  EXPECT_EQ(lease.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(lease.status().message()), HasSubstr(endpoint));
}

class DiscoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (EtcdProcess::Binary().empty()) {
      GTEST_SKIP() << "no etcd binary at "
                   << (std::getenv("FERRY_ETCD") ? std::getenv("FERRY_ETCD") : "/usr/bin/etcd")
                   << " (Debian: apt-get install etcd-server; scripts/install-deps)";
    }
    dir_ = MakeTempDir();
    auto etcd = EtcdProcess::Start(dir_);
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = std::move(*etcd);
  }

  void TearDown() override {
    clients_.clear();
    // An agent's own words (a sanitizer's report among them) are the clue to a failure.
    for (const auto& [node, agent] : agents_) {
      if (HasFailure()) PrintLogTail(node, agent->log_path(), 12000);
    }
    agents_.clear();
    etcd_.reset();
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }

  // `dead_first`: an endpoint where no etcd answers, listed before the real one (failover).
  std::string DiscoveryYaml(absl::Duration ttl = kLeaseTtl, bool dead_first = false) const {
    std::string endpoints = etcd_->endpoint();
    if (dead_first) {
      auto port = PickFreePort();
      endpoints = absl::StrCat("127.0.0.1:", port.ok() ? *port : 1, ", ", endpoints);
    }
    return absl::StrCat("discovery:\n  etcd: [", endpoints, "]\n  prefix: ", kPrefix,
                        "\n  lease_ttl: ", absl::FormatDuration(ttl), "\n");
  }

  // Starts `node` (with discovery unless `yaml` says otherwise) and a client on it.
  AgentProcess* StartAgent(const std::string& node, const std::string& yaml,
                           std::map<std::string, std::string> peers = {}, uint16_t port = 0) {
    AgentSpec spec{node, dir_, port, std::move(peers),
                   absl::StrCat("host_pool:\n  size: 64MiB\n", yaml)};
    auto agent = AgentProcess::Start(spec);
    EXPECT_TRUE(agent.ok()) << agent.status();
    if (!agent.ok()) return nullptr;
    auto client = Client::Connect((*agent)->socket());
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return nullptr;
    clients_[node] = std::move(*client);
    agents_[node] = std::move(*agent);
    return agents_[node].get();
  }

  Client& client(const std::string& node) { return *clients_.at(node); }

  // Writes a block with `from`'s pattern into `to`'s "disc" buffer at `slot`.
  absl::Status WriteBlock(const std::string& from, const std::string& to, int slot) {
    auto source = client(from).Alloc(kBlock);
    if (!source.ok()) return source.status();
    std::memset((*source)->data(), from.back(), kBlock);
    return client(from).Write(**source, 0, to, "disc", slot * kBlock, kBlock);
  }

  std::string dir_;
  std::unique_ptr<EtcdProcess> etcd_;
  std::map<std::string, std::unique_ptr<AgentProcess>> agents_;
  std::map<std::string, std::unique_ptr<Client>> clients_;
};

TEST_F(DiscoveryTest, AgentsFindEachOtherJoinLeaveAndKeepStaticPeers) {
  const absl::Time test_start = absl::Now();
  // node-s is known to node-a only from its config file; it never registers.
  AgentProcess* s = StartAgent("node-s", "");
  ASSERT_NE(s, nullptr);
  auto port_c = PickFreePort();
  ASSERT_TRUE(port_c.ok());
  const std::string address_c = absl::StrCat("127.0.0.1:", *port_c);
  // node-a also names node-c in its file: etcd's word about node-c must not remove it there.
  ASSERT_NE(StartAgent("node-a", DiscoveryYaml(),
                       {{"node-s", s->peer_address()}, {"node-c", address_c}}),
            nullptr);
  // node-b's first etcd endpoint is dead: it must fail over to the second.
  ASSERT_NE(StartAgent("node-b", DiscoveryYaml(kLeaseTtl, /*dead_first=*/true)), nullptr);
  ASSERT_NE(StartAgent("node-c", DiscoveryYaml(), {}, *port_c), nullptr);
  const std::vector<std::string> three = {"node-a", "node-b", "node-c"};
  absl::Duration slowest;
  for (const auto& node : three) {
    std::set<std::string> others;
    for (const auto& other : three) {
      if (other != node) others.insert(other);
    }
    auto took = AwaitPeers(client(node), others, {});
    ASSERT_TRUE(took.ok()) << node << ": " << took.status();
    slowest = std::max(slowest, *took);
  }
  std::printf("three agents: each a peer of the others %s after the third started\n",
              absl::FormatDuration(slowest).c_str());

  // Each writes to each other.
  std::map<std::string, std::unique_ptr<Buffer>> targets;
  for (const auto& node : three) {
    auto target = client(node).Alloc(4 * kBlock, "disc");
    ASSERT_TRUE(target.ok()) << target.status();
    targets[node] = std::move(*target);
  }
  for (size_t i = 0; i < three.size(); ++i) {
    for (const auto& to : three) {
      if (to == three[i]) continue;
      absl::Status written = WriteBlock(three[i], to, static_cast<int>(i));
      ASSERT_TRUE(written.ok()) << three[i] << " -> " << to << ": " << written;
    }
  }
  for (size_t i = 0; i < three.size(); ++i) {
    for (const auto& to : three) {
      if (to == three[i]) continue;
      EXPECT_EQ(targets[to]->data()[i * kBlock + kBlock - 1], three[i].back())
          << three[i] << " -> " << to;
    }
  }

  // What they registered: the node, its peer address, providers and incarnation.
  server::EtcdClient etcd({etcd_->endpoint()});
  auto range = etcd.RangePrefix(kPrefix);
  ASSERT_TRUE(range.ok()) << range.status();
  ASSERT_EQ(range->kvs.size(), 3u);
  for (const auto& kv : range->kvs) {
    auto record = server::DecodeNodeRecord(kv.value);
    ASSERT_TRUE(record.ok()) << record.status() << ": " << kv.value;
    EXPECT_EQ(kv.key, kPrefix + record->node);
    EXPECT_EQ(record->address, agents_.at(record->node)->peer_address());
    EXPECT_THAT(record->providers, Contains("tcp"));
    EXPECT_NE(record->incarnation, 0u);
    EXPECT_NE(kv.lease, 0);
  }

  // A fourth joins (with a long lease: its graceful stop below must not wait for it) and is
  // reachable from, and reaches, the others without restarts.
  ASSERT_NE(StartAgent("node-d", DiscoveryYaml(absl::Seconds(30))), nullptr);
  for (const auto& node : three) {
    auto took = AwaitPeers(client(node), {"node-d"}, {});
    ASSERT_TRUE(took.ok()) << node << ": " << took.status();
  }
  ASSERT_TRUE(AwaitPeers(client("node-d"), {"node-a", "node-b", "node-c"}, {}).ok());
  auto d_target = client("node-d").Alloc(4 * kBlock, "disc");
  ASSERT_TRUE(d_target.ok());
  ASSERT_TRUE(WriteBlock("node-a", "node-d", 0).ok());
  ASSERT_TRUE(WriteBlock("node-d", "node-b", 3).ok());
  EXPECT_EQ((*d_target)->data()[kBlock - 1], 'a');
  EXPECT_EQ(targets["node-b"]->data()[4 * kBlock - 1], 'd');

  // node-c dies: its lease lapses and the others drop it, except node-a, whose file names it.
  agents_.at("node-c")->Kill();
  clients_.erase("node-c");
  const absl::Time killed = absl::Now();
  for (const auto& node : {"node-b", "node-d"}) {
    auto took = AwaitPeers(client(node), {}, {"node-c"}, kLeaseTtl + absl::Seconds(4));
    ASSERT_TRUE(took.ok()) << node << ": " << took.status();
  }
  const absl::Duration gone = absl::Now() - killed;
  std::printf("a SIGKILLed agent left its peers %s after it died (lease %s)\n",
              absl::FormatDuration(gone).c_str(), absl::FormatDuration(kLeaseTtl).c_str());
  EXPECT_LE(gone, kLeaseTtl + absl::Seconds(4));
  EXPECT_THAT(PeersOf(client("node-a")), Contains("node-c"));
  EXPECT_THAT(PeersOf(client("node-a")), Contains("node-s"));
  auto s_target = client("node-s").Alloc(kBlock, "disc");
  ASSERT_TRUE(s_target.ok());
  ASSERT_TRUE(WriteBlock("node-a", "node-s", 0).ok());  // the static peer still works
  EXPECT_EQ((*s_target)->data()[0], 'a');

  // node-d stops cleanly: it revokes its lease, so the others drop it long before its 30 s TTL.
  d_target->reset();
  clients_.erase("node-d");
  const absl::Time stopping = absl::Now();
  EXPECT_EQ(agents_.at("node-d")->Stop(), 0);
  for (const auto& node : {"node-a", "node-b"}) {
    auto took = AwaitPeers(client(node), {}, {"node-d"}, absl::Seconds(5));
    ASSERT_TRUE(took.ok()) << node << ": " << took.status();
  }
  std::printf("a stopped agent left its peers %s after SIGTERM (lease 30s)\n",
              absl::FormatDuration(absl::Now() - stopping).c_str());
  std::printf("test body took %s\n", absl::FormatDuration(absl::Now() - test_start).c_str());
  targets.clear();
  s_target->reset();
}

TEST_F(DiscoveryTest, PeersAddedAtRunTimeWorkSurviveReloadsAndRefuseBadInput) {
  AgentProcess* s = StartAgent("node-s", "");
  ASSERT_NE(s, nullptr);
  AgentProcess* a = StartAgent("node-a", DiscoveryYaml());
  AgentProcess* b = StartAgent("node-b", DiscoveryYaml());
  ASSERT_TRUE(a != nullptr && b != nullptr);
  ASSERT_TRUE(AwaitPeers(client("node-b"), {"node-a"}, {}).ok());
  auto s_target = client("node-s").Alloc(kBlock, "disc");
  ASSERT_TRUE(s_target.ok());
  EXPECT_FALSE(WriteBlock("node-b", "node-s", 0).ok());  // not a peer yet

  std::string out;
  ASSERT_EQ(Ferryctl(b->socket(), absl::StrCat("peers add node-s ", s->peer_address()), &out), 0)
      << out;
  EXPECT_THAT(out, HasSubstr(absl::StrCat("peer node-s added at ", s->peer_address())));
  ASSERT_TRUE(WriteBlock("node-b", "node-s", 0).ok());
  EXPECT_EQ((*s_target)->data()[0], 'b');

  // A reload that adds a peer to the file keeps the run-time and etcd peers; one that takes it
  // out again removes only that one.
  std::string original;
  {
    std::ifstream in(b->config_path());
    std::stringstream text;
    text << in.rdbuf();
    original = text.str();
  }
  {
    std::ofstream outf(b->config_path());
    outf << original << "peers:\n  node-x: 127.0.0.1:1\n";
  }
  kill(b->pid(), SIGHUP);
  ASSERT_TRUE(AwaitPeers(client("node-b"), {"node-x", "node-s", "node-a"}, {}).ok());
  {
    std::ofstream outf(b->config_path());
    outf << original;
  }
  kill(b->pid(), SIGHUP);
  ASSERT_TRUE(AwaitPeers(client("node-b"), {"node-s", "node-a"}, {"node-x"}).ok());
  ASSERT_TRUE(WriteBlock("node-b", "node-s", 0).ok());

  // Bad input is refused with the field named.
  auto add = [&](const std::string& node, const std::string& address) {
    ferry::v1::AddPeerRequest req;
    req.set_node(node);
    req.set_address(address);
    ferry::v1::PeerChange resp;
    grpc::ClientContext ctx;
    return client("node-b").stub().AddPeer(&ctx, req, &resp);
  };
  auto remove = [&](const std::string& node) {
    ferry::v1::RemovePeerRequest req;
    req.set_node(node);
    ferry::v1::PeerChange resp;
    grpc::ClientContext ctx;
    return client("node-b").stub().RemovePeer(&ctx, req, &resp);
  };
  grpc::Status refused = add("", "127.0.0.1:7000");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("node: "));
  refused = add("node y", "127.0.0.1:7000");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("node: 'node y'"));
  refused = add("node-y", "nowhere");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("address: 'nowhere' is not host:port"));
  refused = add("node-y", "127.0.0.1:0");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("address: "));
  refused = add("node-b", "127.0.0.1:7000");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(), HasSubstr("node: 'node-b' is this agent"));
  refused = remove("node-zz");
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(refused.error_message(), HasSubstr("node: no peer named 'node-zz'"));
  refused = remove("node-a");  // found in etcd, not added at run time
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(), HasSubstr("found in etcd"));
  EXPECT_THAT(PeersOf(client("node-b")), Contains("node-a"));
  ASSERT_EQ(Ferryctl(b->socket(), "peers add node-y nowhere", &out), 1) << out;
  EXPECT_THAT(out, HasSubstr("INVALID_ARGUMENT: address: 'nowhere' is not host:port"));
  ASSERT_EQ(Ferryctl(b->socket(), "peers add node-y", &out), 2) << out;

  ASSERT_EQ(Ferryctl(b->socket(), "peers remove node-s", &out), 0) << out;
  EXPECT_THAT(out, HasSubstr("peer node-s removed"));
  EXPECT_FALSE(PeersOf(client("node-b")).contains("node-s"));
  absl::Status gone = WriteBlock("node-b", "node-s", 0);
  EXPECT_FALSE(gone.ok());
  EXPECT_THAT(std::string(gone.message()), HasSubstr("node-s"));
  s_target->reset();
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

// Issue 44 row 13: an agent's own key deleted, or overwritten by a rogue record, is put
// back within a lease TTL (it used to stay gone until the agent restarted).
TEST_F(DiscoveryTest, AnAgentPutsItsOwnKeyBackWhenItIsDeletedOrOverwritten) {
  ASSERT_NE(StartAgent("node-a", DiscoveryYaml()), nullptr);
  server::EtcdClient etcd({etcd_->endpoint()});
  const std::string key = std::string(kPrefix) + "node-a";
  // node-a's record as etcd holds it now (nullopt: none).
  auto record = [&]() -> std::optional<server::NodeRecord> {
    auto range = etcd.RangePrefix(kPrefix);
    if (!range.ok()) return std::nullopt;
    for (const auto& kv : range->kvs) {
      if (kv.key != key) continue;
      auto decoded = server::DecodeNodeRecord(kv.value);
      if (decoded.ok()) return *decoded;
    }
    return std::nullopt;
  };
  // Until `want` holds, at most a lease TTL and a second more; how long it took.
  auto await = [&](const std::function<bool()>& want) -> std::optional<absl::Duration> {
    const absl::Time start = absl::Now();
    while (absl::Now() - start < kLeaseTtl + absl::Seconds(1)) {
      if (want()) return absl::Now() - start;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return std::nullopt;
  };
  ASSERT_TRUE(await([&] { return record().has_value(); })) << "node-a never registered";
  const server::NodeRecord original = *record();

  ASSERT_TRUE(etcd.Delete(key).ok());
  auto back = await([&] {
    auto now = record();
    return now && now->incarnation == original.incarnation;
  });
  ASSERT_TRUE(back) << "the deleted key was not put back";
  std::printf("a deleted own key was back after %s (lease %s)\n",
              absl::FormatDuration(*back).c_str(), absl::FormatDuration(kLeaseTtl).c_str());

  server::NodeRecord rogue = original;
  rogue.address = "127.0.0.1:1";
  rogue.incarnation = original.incarnation + 1;
  ASSERT_TRUE(etcd.Put(key, server::EncodeNodeRecord(rogue), 0).ok());
  auto restored = await([&] {
    auto now = record();
    return now && now->address == original.address && now->incarnation == original.incarnation;
  });
  ASSERT_TRUE(restored) << "the overwritten key was not put back";
  std::printf("an overwritten own key was back after %s\n",
              absl::FormatDuration(*restored).c_str());
  EXPECT_THAT(ReadFile(agents_.at("node-a")->log_path()), HasSubstr("put it back"));
}

}  // namespace
}  // namespace ferry
