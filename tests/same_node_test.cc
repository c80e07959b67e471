// Transfers between buffers of one agent (issue: same node without the wire): a real ferryd
// with two simulated GPUs and two clients. Every op whose peer is the agent's own node is
// copied by the agent (server/engine/local_copy.h): host <-> host by memcpy, host <-> GPU
// by the GPU's copy engine, GPU <-> GPU by the destination's (one device, or P2P), and the
// bytes land verified with provider "local", legs "local", and nothing on the tcp rail. A
// long copy stops at a cancel; block lists between two clients of the agent move the same
// way; accounting returns to zero.

#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/agent_process.h"
#include "client/block_client.h"
#include "client/ferry_client.h"
#include "gtest/gtest.h"
#include "tests/accounting.h"

namespace ferry {
namespace {

constexpr uint64_t kMiB = 1 << 20;

void Fill(Buffer& b, uint32_t seed) {
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i + 8 <= b.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(b.data() + i, &v, 8);
  }
}

const ferry::v1::Leg* LegOf(const ferry::v1::TransferResult& r, const std::string& side) {
  if (r.ops_size() == 0) return nullptr;
  for (const auto& leg : r.ops(0).legs()) {
    if (leg.side() == side) return &leg;
  }
  return nullptr;
}

class SameNodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ferry-same-node-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto port = PickFreePort();
    ASSERT_TRUE(port.ok());
    // The sim GPUs' copy engines run at 512 MiB/s, so that a cancel lands mid-copy.
    auto agent = AgentProcess::Start(
        {"solo", dir_, *port, {},
         "gpu:\n  backend: sim\n  count: 2\n  pool_size: 256MiB\n  sim_copy_rate: 512MiB\n"});
    ASSERT_TRUE(agent.ok()) << agent.status();
    agent_ = std::move(*agent);
    auto a = Client::Connect(agent_->socket());
    auto b = Client::Connect(agent_->socket());
    ASSERT_TRUE(a.ok() && b.ok());
    a_ = std::move(*a);
    b_ = std::move(*b);
  }
  void TearDown() override {
    a_.reset();
    b_.reset();
    if (agent_ && agent_->running()) ExpectAccountingAtZero(agent_->socket(), "solo");
    if (HasFailure() && agent_) {
      std::ifstream log(agent_->log_path());
      std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
      std::fprintf(stderr, "---- agent log (last 3000 bytes) ----\n%s\n",
                   text.substr(text.size() > 3000 ? text.size() - 3000 : 0).c_str());
    }
    if (agent_) agent_->Stop();
    std::system(("rm -rf " + dir_).c_str());
  }

  // `type` of [0, n) between `local` and the agent's buffer `name` (`there`), checked.
  ferry::v1::TransferResult MoveAndCheck(ferry::v1::OpType type, Buffer& local,
                                         const std::string& name, Buffer& there, uint64_t n,
                                         uint32_t seed) {
    Buffer& src = type == ferry::v1::WRITE ? local : there;
    Buffer& dst = type == ferry::v1::WRITE ? there : local;
    Fill(src, seed);
    std::memset(dst.data(), 0, dst.size());
    auto r = a_->Run({{type, local.id(), 0, "solo", name, 0, n}}, absl::Seconds(60), true);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    EXPECT_TRUE(TransferStatus(*r).ok()) << TransferStatus(*r);
    EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), n)) << local.device() << " <-> "
                                                         << there.device();
    EXPECT_EQ(r->bytes(), n);
    EXPECT_EQ(r->ops(0).provider(), "local");
    for (const char* side : {"local", "remote"}) {
      const ferry::v1::Leg* leg = LegOf(*r, side);
      EXPECT_TRUE(leg != nullptr && leg->mode() == "local") << side;
    }
    return *r;
  }

  // What the agent's tcp rail carried in all (the nics view's ledger).
  uint64_t TcpBytes() {
    auto info = a_->GetInfo();
    EXPECT_TRUE(info.ok());
    uint64_t bytes = 0;
    if (!info.ok()) return 0;
    for (const auto& nic : info->nics()) {
      if (nic.provider() != "tcp") continue;
      for (const auto& p : nic.peers()) bytes += p.bytes();
      bytes += nic.served_written_bytes() + nic.served_read_bytes();
    }
    return bytes;
  }

  std::string dir_;
  std::unique_ptr<AgentProcess> agent_;
  std::unique_ptr<Client> a_, b_;
};

TEST_F(SameNodeTest, HostToHostWritesAndReadsAreCopiesWithoutTheWire) {
  constexpr uint64_t kSize = 64 * kMiB + 12345;  // not a multiple of a slice
  auto mine = a_->Alloc(kSize);
  auto theirs = b_->Alloc(kSize, "b-host");
  ASSERT_TRUE(mine.ok() && theirs.ok());
  const uint64_t tcp_before = TcpBytes();
  auto w = MoveAndCheck(ferry::v1::WRITE, **mine, "b-host", **theirs, kSize, 1);
  EXPECT_EQ(LegOf(w, "local")->backend(), "memcpy");
  EXPECT_EQ(LegOf(w, "remote")->device(), "host");
  MoveAndCheck(ferry::v1::READ, **mine, "b-host", **theirs, kSize, 2);
  // A small one runs on the posting thread: still verified, still local.
  MoveAndCheck(ferry::v1::WRITE, **mine, "b-host", **theirs, 4096, 3);
  EXPECT_EQ(TcpBytes(), tcp_before) << "bytes went over the tcp rail";
  // Counted as any transfer is (ferryctl stats, metrics): mode and provider "local".
  ferry::v1::GetStatsResponse stats;
  grpc::ClientContext ctx;
  ASSERT_TRUE(a_->stub().GetStats(&ctx, {}, &stats).ok());
  uint64_t written = 0, read = 0;
  for (const auto& row : stats.rows()) {
    if (row.mode() != "local" || row.provider() != "local" || row.peer() != "solo") continue;
    (row.direction() == "write" ? written : read) += row.bytes();
  }
  EXPECT_EQ(written, kSize + 4096);
  EXPECT_EQ(read, kSize);
}

TEST_F(SameNodeTest, GpuCopiesRunOnTheCopyEnginesEveryWay) {
  constexpr uint64_t kSize = 24 * kMiB + 4096;
  auto host = a_->Alloc(kSize);
  auto gpu0 = a_->Alloc(kSize, "", "cuda:0");
  auto gpu0_named = b_->Alloc(kSize, "b-gpu0", "cuda:0");
  auto gpu1_named = b_->Alloc(kSize, "b-gpu1", "cuda:1");
  auto host_named = b_->Alloc(kSize, "b-host");
  ASSERT_TRUE(host.ok() && gpu0.ok() && gpu0_named.ok() && gpu1_named.ok() && host_named.ok());
  const uint64_t tcp_before = TcpBytes();
  // host -> GPU and back.
  auto r = MoveAndCheck(ferry::v1::WRITE, **host, "b-gpu1", **gpu1_named, kSize, 4);
  EXPECT_EQ(LegOf(r, "local")->backend(), "copy engine");
  EXPECT_EQ(LegOf(r, "remote")->device(), "cuda:1");
  MoveAndCheck(ferry::v1::READ, **host, "b-gpu1", **gpu1_named, kSize, 5);
  // GPU -> host.
  MoveAndCheck(ferry::v1::WRITE, **gpu0, "b-host", **host_named, kSize, 6);
  // GPU -> GPU on one device, and across two.
  r = MoveAndCheck(ferry::v1::WRITE, **gpu0, "b-gpu0", **gpu0_named, kSize, 7);
  EXPECT_EQ(LegOf(r, "local")->backend(), "copy engine");
  r = MoveAndCheck(ferry::v1::WRITE, **gpu0, "b-gpu1", **gpu1_named, kSize, 8);
  EXPECT_EQ(LegOf(r, "local")->backend(), "P2P");
  MoveAndCheck(ferry::v1::READ, **gpu0, "b-gpu1", **gpu1_named, kSize, 9);
  EXPECT_EQ(TcpBytes(), tcp_before) << "bytes went over the tcp rail";
}

TEST_F(SameNodeTest, ACancelStopsALongCopyBetweenSlices) {
  // 256 MiB at the sim copy engines' 512 MiB/s: half a second, cancelled after 100 ms.
  constexpr uint64_t kSize = 256 * kMiB;
  auto gpu0 = a_->Alloc(kSize, "", "cuda:0");
  auto gpu1 = b_->Alloc(kSize, "b-big", "cuda:1");
  ASSERT_TRUE(gpu0.ok() && gpu1.ok());
  auto id = a_->Submit({{ferry::v1::WRITE, (*gpu0)->id(), 0, "solo", "b-big", 0, kSize}});
  ASSERT_TRUE(id.ok()) << id.status();
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time asked = absl::Now();
  auto cancelled = a_->Cancel(*id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  auto r = a_->Wait(*id, absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), ferry::v1::FAILED);
  EXPECT_EQ(TransferStatus(*r).code(), absl::StatusCode::kCancelled) << TransferStatus(*r);
  // The copy stopped at a slice: well before the 400 ms left of it.
  EXPECT_LT(absl::Now() - asked, absl::Milliseconds(300));
  // Both buffers can be freed at once: no copy holds them (TearDown counts the pools).
  EXPECT_TRUE(a_->Free((*gpu0)->id()).ok());
  EXPECT_TRUE(b_->Free((*gpu1)->id()).ok());
}

TEST_F(SameNodeTest, BlockListsOfTwoClientsMoveBetweenThemHere) {
  constexpr uint64_t kBlock = 16 << 10, kBlocks = 64;
  auto src = a_->Alloc(kBlocks * kBlock);
  auto dst = b_->Alloc(kBlocks * kBlock, "b-kv");
  ASSERT_TRUE(src.ok() && dst.ok());
  Fill(**src, 10);
  BlockClient a_blocks(a_->shared_session());
  BlockClient b_blocks(b_->shared_session());
  auto local = a_blocks.Prepare({Extent((*src)->id(), 0, kBlock, kBlocks)});
  auto exported = b_blocks.Prepare({Extent((*dst)->id(), 0, kBlock, kBlocks)}, "kv");
  ASSERT_TRUE(local.ok() && exported.ok()) << local.status() << exported.status();
  // Block i into block kBlocks-1-i, verified by the agent's checksums.
  std::vector<uint64_t> from, to;
  for (uint64_t i = 0; i < kBlocks; ++i) {
    from.push_back(i);
    to.push_back(kBlocks - 1 - i);
  }
  const uint64_t tcp_before = TcpBytes();
  auto moved = a_blocks.Move(ferry::v1::WRITE, local->list(), from, "solo", "kv", to, "", 0,
                             /*verify=*/true);
  ASSERT_TRUE(moved.ok()) << moved.status();
  auto r = a_->Wait(moved->transfer_id(), absl::Seconds(30));
  ASSERT_TRUE(r.ok() && TransferStatus(*r).ok()) << (r.ok() ? TransferStatus(*r) : r.status());
  for (uint64_t i = 0; i < kBlocks; ++i) {
    EXPECT_EQ(0, std::memcmp((*src)->data() + i * kBlock,
                             (*dst)->data() + (kBlocks - 1 - i) * kBlock, kBlock))
        << "block " << i;
  }
  EXPECT_EQ(TcpBytes(), tcp_before) << "bytes went over the tcp rail";
  EXPECT_TRUE(a_blocks.Release(local->list()).ok());
  EXPECT_TRUE(b_blocks.Release(exported->list()).ok());
}

}  // namespace
}  // namespace ferry
