// Graceful drain with real agents (server/agent/drain.h): SIGTERM while a slow staged transfer runs
// (node-a's simulated GPU copies at a few MiB/s, so the transfer is still moving when the
// signal lands). The running transfer finishes with verified bytes, or, past
// limits.shutdown_grace_ms, ends UNAVAILABLE; new work is refused "draining"; the Peer API's
// gRPC health (grpc.health.v1, what a Kubernetes probe asks) goes NOT_SERVING; the agent
// exits 0 and leaves no socket behind.

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/agent_process.h"
#include "client/ferry_client.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "health.grpc.pb.h"  // grpc.health.v1, from Debian's grpc-proto
#include "gtest/gtest.h"
#include "tests/peer_channel.h"
#include "tests/accounting.h"
#include "tests/text_file.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;
using HealthStatus = grpc::health::v1::HealthCheckResponse;

constexpr uint64_t kMiB = 1 << 20;

void Fill(Buffer& b, uint32_t seed) {
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i + 8 <= b.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(b.data() + i, &v, 8);
  }
}

// grpc.health.v1.Health/Check for the whole server (service "") on the Peer API of
// `server_node` at `address`, as a monitor holding a certificate of the pair's CA asks it.
absl::StatusOr<HealthStatus::ServingStatus> CheckHealth(const std::string& dir,
                                                        const std::string& address,
                                                        const std::string& server_node) {
  auto stub =
      grpc::health::v1::Health::NewStub(PeerChannelAs(dir, address, server_node, "monitor"));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest req;
  HealthStatus resp;
  grpc::Status s = stub->Check(&ctx, req, &resp);
  if (!s.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
  }
  return resp.status();
}

class AgentDrainTest : public ::testing::Test {
 protected:
  // node-a stages out of a simulated GPU copying at `copy_rate` per second (its GPU is SYS
  // away from the NIC in the fixture); node-b takes the bytes into host memory.
  void StartPair(const std::string& copy_rate, const std::string& extra_a = "") {
    char tmpl[] = "/tmp/ferry-drain-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto pa = PickFreePort(), pb = PickFreePort();
    ASSERT_TRUE(pa.ok() && pb.ok());
    auto a = AgentProcess::Start(
        {"node-a", dir_, *pa, {{"node-b", absl::StrCat("127.0.0.1:", *pb)}},
         absl::StrCat("topology: ", FERRY_FIXTURES, "/topology/dual_socket_sys.xml\n",
                      "gpu:\n  backend: sim\n  count: 1\n  pool_size: 128MiB\n",
                      "  sim_copy_rate: ", copy_rate, "\n",
                      "policy:\n  staging_chunk: 1MiB\n  staging_depth: 4\n", extra_a)});
    ASSERT_TRUE(a.ok()) << a.status();
    a_ = std::move(*a);
    auto b = AgentProcess::Start(
        {"node-b", dir_, *pb, {{"node-a", absl::StrCat("127.0.0.1:", *pa)}}, ""});
    ASSERT_TRUE(b.ok()) << b.status();
    b_ = std::move(*b);
    auto ca = Client::Connect(a_->socket());
    auto cb = Client::Connect(b_->socket());
    ASSERT_TRUE(ca.ok() && cb.ok());
    ca_ = std::move(*ca);
    cb_ = std::move(*cb);
  }

  void TearDown() override {
    src_.reset();
    dst_.reset();
    ca_.reset();
    cb_.reset();
    if (b_ && b_->running()) ExpectAccountingAtZero(b_->socket(), b_->node());
    for (const auto* agent : {a_.get(), b_.get()}) {
      if (HasFailure() && agent != nullptr) PrintLogTail(agent->node(), agent->log_path());
    }
    if (a_) a_->Stop();
    if (b_) b_->Stop();
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }

  // Submits `size` bytes from a fresh GPU buffer on node-a to "drain-dst" on node-b and
  // checks that it is still running a moment later.
  uint64_t SubmitSlowTransfer(uint64_t size) {
    auto src = ca_->Alloc(size, "", "cuda:0");
    auto dst = cb_->Alloc(size, "drain-dst");
    EXPECT_TRUE(src.ok() && dst.ok());
    if (!src.ok() || !dst.ok()) return 0;
    src_ = std::move(*src);
    dst_ = std::move(*dst);
    Fill(*src_, 7);
    std::memset(dst_->data(), 0, size);
    auto id = ca_->Submit({{ferry::v1::WRITE, src_->id(), 0, "node-b", "drain-dst", 0, size}},
                          absl::Seconds(120));
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return 0;
    auto running = ca_->Wait(*id, absl::Milliseconds(300));
    EXPECT_EQ(running.status().code(), absl::StatusCode::kDeadlineExceeded)
        << "the transfer ended before the signal; slow the simulated copy down";
    return *id;
  }

  std::string dir_;
  std::unique_ptr<AgentProcess> a_, b_;
  std::unique_ptr<Client> ca_, cb_;
  std::unique_ptr<Buffer> src_, dst_;
};

TEST_F(AgentDrainTest, SigtermFinishesTheRunningTransferRefusesNewOnesAndExitsZero) {
  ASSERT_NO_FATAL_FAILURE(StartPair("16MiB"));  // 32 MiB: about 2 s of copying
  constexpr uint64_t kSize = 32 * kMiB;
  auto health = CheckHealth(dir_, a_->peer_address(), "node-a");
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, HealthStatus::SERVING);
  auto host = ca_->Alloc(4096);
  ASSERT_TRUE(host.ok());

  const uint64_t id = SubmitSlowTransfer(kSize);
  ASSERT_NE(id, 0u);
  const absl::Time signalled = absl::Now();
  ASSERT_EQ(kill(a_->pid(), SIGTERM), 0);
  ASSERT_TRUE(WaitForText(a_->log_path(), "draining: new transfers are refused", absl::Seconds(5)));

  // Refused, in each of the ways a client starts a transfer; the running one goes on.
  auto refused =
      ca_->Submit({{ferry::v1::WRITE, (*host)->id(), 0, "node-b", "drain-dst", 0, 4096}});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("draining"));
  auto run = ca_->Run({{ferry::v1::WRITE, (*host)->id(), 0, "node-b", "drain-dst", 0, 4096}});
  EXPECT_EQ(run.status().code(), absl::StatusCode::kUnavailable) << run.status();
  EXPECT_THAT(std::string(run.status().message()), HasSubstr("draining"));
  // Peers are refused too: node-b's new transfer to node-a fails at its Submit.
  auto landing = ca_->Alloc(4096, "a-landing");
  auto from_b = cb_->Alloc(4096);
  ASSERT_TRUE(landing.ok() && from_b.ok());
  auto peer = cb_->Submit({{ferry::v1::WRITE, (*from_b)->id(), 0, "node-a", "a-landing", 0, 4096}});
  EXPECT_EQ(peer.status().code(), absl::StatusCode::kUnavailable) << peer.status();
  EXPECT_THAT(std::string(peer.status().message()), HasSubstr("draining"));
  health = CheckHealth(dir_, a_->peer_address(), "node-a");
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, HealthStatus::NOT_SERVING) << "readiness must fail while draining";

  auto result = ca_->Wait(id, absl::Seconds(30));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->state(), ferry::v1::SUCCEEDED) << TransferStatus(*result);
  EXPECT_EQ(result->bytes(), kSize);
  EXPECT_EQ(0, std::memcmp(src_->data(), dst_->data(), kSize)) << "bytes differ after the drain";
  const absl::Duration finished = absl::Now() - signalled;

  // Our buffers and session go; the agent then stops on its own.
  (*host).reset();
  (*landing).reset();
  src_.reset();
  ca_.reset();
  const int rc = a_->AwaitExit(absl::Seconds(10));
  const absl::Duration exited = absl::Now() - signalled;
  EXPECT_EQ(rc, 0) << "a drained agent exits 0";
  EXPECT_NE(access(a_->socket().c_str(), F_OK), 0) << a_->socket() << " is still there";
  const std::string log = ReadFile(a_->log_path());
  EXPECT_THAT(log, HasSubstr("drain: 1 of 1 transfer(s) finished"));
  EXPECT_THAT(log, HasSubstr("drain: readiness: gRPC health NOT_SERVING done"));
  std::printf("drain: the running transfer finished %s after SIGTERM, the agent exited after %s\n",
              absl::FormatDuration(finished).c_str(), absl::FormatDuration(exited).c_str());
}

TEST_F(AgentDrainTest, ATransferLongerThanTheGraceIsCancelledUnavailableAndTheAgentExitsZero) {
  // 48 MiB at 4 MiB/s: about 12 s of copying, against a grace of 1 s.
  ASSERT_NO_FATAL_FAILURE(StartPair("4MiB", "limits:\n  shutdown_grace_ms: 1000\n"));
  const uint64_t id = SubmitSlowTransfer(48 * kMiB);
  ASSERT_NE(id, 0u);
  const absl::Time signalled = absl::Now();
  ASSERT_EQ(kill(a_->pid(), SIGTERM), 0);

  auto result = ca_->Wait(id, absl::Seconds(20));
  ASSERT_TRUE(result.ok()) << result.status();
  const absl::Duration ended = absl::Now() - signalled;
  EXPECT_EQ(result->state(), ferry::v1::FAILED);
  EXPECT_EQ(result->code(), static_cast<int>(absl::StatusCode::kUnavailable)) << result->message();
  EXPECT_THAT(result->message(), HasSubstr("agent is shutting down"));
  EXPECT_THAT(result->message(), HasSubstr("drain grace of 1s"));
  EXPECT_LT(result->bytes(), 48 * kMiB);
  EXPECT_GE(ended, absl::Milliseconds(900)) << "cancelled before the grace ran out";

  src_.reset();
  ca_.reset();
  const int rc = a_->AwaitExit(absl::Seconds(10));
  const absl::Duration exited = absl::Now() - signalled;
  EXPECT_EQ(rc, 0);
  // Grace (1 s) + "a little": the staging pipeline stops, the servers close (2 s at most).
  EXPECT_LT(exited, absl::Seconds(1 + 4));
  EXPECT_NE(access(a_->socket().c_str(), F_OK), 0);
  EXPECT_THAT(ReadFile(a_->log_path()), HasSubstr("1 cancelled"));
  std::printf("drain: grace 1s, the transfer ended UNAVAILABLE %s after SIGTERM, the agent "
              "exited after %s\n",
              absl::FormatDuration(ended).c_str(), absl::FormatDuration(exited).c_str());
}

TEST_F(AgentDrainTest, SigintStopsAtOnceAndCancelsWhatRuns) {
  ASSERT_NO_FATAL_FAILURE(StartPair("4MiB"));  // the default grace (30 s) is not waited for
  const uint64_t id = SubmitSlowTransfer(48 * kMiB);
  ASSERT_NE(id, 0u);
  const absl::Time signalled = absl::Now();
  ASSERT_EQ(kill(a_->pid(), SIGINT), 0);
  auto result = ca_->Wait(id, absl::Seconds(20));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->code(), static_cast<int>(absl::StatusCode::kUnavailable)) << result->message();
  EXPECT_THAT(result->message(), HasSubstr("agent is shutting down"));
  src_.reset();
  ca_.reset();
  EXPECT_EQ(a_->AwaitExit(absl::Seconds(10)), 0);
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(4));
}

}  // namespace
}  // namespace ferry
