// Operating two real agents: /metrics scraped over HTTP during and after a transfer (values
// checked against the transfer), the peers view noticing a killed peer, the transfers and
// stats views, and JSON log lines with transfer ids.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/agent_process.h"
#include "client/ferry_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/agent_pair.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr uint64_t kMiB = 1 << 20;

// GET http://127.0.0.1:port/metrics, the body ("" when it cannot).
std::string Scrape(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, n);
    }
  }
  close(fd);
  size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The value of the sample `name{labels}` (labels exactly as the exposition prints them, in
// the exporter's order), or -1 when absent.
double Sample(const std::string& text, const std::string& name, const std::string& labels) {
  const std::string prefix = labels.empty() ? name + " " : absl::StrCat(name, "{", labels, "} ");
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, prefix)) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(prefix.size()), &v)) return v;
  }
  return -1;
}

class AgentOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto port = PickFreePort();
    ASSERT_TRUE(port.ok());
    metrics_port_ = *port;
    const std::string a = absl::StrCat("metrics:\n  listen: 127.0.0.1:", metrics_port_,
                                       "\nlog:\n  level: debug\n  format: json\n"
                                       "host_pool:\n  size: 1GiB\n");
    absl::Status s = pair_.Start(a, "host_pool:\n  size: 1GiB\n");
    ASSERT_TRUE(s.ok()) << s;
  }

  uint16_t metrics_port_ = 0;
  Pair pair_;
};

TEST_F(AgentOpsTest, MetricsShowTheBytesOfATransferByPeerNicAndMode) {
  constexpr uint64_t kOp = 32 * kMiB;
  constexpr int kOps = 8;
  auto target = pair_.cb->Alloc(kOp * kOps, "landing");
  ASSERT_TRUE(target.ok()) << target.status();
  auto src = pair_.ca->Alloc(kOp * kOps);
  ASSERT_TRUE(src.ok()) << src.status();
  Fill(**src, 3);
  std::vector<OpSpec> ops;
  for (int i = 0; i < kOps; ++i) {
    ops.push_back({ferry::v1::WRITE, (*src)->id(), i * kOp, "node-b", "landing", i * kOp, kOp});
  }
  auto id = pair_.ca->Submit(ops, absl::Seconds(60));
  ASSERT_TRUE(id.ok()) << id.status();
  // During the transfer the endpoint answers, with no more than the transfer's bytes.
  const std::string during = Scrape(metrics_port_);
  ASSERT_THAT(during, HasSubstr("ferry_build_info{"));
  const double nic_during = Sample(during, "ferry_nic_bytes_total", R"(nic="tcp",peer="node-b")");
  EXPECT_LE(nic_during, static_cast<double>(kOp * kOps));
  EXPECT_EQ(Sample(during, "ferry_transfers_active", ""), 1) << during;

  auto r = pair_.ca->Wait(*id, absl::Seconds(60));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->state(), ferry::v1::SUCCEEDED) << r->message();
  EXPECT_EQ(std::memcmp((*src)->data(), (*target)->data(), kOp * kOps), 0);

  const std::string after = Scrape(metrics_port_);
  const double total = static_cast<double>(kOp * kOps);
  EXPECT_EQ(Sample(after, "ferry_nic_bytes_total", R"(nic="tcp",peer="node-b")"), total) << after;
  EXPECT_EQ(Sample(after, "ferry_nic_ops_total", R"(nic="tcp",peer="node-b")"), kOps * 32.0)
      << after;
  EXPECT_EQ(Sample(after, "ferry_transfer_bytes_total",
                   R"(peer="node-b",direction="write",mode="host",provider="tcp")"),
            total);
  EXPECT_EQ(Sample(after, "ferry_transfer_ops_total",
                   R"(peer="node-b",direction="write",mode="host",provider="tcp")"),
            kOps);
  EXPECT_EQ(Sample(after, "ferry_transfers_total", R"(result="succeeded")"), 1);
  EXPECT_EQ(Sample(after, "ferry_transfers_active", ""), 0);
  // 32 MiB ops: all in the >16MiB class of the latency histogram.
  EXPECT_EQ(Sample(after, "ferry_op_duration_seconds_count", R"(size_class=">16MiB")"), kOps);
  EXPECT_EQ(Sample(after, "ferry_op_duration_seconds_bucket", R"(size_class=">16MiB",le="+Inf")"),
            kOps);
  EXPECT_GE(Sample(after, "ferry_host_pool_used_bytes", ""), total);
  EXPECT_EQ(Sample(after, "ferry_nic_up", R"(nic="tcp")"), 1);
  EXPECT_EQ(Sample(after, "ferry_registrations", R"(nic="tcp")"), 1);  // the source buffer
  EXPECT_THAT(after, HasSubstr("ferry_peer_up{peer=\"node-b\"}"));
  EXPECT_THAT(after, HasSubstr("# TYPE ferry_transfer_bytes_total counter"));

  // The same numbers through the Agent API (`ferryctl stats`, `transfers`).
  ferry::v1::GetStatsResponse stats;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(pair_.ca->stub().GetStats(&ctx, {}, &stats).ok());
  }
  ASSERT_EQ(stats.rows_size(), 1);
  EXPECT_EQ(stats.rows(0).bytes(), kOp * kOps);
  EXPECT_EQ(stats.rows(0).mode(), "host");
  EXPECT_EQ(stats.transfers_succeeded(), 1u);
  ferry::v1::ListTransfersResponse transfers;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(pair_.ca->stub().ListTransfers(&ctx, {}, &transfers).ok());
  }
  EXPECT_EQ(transfers.running_size(), 0);
  ASSERT_EQ(transfers.recent_size(), 1);
  EXPECT_EQ(transfers.recent(0).transfer_id(), *id);
  EXPECT_EQ(transfers.recent(0).state(), ferry::v1::SUCCEEDED);
  EXPECT_EQ(transfers.recent(0).bytes_done(), kOp * kOps);
  EXPECT_EQ(transfers.recent(0).modes(0), "host");
  EXPECT_EQ(transfers.recent(0).rails(0), "tcp");
  EXPECT_EQ(transfers.recent(0).peers(0), "node-b");

  // JSON log lines, the transfer's plan and outcome among them, each naming its id.
  std::ifstream log(pair_.a->log_path());
  std::string line;
  int lines = 0, submitted = 0, outcome = 0;
  const std::string tag = absl::StrCat("transfer ", *id, ": ");
  while (std::getline(log, line)) {
    if (line.empty() || line[0] != '{') continue;  // the launcher's own lines
    ++lines;
    EXPECT_THAT(line, StartsWith(R"({"time":")"));
    EXPECT_THAT(line, HasSubstr(R"("node":"node-a","level":")"));
    EXPECT_EQ(line.back(), '}');
    submitted += line.find(tag + "submitted, 8 ops to node-b") != std::string::npos;
    outcome += line.find(tag + "succeeded") != std::string::npos;
  }
  EXPECT_GT(lines, 5);
  EXPECT_EQ(submitted, 1);
  EXPECT_EQ(outcome, 1);
}

TEST_F(AgentOpsTest, PeersShowsAKilledPeerUnreachableWithinSeconds) {
  auto list = [&] {
    ferry::v1::ListPeersResponse peers;
    grpc::ClientContext ctx;
    EXPECT_TRUE(pair_.ca->stub().ListPeers(&ctx, {}, &peers).ok());
    return peers;
  };
  // Healthy first (checks run every second).
  absl::Time give_up = absl::Now() + absl::Seconds(10);
  ferry::v1::ListPeersResponse peers;
  do {
    peers = list();
  } while ((peers.peers_size() != 1 || peers.peers(0).health() != "ok") &&
           absl::Now() < give_up && (absl::SleepFor(absl::Milliseconds(100)), true));
  ASSERT_EQ(peers.peers_size(), 1);
  EXPECT_EQ(peers.peers(0).node(), "node-b");
  EXPECT_EQ(peers.peers(0).health(), "ok");
  EXPECT_GT(peers.peers(0).rtt_us(), 0u);
  EXPECT_NE(peers.peers(0).incarnation(), 0u);
  EXPECT_EQ(peers.peers(0).source(), "config");

  pair_.b->Kill();
  const absl::Time killed = absl::Now();
  do {
    peers = list();
  } while (peers.peers(0).health() != "unreachable" && absl::Now() < killed + absl::Seconds(10) &&
           (absl::SleepFor(absl::Milliseconds(100)), true));
  const absl::Duration noticed = absl::Now() - killed;
  EXPECT_EQ(peers.peers(0).health(), "unreachable");
  EXPECT_LT(noticed, absl::Seconds(4));
  EXPECT_THAT(peers.peers(0).last_error(), HasSubstr("Health"));
  EXPECT_GE(peers.peers(0).last_ok_ms_ago(), 0);
  std::printf("a killed peer was shown unreachable after %.2f s\n",
              absl::ToDoubleSeconds(noticed));
  pair_.b.reset();  // nothing to check on a killed agent
}

}  // namespace
}  // namespace ferry
