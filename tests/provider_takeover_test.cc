// The reserve provider's takeover, end to end through TransferEngine (issue 43 items 4 and
// 6): both agents offer two providers, a fake "verbs" first and a fake "tcp" behind it
// (tests/fakes: fault injection on each), as a Soft-RoCE guest's agents do. A rail that keeps
// failing, or never connects, hands its slices to the next provider both agents offer, the
// op succeeds with its bytes verified and counted under the provider that carried them, and
// the ledger (ferryctl nics) keeps the root cause and where the slices went; an op fails only
// when no route is left, or when the policy says `fallback: fail`. striped_op_test covers
// StripedOp's lanes alone; this is the engine's planning, connecting and settling around it.
// Each test ends with the accounting at zero, as transfer_engine_test's do.

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/engine/transfer_engine.h"
#include "tests/fakes/fake_fabric.h"
#include "tests/fakes/fake_peer_service.h"
#include "tests/fakes/host_plan.h"
#include "transport/memory/host_pool.h"
#include "transport/topology/machine.h"

namespace ferry::server {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using fake::FakeFabric;

constexpr uint64_t kSlice = 64 << 10;
constexpr uint64_t kLength = 8 * kSlice;  // one op, eight slices
constexpr absl::Duration kPatience = absl::Seconds(10);
// What rxe's completions said when the peer was gone (make test-rdma).
const absl::Status kRetryExceeded =
    absl::UnavailableError("verbs: QP 0x15 wr_id 52: transport retry counter exceeded");

char PatternByte(uint64_t i) { return static_cast<char>((i * 131 + 17) % 251); }

class ProviderTakeoverTest : public ::testing::Test {
 protected:
  void SetUp() override { FakeFabric::ClearContractViolations(); }

  // `policy`: the agent's (fallback: fail or the default).
  void Start(config::Policy policy = {}) {
    auto pool = memory::HostPool::Create(64 * memory::HostPool::kAlignment, "takeover_test");
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    const std::vector<fabric::Fabric*> ours{&verbs_, &tcp_};
    registry_ = std::make_unique<BufferRegistry>(pool_.get(), nullptr, ours);
    // The peer exports "landing" on both of its fabrics.
    landing_.assign(kLength, 0);
    ferry::v1::ResolveBufferResponse exported;
    exported.set_size(kLength);
    exported.set_device("host");
    for (FakeFabric* f : {&peer_verbs_, &peer_tcp_}) {
      auto region = f->Register(landing_.data(), landing_.size(),
                                fabric::kRemoteWrite | fabric::kRemoteRead);
      ASSERT_TRUE(region.ok()) << region.status();
      auto* key = exported.add_keys();
      key->set_provider(f->provider());
      key->set_address((*region)->remote_address());
      key->set_key((*region)->key());
      landing_regions_.push_back(std::move(*region));
    }
    service_ = std::make_unique<fake::FakePeerService>(
        "node-b", std::vector<fabric::Fabric*>{&peer_verbs_, &peer_tcp_}, 0xb1);
    service_->AddBuffer("landing", exported);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ != nullptr && port_ != 0);
    const std::string address = absl::StrCat("127.0.0.1:", port_);
    peers_ = std::make_unique<PeerDirectory>(
        "node-a", 0xa1, address, std::map<std::string, std::string>{{"node-b", address}}, ours);
    auto policies = PolicyStore::Create(&machine_, config::NicFilter{}, policy);
    ASSERT_TRUE(policies.ok()) << policies.status();
    policies_ = std::move(*policies);
    bounce_ = std::make_unique<BouncePools>(ours, nullptr);
    EngineDeps deps;
    deps.buffers = registry_.get();
    deps.peers = peers_.get();
    deps.policies = policies_.get();
    deps.bounce = bounce_.get();
    deps.stage_calls = [](const StageCallSpec&, StageEvents*)
        -> absl::StatusOr<std::shared_ptr<StageCall>> {
      return absl::UnimplementedError("no Stage calls in this test");
    };
    deps.plan = fake::HostOnlyPlan;
    EngineLimits limits;
    limits.slice_bytes = kSlice;
    limits.peer_window_bytes = 2 * kSlice;
    limits.default_timeout = kPatience;
    limits.max_timeout = absl::Seconds(30);
    engine_ = std::make_unique<TransferEngine>(std::move(deps), limits);
    auto source = registry_->Allocate(kLength, "");
    ASSERT_TRUE(source.ok()) << source.status();
    source_ = *source;
    for (uint64_t i = 0; i < kLength; ++i) source_->data()[i] = PatternByte(i);
  }

  void TearDown() override {
    if (engine_ == nullptr) return;
    engine_.reset();
    source_.reset();
    for (FakeFabric* f : {&verbs_, &tcp_}) {
      EXPECT_TRUE(f->AwaitIdle(kPatience)) << f->provider();
      EXPECT_EQ(f->stats().outstanding, 0u) << f->provider();
    }
    peers_->CloseAll();
    EXPECT_EQ(verbs_.stats().live_endpoints + tcp_.stats().live_endpoints, 0u);
    peers_.reset();
    server_->Shutdown(absl::ToChronoTime(absl::Now()));
    server_->Wait();
    for (const auto& b : registry_->List()) EXPECT_TRUE(registry_->Free(b->id()).ok());
    EXPECT_EQ(pool_->used(), 0u) << "a buffer is still held after every transfer ended";
    registry_.reset();
    bounce_.reset();
    landing_regions_.clear();
    for (FakeFabric* f : {&verbs_, &tcp_, &peer_verbs_, &peer_tcp_}) {
      EXPECT_EQ(f->stats().live_regions, 0u) << f->provider();
    }
    for (const auto& v : FakeFabric::ContractViolations()) ADD_FAILURE() << v;
  }

  // One WRITE of the whole source into node-b's "landing", run to its end.
  ferry::v1::TransferResult Write() {
    ferry::v1::SubmitRequest request;
    auto* op = request.add_ops();
    op->set_type(ferry::v1::WRITE);
    op->set_local_buffer(source_->id());
    op->set_length(kLength);
    op->set_peer("node-b");
    op->set_remote_buffer("landing");
    auto id = engine_->Submit(request);
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return {};
    auto t = engine_->Find(*id);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return {};
    EXPECT_TRUE((*t)->AwaitFinished(absl::Now() + kPatience)) << "transfer " << *id;
    ResultPage page;
    page.include_ops = true;
    return (*t)->Result(page);
  }

  bool LandingHoldsTheSource() const {
    for (uint64_t i = 0; i < kLength; ++i) {
      if (landing_[i] != PatternByte(i)) return false;
    }
    return true;
  }

  // The rails the op's local leg names.
  static std::vector<std::string> LocalRails(const ferry::v1::TransferResult& r) {
    if (r.ops_size() != 1 || r.ops(0).legs_size() == 0) return {};
    const auto& rails = r.ops(0).legs(0).rails();
    return {rails.begin(), rails.end()};
  }

  // The ledger's line for our rail of `provider` to node-b.
  RailPeerCounters Ledger(const std::string& provider) const {
    for (const RailPeerCounters& c : engine_->ledger().Snapshot(absl::Now())) {
      if (c.rail.provider == provider && c.peer == "node-b") return c;
    }
    return {};
  }

  // Declared so that they go in this order: the engine, the peer directory and its
  // endpoints, the gRPC server, the registry and its regions, the fabrics, the pool.
  std::unique_ptr<memory::HostPool> pool_;
  FakeFabric peer_verbs_{{.provider = "verbs"}};
  FakeFabric peer_tcp_{{.provider = "tcp"}};
  FakeFabric verbs_{{.provider = "verbs"}};
  FakeFabric tcp_{{.provider = "tcp"}};
  topology::Machine machine_;
  std::unique_ptr<PolicyStore> policies_;
  std::vector<char> landing_;
  std::vector<std::unique_ptr<fabric::MemoryRegion>> landing_regions_;
  std::unique_ptr<BufferRegistry> registry_;
  std::unique_ptr<BouncePools> bounce_;
  std::unique_ptr<fake::FakePeerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::unique_ptr<PeerDirectory> peers_;
  std::unique_ptr<TransferEngine> engine_;
  std::shared_ptr<Buffer> source_;
};

TEST_F(ProviderTakeoverTest, WhileVerbsCarriesTcpIsNotTouched) {
  Start();
  const ferry::v1::TransferResult r = Write();
  ASSERT_EQ(r.state(), ferry::v1::SUCCEEDED) << r.ShortDebugString();
  EXPECT_TRUE(LandingHoldsTheSource());
  EXPECT_EQ(r.ops(0).provider(), "verbs");
  EXPECT_EQ(verbs_.stats().bytes_written, kLength);
  EXPECT_EQ(tcp_.stats().posts, 0u);
}

TEST_F(ProviderTakeoverTest, ARailThatKeepsFailingHandsItsSlicesToTheNextProvider) {
  Start();
  verbs_.FailNextOps(1000, kRetryExceeded);
  const ferry::v1::TransferResult r = Write();
  ASSERT_EQ(r.state(), ferry::v1::SUCCEEDED) << r.ShortDebugString();
  EXPECT_TRUE(LandingHoldsTheSource());
  // The bytes count where they went (ferryctl stats), and the legs say which rail.
  EXPECT_EQ(r.ops(0).provider(), "tcp");
  EXPECT_THAT(LocalRails(r), Contains("tcp"));
  EXPECT_GE(verbs_.stats().failed_completions, 1u);
  EXPECT_EQ(verbs_.stats().bytes_written, 0u);
  EXPECT_EQ(tcp_.stats().bytes_written, kLength);
  // The ledger keeps the root cause and where its slices went, and pauses the rail.
  const RailPeerCounters verbs = Ledger("verbs");
  EXPECT_EQ(verbs.state, "paused");
  EXPECT_THAT(verbs.root_cause, HasSubstr("transport retry counter exceeded"));
  EXPECT_EQ(verbs.fallback, "tcp->tcp");
  EXPECT_GE(verbs.retries, 1u);
  // While it is paused, the next op goes to tcp at once: not one slice tries verbs first.
  const uint64_t verbs_posts = verbs_.stats().posts;
  std::fill(landing_.begin(), landing_.end(), 0);
  const ferry::v1::TransferResult again = Write();
  ASSERT_EQ(again.state(), ferry::v1::SUCCEEDED) << again.ShortDebugString();
  EXPECT_TRUE(LandingHoldsTheSource());
  EXPECT_EQ(again.ops(0).provider(), "tcp");
  EXPECT_EQ(verbs_.stats().posts, verbs_posts);
}

TEST_F(ProviderTakeoverTest, ARailThatCannotConnectHandsItsOpsToTheNextProvider) {
  Start();
  // rxe's INIT->RTR timing out (make test-rdma): the connect itself fails, every time.
  verbs_.FailNextConnects(
      1000, absl::DeadlineExceededError("ibv_modify_qp(QP 0x13, INIT->RTR): Connection timed out"));
  const ferry::v1::TransferResult r = Write();
  ASSERT_EQ(r.state(), ferry::v1::SUCCEEDED) << r.ShortDebugString();
  EXPECT_TRUE(LandingHoldsTheSource());
  EXPECT_EQ(r.ops(0).provider(), "tcp");
  EXPECT_EQ(verbs_.stats().posts, 0u);
  EXPECT_EQ(tcp_.stats().bytes_written, kLength);
  const RailPeerCounters verbs = Ledger("verbs");
  EXPECT_EQ(verbs.state, "paused");
  EXPECT_THAT(verbs.root_cause, HasSubstr("INIT->RTR"));
  EXPECT_EQ(verbs.fallback, "tcp->tcp");
}

TEST_F(ProviderTakeoverTest, AnOpFailsOnlyWhenNoRouteIsLeft) {
  Start();
  verbs_.FailNextOps(1000, kRetryExceeded);
  tcp_.FailNextOps(1000, absl::UnavailableError("tcp: connection reset by peer"));
  const ferry::v1::TransferResult r = Write();
  ASSERT_EQ(r.state(), ferry::v1::FAILED) << r.ShortDebugString();
  EXPECT_EQ(r.ops(0).code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.ops(0).message(), HasSubstr("no other route to node-b left"));
  // Both providers were tried before the op gave up.
  EXPECT_GE(verbs_.stats().failed_completions, 1u);
  EXPECT_GE(tcp_.stats().failed_completions, 1u);
}

TEST_F(ProviderTakeoverTest, FallbackFailKeepsTheOpOffTheNextProvider) {
  config::Policy policy;
  policy.fallback = config::Fallback::kFail;
  Start(policy);
  verbs_.FailNextOps(1000, kRetryExceeded);
  const ferry::v1::TransferResult r = Write();
  ASSERT_EQ(r.state(), ferry::v1::FAILED) << r.ShortDebugString();
  EXPECT_EQ(r.ops(0).code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(r.ops(0).message(), HasSubstr("transport retry counter exceeded"));
  EXPECT_EQ(tcp_.stats().posts, 0u) << "fallback: fail, yet tcp carried slices";
}

}  // namespace
}  // namespace ferry::server
