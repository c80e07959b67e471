#pragma once
// Two real agents that know each other, with a client on each, for the integration suites.
// Tearing a pair down checks the accounting invariant on both agents (tests/accounting.h).

#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "absl/strings/str_format.h"
#include "client/agent_process.h"
#include "client/ferry_client.h"
#include "gtest/gtest.h"
#include "tests/accounting.h"

namespace ferry {

inline std::string MakeTempDir() {
  char tmpl[] = "/tmp/ferry-test-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  return tmpl;
}

inline void Fill(Buffer& b, uint32_t seed) {
  std::mt19937 rng(seed);
  for (uint64_t i = 0; i < b.size(); ++i) b.data()[i] = static_cast<char>(rng());
}

// Two agents that know each other.
struct Pair {
  std::string dir;
  std::unique_ptr<AgentProcess> a, b;
  std::unique_ptr<Client> ca, cb;
  uint16_t port_a = 0, port_b = 0;
  uint64_t b_open_files = 0;  // node-b's RLIMIT_NOFILE (0: inherited)

  // `extra_b`: node-b's own YAML, when it differs from node-a's.
  absl::Status Start(const std::string& extra_yaml = "",
                     const std::optional<std::string>& extra_b = std::nullopt) {
    dir = MakeTempDir();
    auto pa = PickFreePort();
    auto pb = PickFreePort();
    if (!pa.ok() || !pb.ok()) return absl::InternalError("no free port");
    port_a = *pa;
    port_b = *pb;
    auto sa = AgentProcess::Start(SpecA(extra_yaml));
    if (!sa.ok()) return sa.status();
    a = std::move(*sa);
    absl::Status s = StartB(extra_b.value_or(extra_yaml));
    if (!s.ok()) return s;
    auto c = Client::Connect(a->socket());
    if (!c.ok()) return c.status();
    ca = std::move(*c);
    return absl::OkStatus();
  }
  AgentSpec SpecA(const std::string& extra) const {
    return {"node-a", dir, port_a, {{"node-b", absl::StrFormat("127.0.0.1:%d", port_b)}}, extra};
  }
  absl::Status StartB(const std::string& extra = "") {
    AgentSpec spec{
        "node-b", dir, port_b, {{"node-a", absl::StrFormat("127.0.0.1:%d", port_a)}}, extra};
    spec.open_files = b_open_files;
    auto sb = AgentProcess::Start(spec);
    if (!sb.ok()) return sb.status();
    b = std::move(*sb);
    auto c = Client::Connect(b->socket());
    if (!c.ok()) return c.status();
    cb = std::move(*c);
    return absl::OkStatus();
  }
  ~Pair() {
    ca.reset();
    cb.reset();
    for (auto* agent : {a.get(), b.get()}) {
      if (agent && agent->running()) ExpectAccountingAtZero(agent->socket(), agent->node());
    }
    if (a) a->Stop();
    if (b) b->Stop();
    if (!dir.empty()) std::system(("rm -rf " + dir).c_str());
  }
};

// What `client`'s agent says of peer `node` (ListPeers), e.g. kept_answers: node's answers
// this agent keeps; answers_held: how many of this agent's names node keeps.
inline ferry::v1::PeerInfo PeerOf(Client& client, const std::string& node) {
  ferry::v1::ListPeersResponse peers;
  grpc::ClientContext ctx;
  EXPECT_TRUE(client.stub().ListPeers(&ctx, {}, &peers).ok());
  for (const auto& p : peers.peers()) {
    if (p.node() == node) return p;
  }
  ADD_FAILURE() << "no peer " << node;
  return {};
}

// A suite whose tests share one Pair, started once with `Suite::kYaml` (both agents' extra
// YAML): `class MyTest : public SharedPairTest<MyTest> { static constexpr char kYaml[] = ...`.
template <typename Suite>
class SharedPairTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pair_ = new Pair();
    absl::Status s = pair_->Start(Suite::kYaml);
    ASSERT_TRUE(s.ok()) << s;
  }
  static void TearDownTestSuite() {
    delete pair_;  // checks both agents' accounting
    pair_ = nullptr;
  }
  Client& A() { return *pair_->ca; }
  Client& B() { return *pair_->cb; }

  static inline Pair* pair_ = nullptr;
};

}  // namespace ferry
