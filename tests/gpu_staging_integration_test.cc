// Two agents with simulated GPUs placed by topology fixtures: node-a is the dual-socket
// machine (its GPU is SYS away from the only NIC: staged under the default policy), node-b
// the 8-GPU switch server (every GPU PIX to its NIC: GDR). Every mode combination moves
// verified data; policy changes at run time flip new transfers and not running ones.

#include <signal.h>
#include <stdlib.h>

#include <cstring>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/agent_process.h"
#include "tests/accounting.h"
#include "client/ferry_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1 << 20;

std::string Fixture(const std::string& name) {
  return absl::StrCat(FERRY_FIXTURES, "/topology/", name);
}

void Fill(Buffer& b, uint32_t seed) {
  std::mt19937_64 rng(seed);
  for (uint64_t i = 0; i + 8 <= b.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(b.data() + i, &v, 8);
  }
}

// The legs of op 0 of a result, by side.
const ferry::v1::Leg& LegOf(const ferry::v1::TransferResult& r, const std::string& side) {
  static ferry::v1::Leg none;
  if (r.ops_size() == 0) {
    ADD_FAILURE() << "no ops in the result";
    return none;
  }
  for (const auto& leg : r.ops(0).legs()) {
    if (leg.side() == side) return leg;
  }
  ADD_FAILURE() << "no " << side << " leg";
  return none;
}

class GpuStagingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ferry-gpu-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    auto pa = PickFreePort(), pb = PickFreePort();
    ASSERT_TRUE(pa.ok() && pb.ok());
    std::string common = "gpu:\n  backend: sim\n  count: 2\n  pool_size: 256MiB\n";
    auto a = AgentProcess::Start(
        {"node-a", dir_, *pa, {{"node-b", absl::StrCat("127.0.0.1:", *pb)}},
         absl::StrCat("topology: ", Fixture("dual_socket_sys.xml"), "\n", common,
                      "policy:\n  staging_chunk: 1MiB\n  staging_depth: 4\n")});
    ASSERT_TRUE(a.ok()) << a.status();
    a_ = std::move(*a);
    auto b = AgentProcess::Start(
        {"node-b", dir_, *pb, {{"node-a", absl::StrCat("127.0.0.1:", *pa)}},
         absl::StrCat("topology: ", Fixture("dgx8_switches.xml"), "\n", common,
                      "  sim_copy_rate: 512MiB\n",
                      "policy:\n  staging_chunk: 1MiB\n  staging_depth: 4\n")});
    ASSERT_TRUE(b.ok()) << b.status();
    b_ = std::move(*b);
    auto ca = Client::Connect(a_->socket());
    auto cb = Client::Connect(b_->socket());
    ASSERT_TRUE(ca.ok() && cb.ok());
    ca_ = std::move(*ca);
    cb_ = std::move(*cb);
  }
  void TearDown() override {
    ca_.reset();
    cb_.reset();
    for (auto* agent : {a_.get(), b_.get()}) {
      if (agent && agent->running()) ExpectAccountingAtZero(agent->socket(), agent->node());
    }
    if (a_) a_->Stop();
    if (b_) b_->Stop();
    if (HasFailure()) {
      // The agents' own words are the best clue to a failure.
      for (const auto* agent : {a_.get(), b_.get()}) {
        if (agent == nullptr) continue;
        std::ifstream log(agent->log_path());
        std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
        std::fprintf(stderr, "---- %s log (last 3000 bytes) ----\n%s\n", agent->node().c_str(),
                     text.substr(text.size() > 3000 ? text.size() - 3000 : 0).c_str());
      }
    }
    std::system(("rm -rf " + dir_).c_str());
  }

  // Writes `size` bytes from `src` (on `from`'s agent) to `dst_name` on `node`, checks the
  // bytes landed, and returns the result.
  ferry::v1::TransferResult WriteAndCheck(Client& from, Buffer& src, const std::string& node,
                                          const std::string& dst_name, Buffer& dst, uint64_t size) {
    Fill(src, static_cast<uint32_t>(size + dst.id()));
    std::memset(dst.data(), 0, size);
    auto r = from.Run({{ferry::v1::WRITE, src.id(), 0, node, dst_name, 0, size}}, absl::Seconds(60),
                      true);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok()) return {};
    EXPECT_TRUE(TransferStatus(*r).ok()) << TransferStatus(*r);
    EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), size)) << "data differs after " << dst_name;
    return *r;
  }

  std::string dir_;
  std::unique_ptr<AgentProcess> a_, b_;
  std::unique_ptr<Client> ca_, cb_;
};

TEST_F(GpuStagingTest, EveryModeCombinationMovesVerifiedData) {
  constexpr uint64_t kSize = 24 * kMiB + 12345;  // not a multiple of the chunk
  auto a_gpu = ca_->Alloc(kSize, "a-gpu0", "cuda:0");
  auto a_host = ca_->Alloc(kSize, "a-host");
  auto b_gpu0 = cb_->Alloc(kSize, "b-gpu0", "cuda:0");
  auto b_gpu1 = cb_->Alloc(kSize, "b-gpu1", "cuda:1");
  auto b_host = cb_->Alloc(kSize, "b-host");
  ASSERT_TRUE(a_gpu.ok()) << a_gpu.status();
  ASSERT_TRUE(a_host.ok() && b_gpu0.ok() && b_gpu1.ok() && b_host.ok());
  EXPECT_EQ((*a_gpu)->device(), "cuda:0");

  // staged -> gdr: node-a's GPU is SYS from its NIC; node-b's GPU is PIX from its own.
  auto r = WriteAndCheck(*ca_, **a_gpu, "node-b", "b-gpu0", **b_gpu0, kSize);
  EXPECT_EQ(LegOf(r, "local").mode(), "staged");
  EXPECT_EQ(LegOf(r, "local").path(), "SYS");
  EXPECT_EQ(LegOf(r, "local").nic(), "mlx5_0");
  EXPECT_THAT(LegOf(r, "local").reason(), HasSubstr("SYS apart"));
  EXPECT_EQ(LegOf(r, "local").backend(), "sim");
  EXPECT_EQ(LegOf(r, "local").chunks(), 25u);
  EXPECT_EQ(LegOf(r, "remote").mode(), "gdr");
  EXPECT_EQ(LegOf(r, "remote").path(), "PIX");
  EXPECT_EQ(r.ops(0).provider(), "tcp");
  EXPECT_GT(r.policy_generation(), 0u);

  // staged -> host, host -> gdr.
  r = WriteAndCheck(*ca_, **a_gpu, "node-b", "b-host", **b_host, kSize);
  EXPECT_EQ(LegOf(r, "local").mode(), "staged");
  EXPECT_EQ(LegOf(r, "remote").mode(), "host");
  r = WriteAndCheck(*ca_, **a_host, "node-b", "b-gpu1", **b_gpu1, kSize);
  EXPECT_EQ(LegOf(r, "local").mode(), "host");
  EXPECT_EQ(LegOf(r, "remote").mode(), "gdr");

  // gdr -> staged (node-b's GPU into node-a's); node-b to itself is no transfer over a
  // fabric but a copy between its two GPUs (server/engine/local_copy.h).
  r = WriteAndCheck(*cb_, **b_gpu0, "node-a", "a-gpu0", **a_gpu, kSize);
  EXPECT_EQ(LegOf(r, "local").mode(), "gdr");
  EXPECT_EQ(LegOf(r, "remote").mode(), "staged");
  EXPECT_THAT(LegOf(r, "remote").reason(), HasSubstr("staging through host memory on NUMA node 1"));
  r = WriteAndCheck(*cb_, **b_gpu0, "node-b", "b-gpu1", **b_gpu1, kSize);
  EXPECT_EQ(LegOf(r, "local").mode(), "local");
  EXPECT_EQ(LegOf(r, "local").backend(), "P2P");
  EXPECT_EQ(LegOf(r, "remote").mode(), "local");
  EXPECT_EQ(LegOf(r, "remote").device(), "cuda:1");
  EXPECT_EQ(r.ops(0).provider(), "local");

  // node-a's GPU into its other GPU, whose NICs would both stage: copied, not staged.
  auto a_gpu1 = ca_->Alloc(kSize, "a-gpu1", "cuda:1");
  ASSERT_TRUE(a_gpu1.ok());
  r = WriteAndCheck(*ca_, **a_gpu, "node-a", "a-gpu1", **a_gpu1, kSize);
  EXPECT_EQ(LegOf(r, "local").mode(), "local");
  EXPECT_EQ(LegOf(r, "remote").mode(), "local");

  // READ into a staged GPU from a host buffer: wire into a bounce chunk, then copy-in.
  Fill(**b_host, 77);
  std::memset((*a_gpu)->data(), 0, kSize);
  auto read = ca_->Run({{ferry::v1::READ, (*a_gpu)->id(), 0, "node-b", "b-host", 0, kSize}},
                       absl::Seconds(60), true);
  ASSERT_TRUE(read.ok() && TransferStatus(*read).ok())
      << (read.ok() ? TransferStatus(*read) : read.status());
  EXPECT_EQ(0, std::memcmp((*b_host)->data(), (*a_gpu)->data(), kSize));
  EXPECT_EQ(LegOf(*read, "local").mode(), "staged");

  // READ from a staged GPU on the peer: it copies each range out into a bounce chunk and
  // says when it is ready. Into host memory, into a GDR GPU; and on node-a itself, a copy.
  struct ReadCase {
    Client* client;
    Buffer* local;
    std::string local_mode;
    std::string remote_mode = "staged";
  } reads[] = {{cb_.get(), b_host->get(), "host"},
               {cb_.get(), b_gpu1->get(), "gdr"},
               {ca_.get(), a_gpu1->get(), "local", "local"}};
  for (const ReadCase& c : reads) {
    Fill(**a_gpu, static_cast<uint32_t>(c.local->id()));
    std::memset(c.local->data(), 0, kSize);
    auto r = c.client->Run({{ferry::v1::READ, c.local->id(), 0, "node-a", "a-gpu0", 0, kSize}},
                           absl::Seconds(60), true);
    ASSERT_TRUE(r.ok() && TransferStatus(*r).ok()) << (r.ok() ? TransferStatus(*r) : r.status());
    EXPECT_EQ(0, std::memcmp((*a_gpu)->data(), c.local->data(), kSize)) << c.local_mode;
    EXPECT_EQ(LegOf(*r, "remote").mode(), c.remote_mode);
    EXPECT_EQ(LegOf(*r, "local").mode(), c.local_mode);
  }
  for (Client* c : {ca_.get(), cb_.get()}) {
    absl::StatusOr<ferry::v1::GetInfoResponse> info;
    uint32_t in_use = 0;
    for (int i = 0; i < 100; ++i) {  // Stage calls give their chunks back as they close
      info = c->GetInfo();
      ASSERT_TRUE(info.ok());
      in_use = 0;
      for (const auto& pool : info->bounce_pools()) in_use += pool.chunks_in_use();
      if (in_use == 0) break;
      absl::SleepFor(absl::Milliseconds(20));
    }
    EXPECT_EQ(in_use, 0u) << info->node() << " leaked bounce chunks";
  }
}

TEST_F(GpuStagingTest, KvBlocksIntoAStagedGpuLandInPlace) {
  constexpr int kBlocks = 256;
  constexpr uint64_t kBlock = 64 << 10;
  auto src = cb_->Alloc(kBlocks * kBlock, "", "cuda:0");
  auto dst = ca_->Alloc(2 * kBlocks * kBlock, "a-kv", "cuda:0");
  ASSERT_TRUE(src.ok() && dst.ok());
  Fill(**src, 5);
  std::vector<OpSpec> ops;
  for (int i = 0; i < kBlocks; ++i) {
    ops.push_back({ferry::v1::WRITE, (*src)->id(), i * kBlock, "node-a", "a-kv",
                   static_cast<uint64_t>((i * 37) % (2 * kBlocks)) * kBlock, kBlock});
  }
  auto r = cb_->Run(ops, absl::Seconds(60), true);
  ASSERT_TRUE(r.ok() && TransferStatus(*r).ok()) << (r.ok() ? TransferStatus(*r) : r.status());
  for (int i = 0; i < kBlocks; ++i) {
    ASSERT_EQ(
        0, std::memcmp((*src)->data() + i * kBlock, (*dst)->data() + ops[i].remote_offset, kBlock))
        << i;
    ASSERT_EQ(r->ops(i).legs(1).mode(), "staged");
  }
}

TEST_F(GpuStagingTest, SetPolicyFlipsTheNextTransferAndNotTheRunningOne) {
  // Start with GDR off on node-b, so its first transfer stages (slowly: its simulated copy
  // engine runs at 512 MiB/s), then turn GDR on while it runs.
  ASSERT_TRUE(cb_->SetPolicy({{"gdr", "never"}}).ok());
  constexpr uint64_t kSize = 128 * kMiB;
  auto src = cb_->Alloc(kSize, "", "cuda:0");
  auto dst = ca_->Alloc(kSize, "a-landing");
  ASSERT_TRUE(src.ok() && dst.ok());
  Fill(**src, 3);
  auto first = cb_->Submit({{ferry::v1::WRITE, (*src)->id(), 0, "node-a", "a-landing", 0, kSize}},
                           absl::Seconds(60));
  ASSERT_TRUE(first.ok()) << first.status();
  auto before = cb_->GetPolicy();
  auto after = cb_->SetPolicy({{"gdr", "auto"}});
  ASSERT_TRUE(before.ok() && after.ok()) << after.status();
  EXPECT_EQ(after->generation(), before->generation() + 1);
  auto still = cb_->Wait(*first, absl::Milliseconds(1));
  EXPECT_EQ(still.status().code(), absl::StatusCode::kDeadlineExceeded)
      << "the first transfer already ended";

  auto second = cb_->Run({{ferry::v1::WRITE, (*src)->id(), 0, "node-a", "a-landing", 0, kSize}},
                         absl::Seconds(60), true);
  auto one = cb_->Wait(*first, absl::Seconds(60), true);
  ASSERT_TRUE(one.ok() && second.ok());
  ASSERT_TRUE(TransferStatus(*one).ok()) << TransferStatus(*one);
  ASSERT_TRUE(TransferStatus(*second).ok()) << TransferStatus(*second);
  EXPECT_EQ(one->policy_generation(), before->generation());
  EXPECT_EQ(LegOf(*one, "local").mode(), "staged");
  EXPECT_THAT(LegOf(*one, "local").reason(), HasSubstr("never"));
  EXPECT_EQ(second->policy_generation(), after->generation());
  EXPECT_EQ(LegOf(*second, "local").mode(), "gdr");
  EXPECT_EQ(0, std::memcmp((*src)->data(), (*dst)->data(), kSize));
}

TEST_F(GpuStagingTest, FallbackFailRefusesWithTheTopologyReason) {
  auto gpu = ca_->Alloc(4 * kMiB, "", "cuda:0");
  auto host = cb_->Alloc(4 * kMiB, "b-target");
  ASSERT_TRUE(gpu.ok() && host.ok());
  ASSERT_TRUE(ca_->SetPolicy({{"fallback", "fail"}}).ok());
  auto r = ca_->Run({{ferry::v1::WRITE, (*gpu)->id(), 0, "node-b", "b-target", 0, 4 * kMiB}});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->state(), ferry::v1::FAILED);
  EXPECT_EQ(r->code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(r->message(), HasSubstr("SYS apart"));
  // Loosening gdr_max_path makes the same transfer go GDR.
  ASSERT_TRUE(ca_->SetPolicy({{"gdr_max_path", "SYS"}}).ok());
  auto ok = ca_->Run({{ferry::v1::WRITE, (*gpu)->id(), 0, "node-b", "b-target", 0, 4 * kMiB}},
                     absl::Seconds(30), true);
  ASSERT_TRUE(ok.ok() && TransferStatus(*ok).ok());
  EXPECT_EQ(LegOf(*ok, "local").mode(), "gdr");
}

TEST_F(GpuStagingTest, InvalidPolicyIsRefusedAndTheOldOneStays) {
  auto before = ca_->GetPolicy();
  ASSERT_TRUE(before.ok());
  auto bad = ca_->SetPolicy({{"gdr", "sometimes"}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("gdr"));
  auto mixed = ca_->SetPolicy({{"staging_depth", "8"}, {"staging_chunk", "1"}});
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument);
  auto now = ca_->GetPolicy();
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->generation(), before->generation());
  EXPECT_EQ(now->staging_depth(), before->staging_depth())
      << "a refused batch applied part of itself";
}

TEST_F(GpuStagingTest, SighupReloadsThePolicyAndRefusesABadFile) {
  auto before = cb_->GetPolicy();
  ASSERT_TRUE(before.ok());
  std::string config;
  {
    std::ifstream in(b_->config_path());
    config.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::ofstream(b_->config_path()) << config << "  fallback: fail\n";  // appended to policy:
  ASSERT_EQ(kill(b_->pid(), SIGHUP), 0);
  absl::StatusOr<ferry::v1::PolicyState> now;
  for (int i = 0; i < 100; ++i) {
    now = cb_->GetPolicy();
    if (now.ok() && now->generation() != before->generation()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(now.ok());
  EXPECT_EQ(now->generation(), before->generation() + 1);
  EXPECT_EQ(now->fallback(), "fail");

  std::ofstream(b_->config_path()) << config << "  gdr: sometimes\n";
  ASSERT_EQ(kill(b_->pid(), SIGHUP), 0);
  absl::SleepFor(absl::Milliseconds(300));
  auto unchanged = cb_->GetPolicy();
  ASSERT_TRUE(unchanged.ok());
  EXPECT_EQ(unchanged->generation(), now->generation());
  EXPECT_EQ(unchanged->fallback(), "fail");
}

TEST_F(GpuStagingTest, ASlowReceiverKeepsBounceMemoryBounded) {
  // node-b's copy engine is slow; GDR off makes its GPU staged. 64 chunks' worth of data
  // go through, but no more than `staging_depth` chunks are ever granted.
  ASSERT_TRUE(cb_->SetPolicy({{"gdr", "never"}}).ok());
  constexpr uint64_t kSize = 64 * kMiB;
  auto src = ca_->Alloc(kSize);
  auto dst = cb_->Alloc(kSize, "b-slow", "cuda:1");
  ASSERT_TRUE(src.ok() && dst.ok());
  auto r = WriteAndCheck(*ca_, **src, "node-b", "b-slow", **dst, kSize);
  EXPECT_EQ(LegOf(r, "remote").mode(), "staged");
  // The Stage call gives its last grants back when the writer closes it, just after the
  // transfer's result: allow it a moment.
  absl::StatusOr<ferry::v1::GetInfoResponse> info;
  for (int i = 0; i < 100; ++i) {
    info = cb_->GetInfo();
    ASSERT_TRUE(info.ok());
    bool idle = true;
    for (const auto& pool : info->bounce_pools()) idle &= pool.chunks_in_use() == 0;
    if (idle) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_FALSE(info->bounce_pools().empty());
  for (const auto& pool : info->bounce_pools()) {
    EXPECT_LE(pool.peak_chunks_in_use(), 4u) << pool.name();
    EXPECT_EQ(pool.chunks_in_use(), 0u) << pool.name() << " leaked chunks";
    EXPECT_EQ(pool.chunk_bytes(), kMiB);
  }
}

TEST_F(GpuStagingTest, GpuBuffersAreAccountedAndBadDevicesRefused) {
  auto missing = ca_->Alloc(kMiB, "", "cuda:7");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("device"));
  auto odd = ca_->Alloc(kMiB, "", "tpu:0");
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kInvalidArgument);
  auto big = ca_->Alloc(512 * kMiB, "", "cuda:0");
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  auto one = ca_->Alloc(3 * kMiB, "", "cuda:0");
  ASSERT_TRUE(one.ok());
  auto info = ca_->GetInfo();
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->gpus_size(), 2);
  EXPECT_EQ(info->gpus(0).backend(), "sim");
  EXPECT_EQ(info->gpus(0).pci(), "0000:3b:00.0");
  EXPECT_EQ(info->gpus(0).pool_used_bytes(), 3 * kMiB);
  ASSERT_TRUE(ca_->Free((*one)->id()).ok());
  info = ca_->GetInfo();
  EXPECT_EQ(info->gpus(0).pool_used_bytes(), 0u);
}

}  // namespace
}  // namespace ferry
