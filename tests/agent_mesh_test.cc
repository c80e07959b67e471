// A 32-agent full mesh on loopback: every agent writes to every other, then each agent's
// thread count must not have grown with its peers (event loops sized by cores, not one
// thread per connection), and its accounting returns to zero once its client leaves.

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/container/btree_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/agent_process.h"
#include "client/ferry_client.h"
#include "gtest/gtest.h"
#include "tests/accounting.h"
#include "tests/agent_pair.h"

namespace ferry {
namespace {

constexpr int kAgents = 32;
constexpr uint64_t kBlock = 64 << 10;

// The threads of process `pid` by name (/proc/<pid>/task/*/comm; names are cut to 15 bytes).
absl::btree_map<std::string, uint64_t> ThreadsByName(pid_t pid) {
  absl::btree_map<std::string, uint64_t> names;
  for (const auto& task :
       std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"))) {
    std::ifstream comm(task.path() / "comm");
    std::string name;
    std::getline(comm, name);
    ++names[name];
  }
  return names;
}

// gRPC's global timer pool ("grpc_global_timer"): it starts a thread whenever a timer fires
// and no other timer thread is waiting, and never lets one go until gRPC shuts down ("The
// number of timer threads is always increasing until all the threads are stopped",
// src/core/lib/iomgr/timer_manager.cc, run_some_timers). So how many it holds is how many
// timer callbacks once ran at the same time: 10 to 20 when 31 peers' TLS handshakes meet a
// loaded 2-core machine under ASan, and it does not drain. It is counted apart.
constexpr char kGrpcTimerThread[] = "grpc_global_tim";

// What an agent may hold besides those, whatever its peers: gRPC's own threads (executor and
// event engine pools, a few sync-server threads, the timer manager, the resolver), the tcp
// event loops, the listener, the reaper, the peer-health checker, the local socket's acceptor,
// the main thread. 26 to 29 were seen on 2 cores. A thread per peer would still show: 31 more.
uint64_t ThreadBound() { return 2 * std::thread::hardware_concurrency() + 32; }

TEST(AgentMeshTest, ThirtyTwoAgentsAllToAllKeepThreadsBoundedAndAccountingAtZero) {
  std::string dir = MakeTempDir();
  std::vector<uint16_t> ports;
  for (int i = 0; i < kAgents; ++i) {
    auto port = PickFreePort();
    ASSERT_TRUE(port.ok());
    ports.push_back(*port);
  }
  std::vector<std::unique_ptr<AgentProcess>> agents;
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < kAgents; ++i) {
    // Every peer connects from 127.0.0.1 here, so the per-address cap must hold them all.
    AgentSpec spec{absl::StrCat("n", i), dir, ports[i], {},
                   "host_pool:\n  size: 64MiB\nlog:\n  level: warn\n"
                   "limits:\n  tcp_max_connections_per_peer: 1024\n"};
    for (int j = 0; j < kAgents; ++j) {
      if (j != i) spec.peers[absl::StrCat("n", j)] = absl::StrCat("127.0.0.1:", ports[j]);
    }
    auto agent = AgentProcess::Start(spec);
    ASSERT_TRUE(agent.ok()) << agent.status();
    agents.push_back(std::move(*agent));
    auto client = Client::Connect(agents.back()->socket());
    ASSERT_TRUE(client.ok());
    clients.push_back(std::move(*client));
  }
  // Each agent's target has a block for every sender; each sender's source one block.
  std::vector<std::unique_ptr<Buffer>> targets, sources;
  for (int i = 0; i < kAgents; ++i) {
    auto target = clients[i]->Alloc(kAgents * kBlock, "mesh");
    auto source = clients[i]->Alloc(kBlock);
    ASSERT_TRUE(target.ok() && source.ok());
    std::memset((*source)->data(), 'a' + (i % 26), kBlock);
    targets.push_back(std::move(*target));
    sources.push_back(std::move(*source));
  }
  // All to all, every agent at once: one batch per sender with an op per peer.
  std::vector<std::thread> senders;
  std::vector<absl::Status> outcomes(kAgents);
  for (int i = 0; i < kAgents; ++i) {
    senders.emplace_back([&, i] {
      std::vector<OpSpec> ops;
      for (int j = 0; j < kAgents; ++j) {
        if (j == i) continue;
        ops.push_back({ferry::v1::WRITE, sources[i]->id(), 0, absl::StrCat("n", j), "mesh",
                       i * kBlock, kBlock});
      }
      auto result = clients[i]->Run(ops, absl::Seconds(120));
      outcomes[i] = result.ok() ? TransferStatus(*result) : result.status();
    });
  }
  for (auto& t : senders) t.join();
  for (int i = 0; i < kAgents; ++i)
    EXPECT_TRUE(outcomes[i].ok()) << "n" << i << ": " << outcomes[i];
  for (int j = 0; j < kAgents; ++j) {
    for (int i = 0; i < kAgents; ++i) {
      if (i == j) continue;
      ASSERT_EQ(targets[j]->data()[i * kBlock + kBlock - 1], 'a' + (i % 26))
          << "n" << i << " -> n" << j;
    }
  }
  uint64_t most = 0;
  for (int i = 0; i < kAgents; ++i) {
    const auto names = ThreadsByName(agents[i]->pid());
    uint64_t threads = 0;
    std::string listing;
    for (const auto& [name, count] : names) {
      if (name != kGrpcTimerThread) threads += count;
      absl::StrAppend(&listing, listing.empty() ? "" : ", ", name, " x", count);
    }
    most = std::max(most, threads);
    EXPECT_LT(threads, ThreadBound())
        << "n" << i << " holds " << threads << " threads besides gRPC's timer pool with "
        << kAgents - 1 << " peers: " << listing;
  }
  std::printf("mesh of %d: most threads in one agent besides gRPC's timer pool %llu (bound %llu)\n",
              kAgents, static_cast<unsigned long long>(most),
              static_cast<unsigned long long>(ThreadBound()));
  targets.clear();
  sources.clear();
  clients.clear();
  for (auto& agent : agents) ExpectAccountingAtZero(agent->socket(), agent->node());
  agents.clear();
  std::system(("rm -rf " + dir).c_str());
}

}  // namespace
}  // namespace ferry
