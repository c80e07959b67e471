// TransferEngine through Submit, Find, Cancel and its limits: a real BufferRegistry over a host
// pool and a fake fabric, a real PeerDirectory that reaches a fake peer (a gRPC Peer service on
// 127.0.0.1 whose Connect is the peer fabric's own AcceptConnect, tests/fakes/
// fake_peer_service.h) and a real PolicyStore. Host buffers only: every op is direct, sliced
// and windowed per peer. Each test ends with the accounting at zero: the host pool, the fake
// fabric's regions, endpoints and outstanding ops.

#include "server/engine/transfer_engine.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_fabric.h"
#include "tests/fakes/host_plan.h"
#include "tests/fakes/fake_peer_service.h"
#include "transport/memory/host_pool.h"
#include "transport/topology/machine.h"

namespace ferry::server {
namespace {

using ::testing::HasSubstr;
using fake::FakeFabric;

constexpr uint64_t kSlice = 64 << 10;
constexpr uint64_t kWindow = 2 * kSlice;
// Slices on the wire while one transfer has the peer to itself (EngineLimits::kSoloWindows).
constexpr uint64_t kSoloSlices = EngineLimits::kSoloWindows * kWindow / kSlice;
constexpr uint64_t kLanding = 16 * kSlice;  // the peer's exported buffer
constexpr absl::Duration kPatience = absl::Seconds(10);

char PatternByte(uint64_t i, int seed) { return static_cast<char>((i * 131 + seed * 17) % 251); }
void Fill(char* p, uint64_t n, int seed) {
  for (uint64_t i = 0; i < n; ++i) p[i] = PatternByte(i, seed);
}
// The first byte of [p, p+n) that differs from pattern `seed` from `from`, or -1.
int64_t Mismatch(const char* p, uint64_t n, int seed, uint64_t from = 0) {
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i] != PatternByte(from + i, seed)) return static_cast<int64_t>(i);
  }
  return -1;
}

class TransferEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FakeFabric::ClearContractViolations();
    auto pool = memory::HostPool::Create(64 * memory::HostPool::kAlignment, "transfer_engine_test");
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    registry_ = std::make_unique<BufferRegistry>(pool_.get(), nullptr,
                                                 std::vector<fabric::Fabric*>{&local_});
    // The peer: its exported buffer "landing" on its fabric, and its Peer service.
    landing_.assign(kLanding, 0);
    auto region = peer_.Register(landing_.data(), landing_.size(),
                                 fabric::kRemoteWrite | fabric::kRemoteRead);
    ASSERT_TRUE(region.ok()) << region.status();
    landing_region_ = std::move(*region);
    service_ = std::make_unique<fake::FakePeerService>("node-b", &peer_, 0xb1);
    service_->AddBuffer("landing", Exported(*landing_region_, kLanding));
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr && port_ != 0);
    const std::string address = absl::StrCat("127.0.0.1:", port_);
    peers_ = std::make_unique<PeerDirectory>(
        "node-a", 0xa1, address, std::map<std::string, std::string>{{"node-b", address}},
        std::vector<fabric::Fabric*>{&local_});
    auto policies = PolicyStore::Create(&machine_, config::NicFilter{}, config::Policy{});
    ASSERT_TRUE(policies.ok()) << policies.status();
    policies_ = std::move(*policies);
    bounce_ = std::make_unique<BouncePools>(std::vector<fabric::Fabric*>{&local_}, nullptr);
    limits_.slice_bytes = kSlice;
    limits_.peer_window_bytes = kWindow;
    limits_.default_timeout = kPatience;
    limits_.max_timeout = absl::Seconds(30);
    engine_ = MakeEngine();
  }

  void TearDown() override {
    engine_.reset();
    EXPECT_EQ(stage_calls_, 0) << "a host-only op was staged";
    EXPECT_TRUE(local_.AwaitIdle(kPatience));
    EXPECT_EQ(local_.stats().outstanding, 0u);
    peers_->CloseAll();
    EXPECT_EQ(local_.stats().live_endpoints, 0u);
    peers_.reset();
    server_->Shutdown(absl::ToChronoTime(absl::Now()));
    server_->Wait();
    for (const auto& b : registry_->List()) EXPECT_TRUE(registry_->Free(b->id()).ok());
    EXPECT_EQ(pool_->used(), 0u) << "a buffer is still held after every transfer ended";
    registry_.reset();
    bounce_.reset();
    landing_region_.reset();
    EXPECT_EQ(local_.stats().live_regions, 0u);
    EXPECT_EQ(peer_.stats().live_regions, 0u);
    for (const auto& v : FakeFabric::ContractViolations()) ADD_FAILURE() << v;
  }

  std::unique_ptr<TransferEngine> MakeEngine() {
    EngineDeps deps;
    deps.buffers = registry_.get();
    deps.peers = peers_.get();
    deps.policies = policies_.get();
    deps.bounce = bounce_.get();
    deps.stage_calls = [this](const StageCallSpec&, StageEvents*)
        -> absl::StatusOr<std::shared_ptr<StageCall>> {
      ++stage_calls_;
      return absl::UnimplementedError("no Stage calls in this test");
    };
    deps.plan = fake::HostOnlyPlan;
    return std::make_unique<TransferEngine>(std::move(deps), limits_);
  }

  // What the peer answers for a buffer it exports through `region`.
  static ferry::v1::ResolveBufferResponse Exported(const fabric::MemoryRegion& region,
                                                   uint64_t size) {
    ferry::v1::ResolveBufferResponse r;
    r.set_size(size);
    r.set_device("host");
    auto* key = r.add_keys();
    key->set_provider("fake");
    key->set_address(region.remote_address());
    key->set_key(region.key());
    return r;
  }

  std::shared_ptr<Buffer> Local(uint64_t size, int seed) {
    auto b = registry_->Allocate(size, "");
    EXPECT_TRUE(b.ok()) << b.status();
    if (!b.ok()) return nullptr;
    Fill((*b)->data(), size, seed);
    return *b;
  }

  static ferry::v1::Op Op(ferry::v1::OpType type, const Buffer& local, uint64_t local_offset,
                          uint64_t length, uint64_t remote_offset,
                          const std::string& remote = "landing",
                          const std::string& peer = "node-b") {
    ferry::v1::Op op;
    op.set_type(type);
    op.set_local_buffer(local.id());
    op.set_local_offset(local_offset);
    op.set_length(length);
    op.set_peer(peer);
    op.set_remote_buffer(remote);
    op.set_remote_offset(remote_offset);
    return op;
  }

  // Submits and waits for the transfer to finish; its result with the ops.
  ferry::v1::TransferResult RunToEnd(const ferry::v1::SubmitRequest& request) {
    auto id = engine_->Submit(request);
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return {};
    return AwaitEnd(*id);
  }
  ferry::v1::TransferResult AwaitEnd(uint64_t id) {
    auto t = engine_->Find(id);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return {};
    EXPECT_TRUE((*t)->AwaitFinished(absl::Now() + kPatience)) << "transfer " << id;
    ResultPage page;
    page.include_ops = true;
    return (*t)->Result(page);
  }

  // The pool's used bytes once every holder let go (completions release their captures just
  // after they ran): bounded polling.
  bool AwaitPoolUsed(uint64_t bytes) {
    for (absl::Time give_up = absl::Now() + kPatience; absl::Now() < give_up;) {
      if (pool_->used() == bytes) return true;
      absl::SleepFor(absl::Milliseconds(2));
    }
    return pool_->used() == bytes;
  }

  // The engine's counts once it has retired the transfers: a waiter wakes when its transfer's
  // last op settles, a moment before the engine moves it from active to finished.
  bool AwaitEngineCounts(size_t active, uint64_t finished) {
    for (absl::Time give_up = absl::Now() + kPatience; absl::Now() < give_up;) {
      if (engine_->active() == active && engine_->finished() == finished) return true;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return engine_->active() == active && engine_->finished() == finished;
  }

  // Declared so that they go in this order: the engine, the peer directory and its endpoints,
  // the gRPC server, the registry and its regions, the fabrics, the pool.
  std::unique_ptr<memory::HostPool> pool_;
  FakeFabric peer_{{.provider = "fake"}};
  FakeFabric local_{{.provider = "fake"}};
  topology::Machine machine_;
  std::unique_ptr<PolicyStore> policies_;
  std::vector<char> landing_;
  std::unique_ptr<fabric::MemoryRegion> landing_region_;
  std::unique_ptr<BufferRegistry> registry_;
  std::unique_ptr<BouncePools> bounce_;
  std::unique_ptr<fake::FakePeerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<PeerDirectory> peers_;
  EngineLimits limits_;
  std::atomic<int> stage_calls_{0};
  std::unique_ptr<TransferEngine> engine_;
};

// Every refusal names the field, and a batch with one bad op moves nothing at all.
TEST_F(TransferEngineTest, ValidationNamesTheFieldAndNothingMoves) {
  auto src = Local(4 * kSlice, 1);
  const ferry::v1::Op good = Op(ferry::v1::WRITE, *src, 0, kSlice, 0);
  struct Case {
    const char* what;
    ferry::v1::SubmitRequest request;
    absl::StatusCode code;
    const char* field;
  };
  std::vector<Case> cases;
  auto with = [&](const char* what, std::vector<ferry::v1::Op> ops, absl::StatusCode code,
                  const char* field, uint32_t timeout_ms = 0,
                  std::vector<std::pair<std::string, std::string>> targets = {}) {
    ferry::v1::SubmitRequest r;
    for (auto& op : ops) *r.add_ops() = op;
    for (auto& [peer, name] : targets) {
      ferry::v1::Target* t = r.add_targets();
      t->set_peer(peer);
      t->set_remote_buffer(name);
    }
    r.set_timeout_ms(timeout_ms);
    cases.push_back({what, r, code, field});
  };
  ferry::v1::Op zero = good;
  zero.set_length(0);
  ferry::v1::Op past_end = good;
  past_end.set_remote_offset(kLanding - kSlice + 1);
  ferry::v1::Op stranger = good;
  stranger.set_peer("node-z");
  ferry::v1::Op no_buffer = good;
  no_buffer.set_local_buffer(src->id() + 1000);
  ferry::v1::Op local_past_end = good;
  local_past_end.set_local_offset(3 * kSlice + 1);
  ferry::v1::Op missing = good;
  missing.set_remote_buffer("nope");
  with("empty batch", {}, absl::StatusCode::kInvalidArgument, "ops: the batch is empty");
  with("second op has no length", {good, zero}, absl::StatusCode::kInvalidArgument,
       "ops[1].length");
  with("range past the remote end", {past_end, good}, absl::StatusCode::kOutOfRange,
       "ops[0].remote_offset");
  with("range past the local end", {good, local_past_end}, absl::StatusCode::kOutOfRange,
       "ops[1].local_offset");
  with("unknown peer", {good, stranger}, absl::StatusCode::kNotFound, "ops[1].peer");
  with("unknown local buffer", {no_buffer}, absl::StatusCode::kNotFound, "ops[0].local_buffer");
  // After an op on a buffer that exists: its lookup is not reused for another name.
  with("unknown local buffer after a known one", {good, no_buffer}, absl::StatusCode::kNotFound,
       "ops[1].local_buffer");
  with("unknown remote buffer", {good, missing}, absl::StatusCode::kNotFound,
       "ops[1].remote_buffer");
  // Ops that name their remote buffer by index into the request's targets.
  ferry::v1::Op by_target = good;
  by_target.clear_peer();
  by_target.clear_remote_buffer();
  by_target.set_target(1);
  ferry::v1::Op by_target_and_name = good;
  by_target_and_name.set_target(0);
  const std::pair<std::string, std::string> landing{"node-b", "landing"};
  with("target past the list", {good, by_target}, absl::StatusCode::kInvalidArgument,
       "ops[1].target: 1 is not an index of targets (1 given)", 0, {landing});
  with("target and names both", {by_target_and_name}, absl::StatusCode::kInvalidArgument,
       "ops[0].target: names targets[0], so peer and remote_buffer must be empty", 0,
       {landing});
  with("target on an unknown peer", {good, by_target}, absl::StatusCode::kNotFound,
       "ops[1].target: targets[1].peer: unknown node", 0, {landing, {"node-z", "landing"}});
  with("target with no peer", {by_target}, absl::StatusCode::kInvalidArgument,
       "ops[0].target: targets[1].peer: must name a node", 0, {landing, {"", "landing"}});
  with("target on an unknown buffer", {by_target}, absl::StatusCode::kNotFound,
       "ops[0].target: targets[1].remote_buffer", 0, {landing, {"node-b", "nope"}});
  with("timeout above the limit", {good}, absl::StatusCode::kInvalidArgument, "timeout_ms",
       /*timeout_ms=*/31000);
  with("too many ops", {good, good, good}, absl::StatusCode::kInvalidArgument,
       "max_ops_per_submit");
  EngineLimits small = limits_;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    small.max_ops_per_submit = std::string(c.what) == "too many ops" ? 2 : 65536;
    engine_->SetLimits(small);
    auto id = engine_->Submit(c.request);
    ASSERT_FALSE(id.ok());
    EXPECT_EQ(id.status().code(), c.code) << id.status();
    EXPECT_THAT(id.status().message(), HasSubstr(c.field));
  }
  EXPECT_EQ(local_.stats().posts, 0u) << "an op moved although its batch was refused";
  EXPECT_EQ(local_.stats().refused_posts, 0u);
  EXPECT_EQ(engine_->active(), 0u);
  EXPECT_EQ(std::count(landing_.begin(), landing_.end(), 0), static_cast<long>(kLanding));
  EXPECT_EQ(engine_->Find(1).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(TransferEngineTest, WriteAndReadMoveVerifiedBytes) {
  constexpr uint64_t kLength = kSlice / 2 + 333;
  auto src = Local(kSlice, 2);
  ferry::v1::SubmitRequest write;
  *write.add_ops() = Op(ferry::v1::WRITE, *src, 100, kLength, 5000);
  ferry::v1::TransferResult w = RunToEnd(write);
  EXPECT_EQ(w.state(), ferry::v1::SUCCEEDED) << w.message();
  EXPECT_EQ(w.bytes(), kLength);
  EXPECT_EQ(Mismatch(landing_.data() + 5000, kLength, 2, 100), -1);
  EXPECT_EQ(landing_[4999], 0);
  EXPECT_EQ(landing_[5000 + kLength], 0);
  ASSERT_EQ(w.ops_size(), 1);
  ASSERT_EQ(w.ops(0).legs_size(), 2);
  EXPECT_EQ(w.ops(0).legs(kLocalLeg).mode(), "host");
  EXPECT_EQ(w.ops(0).provider(), "fake");

  Fill(landing_.data(), kLanding, 3);
  auto dst = Local(kSlice, 4);
  ferry::v1::SubmitRequest read;
  *read.add_ops() = Op(ferry::v1::READ, *dst, 7, kLength, kSlice + 1);
  *read.add_ops() = Op(ferry::v1::READ, *dst, 7 + kLength, 1000, 0);
  ferry::v1::TransferResult r = RunToEnd(read);
  EXPECT_EQ(r.state(), ferry::v1::SUCCEEDED) << r.message();
  EXPECT_EQ(r.bytes(), kLength + 1000);
  EXPECT_EQ(Mismatch(dst->data() + 7, kLength, 3, kSlice + 1), -1);
  EXPECT_EQ(Mismatch(dst->data() + 7 + kLength, 1000, 3, 0), -1);
  EXPECT_EQ(Mismatch(dst->data(), 7, 4), -1) << "bytes before the op changed";
  EXPECT_TRUE(AwaitEngineCounts(0, 2)) << engine_->active() << " active, "
                                       << engine_->finished() << " finished";
}

// Ops that name their remote buffer by index into SubmitRequest.targets move the same bytes as
// ops that name it themselves, mixed in one batch, READs and WRITEs.
TEST_F(TransferEngineTest, OpsNamingATargetMoveVerifiedBytes) {
  constexpr uint64_t kLength = 3000;
  auto src = Local(kSlice, 6);
  auto by_target = [&](ferry::v1::OpType type, const Buffer& local, uint64_t local_offset,
                       uint64_t remote_offset) {
    ferry::v1::Op op = Op(type, local, local_offset, kLength, remote_offset);
    op.clear_peer();
    op.clear_remote_buffer();
    op.set_target(0);
    return op;
  };
  ferry::v1::SubmitRequest write;
  ferry::v1::Target* landing = write.add_targets();
  landing->set_peer("node-b");
  landing->set_remote_buffer("landing");
  // Scattered, the named op between two by target: no run of them is one op.
  *write.add_ops() = by_target(ferry::v1::WRITE, *src, 0, 3 * kLength);
  *write.add_ops() = Op(ferry::v1::WRITE, *src, kLength, kLength, 0);
  *write.add_ops() = by_target(ferry::v1::WRITE, *src, 2 * kLength, kLength);
  ferry::v1::TransferResult w = RunToEnd(write);
  EXPECT_EQ(w.state(), ferry::v1::SUCCEEDED) << w.message();
  EXPECT_EQ(w.bytes(), 3 * kLength);
  EXPECT_EQ(Mismatch(landing_.data() + 3 * kLength, kLength, 6, 0), -1);
  EXPECT_EQ(Mismatch(landing_.data(), kLength, 6, kLength), -1);
  EXPECT_EQ(Mismatch(landing_.data() + kLength, kLength, 6, 2 * kLength), -1);

  auto dst = Local(kSlice, 7);
  ferry::v1::SubmitRequest read;
  *read.add_targets() = *landing;
  *read.add_ops() = by_target(ferry::v1::READ, *dst, 0, 0);
  ferry::v1::TransferResult r = RunToEnd(read);
  EXPECT_EQ(r.state(), ferry::v1::SUCCEEDED) << r.message();
  EXPECT_EQ(Mismatch(dst->data(), kLength, 6, kLength), -1);
  EXPECT_TRUE(AwaitEngineCounts(0, 2));
}

// An op larger than a slice goes as slices. Alone to its peer a transfer keeps kSoloWindows
// windows on the wire; once another one waits, the newcomer's slices go only when what is in
// flight fits one window.
TEST_F(TransferEngineTest, OpsAreSlicedAndWindowedPerPeer) {
  constexpr uint64_t kLength = 11 * kSlice + 1000;  // 12 slices
  auto src = Local(kLength, 5);
  local_.HoldCompletions();
  ferry::v1::SubmitRequest big;
  *big.add_ops() = Op(ferry::v1::WRITE, *src, 0, kLength, 0);
  auto first = engine_->Submit(big);
  ASSERT_TRUE(first.ok()) << first.status();
  // Slices are posted as Submit queues them: the solo window's worth, no more.
  EXPECT_EQ(local_.stats().outstanding, kSoloSlices);
  ferry::v1::SubmitRequest small;
  *small.add_ops() = Op(ferry::v1::WRITE, *src, 0, 100, 14 * kSlice);
  auto second = engine_->Submit(small);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(local_.stats().outstanding, kSoloSlices) << "the window is per peer";
  EXPECT_EQ(local_.stats().posts, kSoloSlices);
  local_.ReleaseCompletions();
  ferry::v1::TransferResult a = AwaitEnd(*first);
  ferry::v1::TransferResult b = AwaitEnd(*second);
  EXPECT_EQ(a.state(), ferry::v1::SUCCEEDED) << a.message();
  EXPECT_EQ(b.state(), ferry::v1::SUCCEEDED) << b.message();
  EXPECT_TRUE(local_.AwaitIdle(kPatience));
  EXPECT_EQ(local_.stats().posts, 12u + 1u);
  EXPECT_EQ(local_.stats().bytes_written, kLength + 100);
  EXPECT_EQ(Mismatch(landing_.data(), kLength, 5), -1);
  EXPECT_EQ(Mismatch(landing_.data() + 14 * kSlice, 100, 5), -1);
}

// The blocks of a batch between the same two buffers ride as one fabric op up to a slice (a
// paged KV cache's blocks): adjacent ones as one piece, the others as more pieces of the
// same gathered op. Every op still settles by its own index with its own bytes; a block
// that changes direction goes on its own.
TEST_F(TransferEngineTest, BlocksBetweenTheSameBuffersRideAsOneFabricOpAndSettleByIndex) {
  constexpr uint64_t kBlock = 4 << 10;
  constexpr int kRun = static_cast<int>(kSlice / kBlock) + 4;  // a slice's worth, then 4 more
  auto src = Local(2 * kSlice, 8);
  ferry::v1::SubmitRequest batch;
  for (int b = 0; b < kRun; ++b) {
    *batch.add_ops() = Op(ferry::v1::WRITE, *src, b * kBlock, kBlock, b * kBlock);
  }
  // Adjacent locally but not remotely: a piece of its own, in the op of the 4 before it.
  *batch.add_ops() = Op(ferry::v1::WRITE, *src, kRun * kBlock, kBlock, 12 * kSlice);
  // Adjacent on both sides to the one before, but a READ: its own op.
  *batch.add_ops() = Op(ferry::v1::READ, *src, (kRun + 1) * kBlock, kBlock, 12 * kSlice + kBlock);
  ferry::v1::TransferResult r = RunToEnd(batch);
  ASSERT_EQ(r.state(), ferry::v1::SUCCEEDED) << r.message();
  EXPECT_TRUE(local_.AwaitIdle(kPatience));
  // The first slice's worth in one op, the 4 left over and the next block in another, then
  // the READ.
  EXPECT_EQ(local_.stats().posts, 3u);
  EXPECT_EQ(local_.stats().bytes_written, (kRun + 1) * kBlock);
  EXPECT_EQ(Mismatch(landing_.data(), kRun * kBlock, 8), -1);
  EXPECT_EQ(Mismatch(landing_.data() + 12 * kSlice, kBlock, 8, kRun * kBlock), -1);
  ASSERT_EQ(r.ops_size(), kRun + 2);
  for (int b = 0; b < r.ops_size(); ++b) {
    const ferry::v1::OpResult& op = r.ops(b);
    EXPECT_EQ(op.index(), static_cast<uint64_t>(b));
    EXPECT_EQ(op.code(), 0) << "op " << b << ": " << op.message();
    EXPECT_EQ(op.bytes(), kBlock) << "op " << b;
    ASSERT_EQ(op.legs_size(), 2) << "op " << b;
    EXPECT_EQ(op.legs(kLocalLeg).bytes(), kBlock) << "op " << b;
    EXPECT_FALSE(op.legs(kLocalLeg).rails().empty()) << "op " << b << ": rails not recorded";
  }
  // The waiter wakes as the last op settles, a moment before the engine retires the transfer.
  EXPECT_TRUE(AwaitEngineCounts(0, 1));
}

// The engine looks a buffer, peer and plan up once for a run of ops that share them: ops
// that switch local or remote buffer mid-batch, and back, each still move between their own.
TEST_F(TransferEngineTest, OpsThatSwitchBuffersMidBatchEachMoveBetweenTheirOwn) {
  std::vector<char> spare(kLanding, 0);
  auto region = peer_.Register(spare.data(), spare.size(), fabric::kRemoteWrite);
  ASSERT_TRUE(region.ok()) << region.status();
  service_->AddBuffer("spare", Exported(**region, kLanding));
  constexpr uint64_t kBlock = 4 << 10;
  auto a = Local(4 * kBlock, 21);
  auto b = Local(4 * kBlock, 22);
  struct Step {
    const Buffer* local;
    uint64_t block;  // of the local buffer, and the remote slot
    const char* remote;
  };
  // Runs of 2, 1, 1, 1, 2 ops, each run differing from the one before in one buffer or both.
  const std::vector<Step> steps = {{a.get(), 0, "landing"}, {a.get(), 1, "landing"},
                                   {b.get(), 2, "landing"}, {b.get(), 3, "spare"},
                                   {a.get(), 2, "spare"},   {b.get(), 0, "landing"},
                                   {b.get(), 1, "landing"}};
  ferry::v1::SubmitRequest batch;
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    // Remote slot i: apart from every other op's.
    *batch.add_ops() = Op(ferry::v1::WRITE, *s.local, s.block * kBlock, kBlock, i * kBlock,
                          s.remote);
  }
  ferry::v1::TransferResult r = RunToEnd(batch);
  ASSERT_EQ(r.state(), ferry::v1::SUCCEEDED) << r.message();
  ASSERT_EQ(r.ops_size(), static_cast<int>(steps.size()));
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& s = steps[i];
    const std::vector<char>& remote = std::string(s.remote) == "landing" ? landing_ : spare;
    const std::vector<char>& other = std::string(s.remote) == "landing" ? spare : landing_;
    const int seed = s.local == a.get() ? 21 : 22;
    EXPECT_EQ(Mismatch(remote.data() + i * kBlock, kBlock, seed, s.block * kBlock), -1)
        << "op " << i << " did not land its own block in " << s.remote;
    EXPECT_EQ(std::count(other.begin() + i * kBlock, other.begin() + (i + 1) * kBlock, 0),
              static_cast<long>(kBlock))
        << "op " << i << " wrote into the other buffer";
    EXPECT_EQ(r.ops(i).code(), 0) << "op " << i << ": " << r.ops(i).message();
  }
  EXPECT_TRUE(local_.AwaitIdle(kPatience));
  EXPECT_EQ(local_.stats().bytes_written, steps.size() * kBlock);
  EXPECT_TRUE(AwaitEngineCounts(0, 1));
  // Each op counted once in the statistics (recorded just after the engine retires the
  // transfer: bounded polling).
  auto counted = [&] {
    uint64_t ops = 0;
    for (const auto& [key, totals] : engine_->stats().Totals()) ops += totals.ops;
    return ops;
  };
  for (absl::Time give_up = absl::Now() + kPatience;
       counted() < steps.size() && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_EQ(counted(), steps.size());
  region->reset();
}

// An op between two adjacent blocks that failed before it reached the fabric (here: no rail
// reaches its buffer) keeps its own outcome: the blocks around it go as two ops, not one run
// that would settle it too.
TEST_F(TransferEngineTest, AnOpBetweenAdjacentBlocksKeepsItsOwnOutcome) {
  constexpr uint64_t kBlock = 4 << 10;
  ferry::v1::ResolveBufferResponse elsewhere = Exported(*landing_region_, kLanding);
  elsewhere.mutable_keys(0)->set_provider("nowhere");  // a key for no provider we have
  service_->AddBuffer("elsewhere", elsewhere);
  auto src = Local(kSlice, 10);
  ferry::v1::SubmitRequest batch;
  *batch.add_ops() = Op(ferry::v1::WRITE, *src, 0, kBlock, 0);
  *batch.add_ops() = Op(ferry::v1::WRITE, *src, kBlock, kBlock, 0, "elsewhere");
  *batch.add_ops() = Op(ferry::v1::WRITE, *src, kBlock, kBlock, kBlock);
  ferry::v1::TransferResult r = RunToEnd(batch);
  EXPECT_EQ(r.state(), ferry::v1::FAILED);
  ASSERT_EQ(r.ops_size(), 3);
  EXPECT_EQ(r.ops(0).code(), 0) << r.ops(0).message();
  EXPECT_NE(r.ops(1).code(), 0);
  EXPECT_NE(r.ops(1).message().find("reaches"), std::string::npos) << r.ops(1).message();
  ASSERT_EQ(r.ops(1).legs_size(), 2);
  EXPECT_TRUE(r.ops(1).legs(kLocalLeg).rails().empty()) << "the failed op got a run's rails";
  EXPECT_EQ(r.ops(2).code(), 0) << r.ops(2).message();
  EXPECT_TRUE(local_.AwaitIdle(kPatience));
  EXPECT_EQ(local_.stats().posts, 2u) << "ops 0 and 2 are not neighbours in the batch";
  EXPECT_EQ(Mismatch(landing_.data(), 2 * kBlock, 10), -1);
  EXPECT_TRUE(AwaitEngineCounts(0, 1));
}

// When the fabric fails the op a run rode in, every block of the run fails, by its index,
// and the blocks that went on their own are untouched.
TEST_F(TransferEngineTest, AFailedRunFailsEachOfItsBlocks) {
  constexpr uint64_t kBlock = 4 << 10;
  auto src = Local(kSlice, 9);
  ferry::v1::SubmitRequest batch;
  for (int b = 0; b < 3; ++b) {
    *batch.add_ops() = Op(ferry::v1::WRITE, *src, b * kBlock, kBlock, b * kBlock);
  }
  // A READ: not part of the run.
  *batch.add_ops() = Op(ferry::v1::READ, *src, 3 * kBlock, kBlock, 8 * kSlice);
  local_.FailNextOps(1, absl::InternalError("injected: the run's op failed"));
  ferry::v1::TransferResult r = RunToEnd(batch);
  EXPECT_EQ(r.state(), ferry::v1::FAILED);
  ASSERT_EQ(r.ops_size(), 4);
  for (int b = 0; b < 3; ++b) {
    EXPECT_NE(r.ops(b).code(), 0) << "block " << b << " of the failed run";
    EXPECT_EQ(r.ops(b).bytes(), 0u);
  }
  EXPECT_EQ(r.ops(3).code(), 0) << r.ops(3).message();
  EXPECT_EQ(r.ops_failed(), 3u);
  EXPECT_EQ(r.bytes(), kBlock);
  EXPECT_TRUE(AwaitEngineCounts(0, 1));
}

// Scattered blocks (a paged KV cache's, in no order) between the same buffers are gathered:
// at most kMaxPieces (256) pieces per fabric op, each landing at its own place.
// Finished transfers stay for Wait up to a number of them and of their ops: a few large
// batches push the oldest out, and the newest stays even when it alone is over the bound.
TEST_F(TransferEngineTest, TheHistoryKeepsFinishedTransfersUpToItsOpBound) {
  limits_.history_ops = 10;
  engine_ = MakeEngine();
  auto src = Local(64 << 10, 13);
  auto batch = [&](int ops) {
    ferry::v1::SubmitRequest r;
    for (int i = 0; i < ops; ++i) *r.add_ops() = Op(ferry::v1::WRITE, *src, i * 64, 64, i * 64);
    return r;
  };
  auto end = [&](int ops) {
    auto id = engine_->Submit(batch(ops));
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return uint64_t{0};
    EXPECT_EQ(AwaitEnd(*id).state(), ferry::v1::SUCCEEDED);
    return *id;
  };
  auto kept = [&](uint64_t id) { return engine_->Find(id).ok(); };
  const uint64_t first = end(4), second = end(4);
  ASSERT_TRUE(AwaitEngineCounts(0, 2));
  EXPECT_TRUE(kept(first) && kept(second)) << "8 ops are within the bound";
  const uint64_t third = end(4);
  ASSERT_TRUE(AwaitEngineCounts(0, 3));
  EXPECT_FALSE(kept(first)) << "12 ops: the oldest goes";
  EXPECT_TRUE(kept(second) && kept(third));
  const uint64_t big = end(16);
  ASSERT_TRUE(AwaitEngineCounts(0, 4));
  EXPECT_FALSE(kept(second) || kept(third)) << "the others go to make room for the newest";
  ASSERT_TRUE(kept(big)) << "the newest stays, over the bound alone";
  ferry::v1::TransferResult r = (*engine_->Find(big))->Result();
  EXPECT_EQ(r.ops_total(), 16u);
  EXPECT_EQ(r.state(), ferry::v1::SUCCEEDED);
}

TEST_F(TransferEngineTest, ScatteredBlocksAreGatheredIntoOpsOfAtMost256Pieces) {
  constexpr uint64_t kBlock = 64;
  constexpr int kBlocks = 300;
  auto src = Local(kBlocks * kBlock, 12);
  auto slot = [](int b) { return static_cast<uint64_t>(kBlocks - 1 - b) * 2 * kBlock; };
  ferry::v1::SubmitRequest batch;
  for (int b = 0; b < kBlocks; ++b) {
    *batch.add_ops() = Op(ferry::v1::WRITE, *src, b * kBlock, kBlock, slot(b));
  }
  ferry::v1::TransferResult r = RunToEnd(batch);
  ASSERT_EQ(r.state(), ferry::v1::SUCCEEDED) << r.message();
  EXPECT_TRUE(local_.AwaitIdle(kPatience));
  EXPECT_EQ(local_.stats().posts, 2u) << "256 pieces, then 44";
  EXPECT_EQ(local_.stats().bytes_written, kBlocks * kBlock);
  for (int b = 0; b < kBlocks; ++b) {
    ASSERT_EQ(Mismatch(landing_.data() + slot(b), kBlock, 12, b * kBlock), -1) << "block " << b;
    // The gap after each slot is never written.
    const char* gap = landing_.data() + slot(b) + kBlock;
    ASSERT_EQ(std::count(gap, gap + kBlock, 0), static_cast<int64_t>(kBlock)) << "gap after " << b;
  }
  ASSERT_EQ(r.ops_size(), kBlocks);
  for (int b = 0; b < kBlocks; ++b) {
    EXPECT_EQ(r.ops(b).code(), 0) << "op " << b << ": " << r.ops(b).message();
    EXPECT_EQ(r.ops(b).bytes(), kBlock) << "op " << b;
  }
  EXPECT_TRUE(AwaitEngineCounts(0, 1));
}

// Cancel settles what is open at once; the buffers stay held until the fabric is done with
// them, even once freed, and come back when it completes.
TEST_F(TransferEngineTest, CancelSettlesAtOnceButBuffersWaitForTheFabric) {
  constexpr uint64_t kLength = (kSoloSlices + 2) * kSlice;  // two slices wait for the window
  auto src = Local(kLength, 6);
  const uint64_t used = pool_->used();
  local_.HoldCompletions();
  ferry::v1::SubmitRequest request;
  *request.add_ops() = Op(ferry::v1::WRITE, *src, 0, kLength, 0);
  auto id = engine_->Submit(request);
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(local_.AwaitHeld(kSoloSlices, kPatience));
  auto cancelled = engine_->Cancel(*id);
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_TRUE((*cancelled)->finished());
  ferry::v1::TransferResult r = (*cancelled)->Result({.include_ops = true});
  EXPECT_EQ(r.state(), ferry::v1::FAILED);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_THAT(r.message(), HasSubstr(absl::StrCat("transfer ", *id, " was cancelled")));
  EXPECT_EQ(engine_->active(), 0u);
  // Freed by its owner while slices are on the wire: the memory stays.
  ASSERT_TRUE(registry_->Free(src->id()).ok());
  src.reset();
  EXPECT_EQ(pool_->used(), used) << "the buffer went back while the fabric still had it";
  EXPECT_EQ(local_.stats().held, kSoloSlices);
  local_.ReleaseCompletions();
  EXPECT_TRUE(AwaitPoolUsed(0));
  EXPECT_EQ(local_.stats().posts, kSoloSlices) << "a slice went on the wire after Cancel";
  // A finished transfer is left as it was; an unknown one is NOT_FOUND.
  auto again = engine_->Cancel(*id);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->Result().code(), static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_EQ(engine_->Cancel(*id + 100).status().code(), absl::StatusCode::kNotFound);
}

// Issue 44 row 7: one uid's running transfers are bounded (limits.per_uid_transfers); the
// refusal names the limit and the use; another uid, and transfers with no known owner, are
// not held back by it; one that ends makes room again.
TEST_F(TransferEngineTest, AUidsRunningTransfersAreBoundedAndOthersAreNot) {
  EngineLimits limits = limits_;
  limits.per_uid_transfers = 3;
  engine_->SetLimits(limits);
  auto src = Local(kSlice, 8);
  local_.HoldCompletions();
  ferry::v1::SubmitRequest request;
  *request.add_ops() = Op(ferry::v1::WRITE, *src, 0, 64, 0);
  std::vector<uint64_t> mine;
  for (int i = 0; i < 3; ++i) {
    auto id = engine_->Submit(request, {}, {}, /*owner_uid=*/1000);
    ASSERT_TRUE(id.ok()) << id.status();
    mine.push_back(*id);
  }
  auto refused = engine_->Submit(request, {}, {}, 1000);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("uid 1000 has 3 transfers running, at most 3 (limits.per_uid_transfers)"));
  auto other = engine_->Submit(request, {}, {}, 2000);
  EXPECT_TRUE(other.ok()) << other.status();
  auto unowned = engine_->Submit(request);
  EXPECT_TRUE(unowned.ok()) << unowned.status();
  EXPECT_EQ((*engine_->Find(mine[0]))->owner_uid(), 1000);
  ASSERT_TRUE(engine_->Cancel(mine[0]).ok());
  auto again = engine_->Submit(request, {}, {}, 1000);
  EXPECT_TRUE(again.ok()) << again.status();
  local_.ReleaseCompletions();
  for (uint64_t id : {mine[1], mine[2], *other, *unowned, *again}) AwaitEnd(id);
  src.reset();
}

TEST_F(TransferEngineTest, HeldPastItsTimeoutATransferFailsDeadlineExceeded) {
  auto src = Local(kSlice, 7);
  local_.HoldCompletions();
  ferry::v1::SubmitRequest request;
  *request.add_ops() = Op(ferry::v1::WRITE, *src, 0, kSlice, 0);
  request.set_timeout_ms(200);
  auto id = engine_->Submit(request);
  ASSERT_TRUE(id.ok()) << id.status();
  ferry::v1::TransferResult r = AwaitEnd(*id);
  EXPECT_EQ(r.state(), ferry::v1::FAILED);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kDeadlineExceeded)) << r.message();
  EXPECT_THAT(r.message(), HasSubstr(absl::StrCat("transfer ", *id)));
  EXPECT_EQ(local_.stats().held, 1u);
  local_.ReleaseCompletions();
  src.reset();
}

// The peer refusing the key it handed out (the buffer was freed or unexported since) is
// ABORTED naming the remote buffer, not a bare PERMISSION_DENIED.
TEST_F(TransferEngineTest, ARevokedRemoteKeyIsAbortedNamingTheBuffer) {
  std::vector<char> gone_memory(kSlice);
  auto gone = peer_.Register(gone_memory.data(), gone_memory.size(), fabric::kRemoteWrite);
  ASSERT_TRUE(gone.ok()) << gone.status();
  service_->AddBuffer("gone", Exported(**gone, kSlice));
  gone->reset();  // the peer freed it; its answer to Resolve is stale
  auto src = Local(kSlice, 8);
  ferry::v1::SubmitRequest request;
  *request.add_ops() = Op(ferry::v1::WRITE, *src, 0, 100, 0);
  *request.add_ops() = Op(ferry::v1::WRITE, *src, 0, 100, 0, "gone");
  ferry::v1::TransferResult r = RunToEnd(request);
  EXPECT_EQ(r.state(), ferry::v1::FAILED);
  ASSERT_EQ(r.ops_size(), 2);
  EXPECT_EQ(r.ops(0).code(), 0) << r.ops(0).message();
  EXPECT_EQ(r.ops(1).code(), static_cast<int>(absl::StatusCode::kAborted)) << r.ops(1).message();
  EXPECT_THAT(r.ops(1).message(), HasSubstr("remote_buffer: 'gone' on node-b"));
  EXPECT_THAT(r.message(), HasSubstr("ops[1]: "));
  EXPECT_EQ(peer_.stats().remote_refusals, 1u);
  // Other failures keep their code.
  local_.FailNextOps(1, absl::UnavailableError("fake: link down"));
  ferry::v1::SubmitRequest again;
  *again.add_ops() = Op(ferry::v1::WRITE, *src, 0, 100, 0);
  ferry::v1::TransferResult u = RunToEnd(again);
  EXPECT_EQ(u.code(), static_cast<int>(absl::StatusCode::kUnavailable)) << u.message();
  EXPECT_THAT(u.message(), HasSubstr("link down"));
}

// The drain's parts (server/agent/drain.h): new Submits refused, running ones waited for, the rest
// ended with the status given.
TEST_F(TransferEngineTest, ADrainingEngineRefusesNewTransfersAndEndsTheRunningOnesOnRequest) {
  auto src = Local(2 * kSlice, 10);
  EXPECT_TRUE(engine_->AwaitIdle(absl::Now())) << "nothing runs yet";
  local_.HoldCompletions();
  ferry::v1::SubmitRequest request;
  *request.add_ops() = Op(ferry::v1::WRITE, *src, 0, 2 * kSlice, 0);
  auto id = engine_->Submit(request);
  ASSERT_TRUE(id.ok()) << id.status();
  engine_->BeginDrain();
  EXPECT_TRUE(engine_->draining());
  auto refused = engine_->Submit(request);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("draining"));
  // Still running, so not idle within a short wait; the running one is left alone.
  EXPECT_FALSE(engine_->AwaitIdle(absl::Now() + absl::Milliseconds(50)));
  EXPECT_EQ(engine_->active(), 1u);
  EXPECT_EQ(engine_->EndAll(absl::UnavailableError("agent is shutting down: test")), 1u);
  EXPECT_TRUE(engine_->AwaitIdle(absl::Now()));
  auto transfer = engine_->Find(*id);
  ASSERT_TRUE(transfer.ok());
  ferry::v1::TransferResult r = (*transfer)->Result();
  EXPECT_EQ(r.state(), ferry::v1::FAILED);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_THAT(r.message(), HasSubstr("agent is shutting down: test"));
  EXPECT_EQ(engine_->EndAll(absl::UnavailableError("again")), 0u) << "nothing left to end";
  local_.ReleaseCompletions();
  EXPECT_TRUE(local_.AwaitIdle(kPatience));
  src.reset();
}

TEST_F(TransferEngineTest, DestroyingTheEngineSettlesRunningTransfersUnavailable) {
  // More slices than the solo window: some are on the wire, the rest never go.
  constexpr uint64_t kLength = (kSoloSlices + 2) * kSlice;
  auto src = Local(kLength, 9);
  local_.HoldCompletions();
  ferry::v1::SubmitRequest request;
  *request.add_ops() = Op(ferry::v1::WRITE, *src, 0, kLength, 0);
  *request.add_ops() = Op(ferry::v1::READ, *src, 0, kSlice, kSlice);
  auto id = engine_->Submit(request);
  ASSERT_TRUE(id.ok()) << id.status();
  auto transfer = engine_->Find(*id);
  ASSERT_TRUE(transfer.ok());
  EXPECT_FALSE((*transfer)->finished());
  engine_.reset();
  ASSERT_TRUE((*transfer)->finished());
  ferry::v1::TransferResult r = (*transfer)->Result({.include_ops = true});
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_THAT(r.message(), HasSubstr("shutting down"));
  EXPECT_EQ(r.ops_failed(), 2u);
  // As the agent stops: its endpoints close, which ends what the fabric held (its
  // completions find every op settled already).
  peers_->CloseAll();
  EXPECT_TRUE(local_.AwaitIdle(kPatience));
  EXPECT_EQ(local_.stats().failed_completions, kSoloSlices);
  local_.ReleaseCompletions();
}

// A check (MoveBlocks' verify) runs once every op settled and before anyone sees the
// transfer finished: it sees which ops moved, fails the ones it names (their bytes no longer
// count), Cancel and the deadline leave it be, and the finished hook runs after it.
TEST_F(TransferEngineTest, ACheckRunsBeforeTheTransferFinishesAndFailsTheOpsItNames) {
  auto src = Local(4 * kSlice, 21);
  ferry::v1::SubmitRequest request;
  for (int i = 0; i < 3; ++i)
    *request.add_ops() = Op(ferry::v1::WRITE, *src, i * 4096, 4096, i * 4096);
  absl::Mutex mu;
  TransferEngine::CheckDone pending;
  std::vector<int> seen_codes;
  std::atomic<int> finished_hooks{0};
  auto check = [&](std::shared_ptr<const Transfer> t, TransferEngine::CheckDone done) {
    absl::MutexLock lock(&mu);
    t->VisitOps([&](const Transfer::OpView& op) { seen_codes.push_back(op.code); });
    pending = std::move(done);
  };
  auto id = engine_->Submit(request, [&](const Transfer&) { ++finished_hooks; }, check);
  ASSERT_TRUE(id.ok()) << id.status();
  auto t = engine_->Find(*id);
  ASSERT_TRUE(t.ok());
  auto check_started = [&]() {
    absl::MutexLock lock(&mu);
    return static_cast<bool>(pending);
  };
  for (absl::Time give_up = absl::Now() + kPatience; !check_started() && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(check_started());
  EXPECT_EQ(seen_codes, std::vector<int>({0, 0, 0}));
  EXPECT_FALSE((*t)->finished());
  EXPECT_EQ((*t)->Result().state(), ferry::v1::RUNNING);
  ASSERT_TRUE(engine_->Cancel(*id).ok());  // a check in progress is left to end
  EXPECT_FALSE((*t)->AwaitFinished(absl::Now() + absl::Milliseconds(100)));
  EXPECT_EQ(finished_hooks.load(), 0);
  EXPECT_EQ(engine_->active(), 1u);
  {
    absl::MutexLock lock(&mu);
    std::move(pending)({{1, absl::DataLossError("differs")}}, absl::OkStatus());
    pending = nullptr;
  }
  ferry::v1::TransferResult r = AwaitEnd(*id);
  EXPECT_EQ(r.state(), ferry::v1::FAILED);
  EXPECT_EQ(r.code(), static_cast<int>(absl::StatusCode::kDataLoss));
  EXPECT_EQ(r.message(), "ops[1]: differs");
  EXPECT_EQ(r.ops_failed(), 1u);
  EXPECT_EQ(r.ops_succeeded(), 2u);
  EXPECT_EQ(r.bytes(), 2 * 4096u);
  ASSERT_EQ(r.ops_size(), 3);
  EXPECT_EQ(r.ops(0).code(), 0);
  EXPECT_EQ(r.ops(1).bytes(), 0u);
  EXPECT_TRUE(AwaitEngineCounts(0, 1));
  EXPECT_EQ(finished_hooks.load(), 1);

  // A check that cannot be made fails every op that moved; one never answered when the
  // engine goes ends UNAVAILABLE, and its late answer changes nothing.
  auto again = engine_->Submit(request, {}, [&](std::shared_ptr<const Transfer>,
                                                 TransferEngine::CheckDone done) {
    std::move(done)({}, absl::UnavailableError("peer gone"));
  });
  ASSERT_TRUE(again.ok());
  ferry::v1::TransferResult gone = AwaitEnd(*again);
  EXPECT_EQ(gone.ops_failed(), 3u);
  EXPECT_EQ(gone.message(), "ops[0]: peer gone");
  auto last = engine_->Submit(request, {}, check);
  ASSERT_TRUE(last.ok());
  for (absl::Time give_up = absl::Now() + kPatience; !check_started() && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_TRUE(check_started());
  auto held = engine_->Find(*last);
  ASSERT_TRUE(held.ok());
  engine_.reset();
  ASSERT_TRUE((*held)->finished());
  EXPECT_EQ((*held)->Result().code(), static_cast<int>(absl::StatusCode::kUnavailable));
  absl::MutexLock lock(&mu);
  std::move(pending)({}, absl::OkStatus());
  EXPECT_EQ((*held)->Result().ops_failed(), 3u);
}

}  // namespace
}  // namespace ferry::server
