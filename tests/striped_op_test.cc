// Rails in the engine, unit by unit: rail pairing and the staged route (route_choice.h), the
// ledger's pauses and back-off (rail_ledger.h), and a striped op's slices over lanes with
// retry on another route (striped_op.h), against endpoints the test completes by hand.

#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/fair_queue.h"
#include "server/engine/rail_ledger.h"
#include "server/engine/route_choice.h"
#include "server/engine/striped_op.h"
#include "spdlog/sinks/ostream_sink.h"
#include "spdlog/spdlog.h"
#include "tests/fakes/held_endpoint.h"

namespace ferry::server {
namespace {

using fake::HeldEndpoint;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

fabric::RailId Tcp(const std::string& nic) { return {"tcp", nic}; }

std::vector<std::string> Names(const std::vector<Route>& routes) {
  std::vector<std::string> out;
  for (const Route& r : routes) out.push_back(r.ToString());
  return out;
}

TEST(PairRailsTest, NicIPairsWithThePeersNicIElseByPosition) {
  EXPECT_THAT(Names(PairRails({Tcp("mlx5_0"), Tcp("mlx5_1")}, {Tcp("mlx5_1"), Tcp("mlx5_0")})),
              ElementsAre("tcp:mlx5_0->tcp:mlx5_0", "tcp:mlx5_1->tcp:mlx5_1"));
  // A GPU's one NIC to a peer host buffer on four: its namesake.
  EXPECT_THAT(Names(PairRails({Tcp("mlx5_2")},
                              {Tcp("mlx5_0"), Tcp("mlx5_1"), Tcp("mlx5_2"), Tcp("mlx5_3")})),
              ElementsAre("tcp:mlx5_2->tcp:mlx5_2"));
  // The peer took mlx5_1 down: our mlx5_1 goes to the rail at its position, modulo.
  EXPECT_THAT(Names(PairRails({Tcp("mlx5_0"), Tcp("mlx5_1"), Tcp("mlx5_2")},
                              {Tcp("mlx5_0"), Tcp("mlx5_2")})),
              ElementsAre("tcp:mlx5_0->tcp:mlx5_0", "tcp:mlx5_1->tcp:mlx5_2",
                          "tcp:mlx5_2->tcp:mlx5_2"));
  EXPECT_THAT(PairRails({Tcp("mlx5_0")}, {}), IsEmpty());
  EXPECT_THAT(PairRails({}, {Tcp("mlx5_0")}), IsEmpty());
}

TEST(StagedRouteTest, LeavesFromThePlannedNicToThePeersNamedNic) {
  ProviderRails rails{"tcp", {Tcp("mlx5_0"), Tcp("mlx5_1")}, {Tcp("mlx5_0"), Tcp("mlx5_1")}};
  EXPECT_EQ(StagedRoute(rails, {}, "mlx5_1", "mlx5_0")->ToString(), "tcp:mlx5_1->tcp:mlx5_0");
  // No NIC named: our first, paired.
  EXPECT_EQ(StagedRoute(rails, {}, "", "")->ToString(), "tcp:mlx5_0->tcp:mlx5_0");
  // Our side direct: only a rail that holds the buffer.
  EXPECT_EQ(StagedRoute(rails, {Tcp("mlx5_1")}, "mlx5_0", "")->ToString(),
            "tcp:mlx5_1->tcp:mlx5_1");
  EXPECT_FALSE(StagedRoute(rails, {Tcp("mlx5_7")}, "", "").has_value());
  EXPECT_FALSE(StagedRoute({"tcp", {Tcp("mlx5_0")}, {}}, {}, "", "").has_value());
}

// A buffer registered with `rails` (nothing behind the regions: only which rails hold it).
class NoMemory : public BufferMemory {
 public:
  char* data() const override { return nullptr; }
  uint64_t size() const override { return 1 << 20; }
  std::string device() const override { return "host"; }
  int gpu() const override { return -1; }
  std::string backend() const override { return "host"; }
  absl::StatusOr<BufferMapping> mapping() const override {
    return absl::UnimplementedError("no memory");
  }
};
class NoRegion : public fabric::MemoryRegion {
 public:
  void* data() const override { return nullptr; }
  uint64_t length() const override { return 1 << 20; }
  uint64_t remote_address() const override { return 0; }
  uint32_t key() const override { return 1; }
  std::string registration() const override { return "none"; }
};
Buffer On(const std::vector<fabric::RailId>& rails) {
  BufferRegistrations regs;
  for (const auto& r : rails) regs.regions.emplace_back(r, std::make_unique<NoRegion>());
  return Buffer(1, "b", std::make_unique<NoMemory>(), std::move(regs), {});
}
RemoteBuffer RemoteOn(const std::vector<fabric::RailId>& rails) {
  RemoteBuffer b;
  b.node = "node-b";
  for (const auto& r : rails) b.keys.push_back({r, {0, 1}});
  return b;
}
fabric::RailId Verbs(const std::string& nic) { return {"verbs", nic}; }

TEST(DirectRoutesTest, PausedNicsYieldToTheNextProviderWhichIsAlsoTheReserve) {
  const std::vector<fabric::RailId> all = {Verbs("mlx5_0"), Verbs("mlx5_1"), {"tcp", ""}};
  Buffer local = On(all);
  RemoteBuffer remote = RemoteOn(all);
  PeerRails rails{7, {{"verbs", {Verbs("mlx5_0"), Verbs("mlx5_1")}, {Verbs("mlx5_0"),
                                                                      Verbs("mlx5_1")}},
                      {"tcp", {{"tcp", ""}}, {{"tcp", ""}}}}};
  RailLedger ledger;
  const absl::Time now = absl::Now();
  RouteChoice healthy = DirectRoutes(local, remote, rails, ledger, now);
  EXPECT_EQ(healthy.provider, "verbs");
  EXPECT_THAT(Names(healthy.routes),
              ElementsAre("verbs:mlx5_0->verbs:mlx5_0", "verbs:mlx5_1->verbs:mlx5_1"));
  EXPECT_EQ(healthy.reserve_provider, "tcp");
  EXPECT_THAT(Names(healthy.reserve), ElementsAre("tcp->tcp"));

  ledger.Failed(Verbs("mlx5_0"), "node-b", absl::UnavailableError("x"), true, now);
  RouteChoice one = DirectRoutes(local, remote, rails, ledger, now);
  EXPECT_THAT(Names(one.routes), ElementsAre("verbs:mlx5_1->verbs:mlx5_1"));

  ledger.Failed(Verbs("mlx5_1"), "node-b", absl::UnavailableError("x"), true, now);
  RouteChoice none = DirectRoutes(local, remote, rails, ledger, now);
  EXPECT_EQ(none.provider, "tcp");  // no RDMA NIC left: tcp carries it
  EXPECT_THAT(Names(none.routes), ElementsAre("tcp->tcp"));
  EXPECT_FALSE(none.probing);

  ledger.Failed({"tcp", ""}, "node-b", absl::UnavailableError("x"), true, now);
  RouteChoice probe = DirectRoutes(local, remote, rails, ledger, now);
  EXPECT_EQ(probe.provider, "verbs");  // everything paused: probe the preferred one
  EXPECT_TRUE(probe.probing);
  EXPECT_EQ(probe.routes.size(), 2u);

  // Memory the peer registered on mlx5_1 only (its GPU's NIC): only that pair.
  RouteChoice gpu =
      DirectRoutes(local, RemoteOn({Verbs("mlx5_1")}), rails, RailLedger(), now);
  EXPECT_THAT(Names(gpu.routes),
              ElementsAre("verbs:mlx5_0->verbs:mlx5_1", "verbs:mlx5_1->verbs:mlx5_1"));
}

TEST(RailLedgerTest, AFailurePausesOnlyThatRailToThatPeerAndBackOffGrowsOnFailedProbes) {
  RailLedger ledger(absl::Seconds(1), absl::Seconds(4));
  const absl::Time t0 = absl::Now();
  const absl::Status gone = absl::UnavailableError("connection reset");
  ledger.Failed(Tcp("mlx5_1"), "node-b", gone, true, t0);
  EXPECT_FALSE(ledger.Usable(Tcp("mlx5_1"), "node-b", t0));
  EXPECT_TRUE(ledger.Usable(Tcp("mlx5_1"), "node-c", t0));  // another peer
  EXPECT_TRUE(ledger.Usable(Tcp("mlx5_0"), "node-b", t0));  // another rail
  // The rest of the slices in flight fail too: still the one pause.
  ledger.Failed(Tcp("mlx5_1"), "node-b", gone, true, t0 + absl::Milliseconds(10));
  EXPECT_TRUE(ledger.Usable(Tcp("mlx5_1"), "node-b", t0 + absl::Seconds(1)));  // probe
  auto snap = ledger.Snapshot(t0 + absl::Seconds(1));
  ASSERT_THAT(snap, SizeIs(1));
  EXPECT_EQ(snap[0].state, "probing");
  EXPECT_EQ(snap[0].errors, 2u);
  EXPECT_EQ(snap[0].retries, 2u);
  EXPECT_EQ(snap[0].last_error, "connection reset");
  // The probe fails: twice as long, then four times, capped at 4 s.
  ledger.Failed(Tcp("mlx5_1"), "node-b", gone, false, t0 + absl::Seconds(1));
  EXPECT_FALSE(ledger.Usable(Tcp("mlx5_1"), "node-b", t0 + absl::Milliseconds(2900)));
  EXPECT_TRUE(ledger.Usable(Tcp("mlx5_1"), "node-b", t0 + absl::Seconds(3)));
  ledger.Failed(Tcp("mlx5_1"), "node-b", gone, false, t0 + absl::Seconds(3));
  EXPECT_FALSE(ledger.Usable(Tcp("mlx5_1"), "node-b", t0 + absl::Milliseconds(6900)));
  ledger.Failed(Tcp("mlx5_1"), "node-b", gone, false, t0 + absl::Seconds(7));
  EXPECT_TRUE(ledger.Usable(Tcp("mlx5_1"), "node-b", t0 + absl::Seconds(11)));
  // A slice that goes through makes it healthy, and the next failure pauses 1 s again.
  ledger.Carried(Tcp("mlx5_1"), "node-b", 4096, t0 + absl::Seconds(11));
  EXPECT_EQ(ledger.Snapshot(t0 + absl::Seconds(11))[0].state, "ok");
  ledger.Failed(Tcp("mlx5_1"), "node-b", gone, true, t0 + absl::Seconds(12));
  EXPECT_TRUE(ledger.Usable(Tcp("mlx5_1"), "node-b", t0 + absl::Seconds(13)));
}

// Everything spdlog's default logger writes while it lives, one string per line.
class LogLines {
 public:
  LogLines() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    previous_ = spdlog::default_logger();
    auto logger = std::make_shared<spdlog::logger>("test", sink_);
    logger->set_level(spdlog::level::info);
    sink_->set_pattern("%l %v");
    spdlog::set_default_logger(logger);
  }
  ~LogLines() { spdlog::set_default_logger(previous_); }
  std::vector<std::string> Lines() const {
    return absl::StrSplit(out_.str(), '\n', absl::SkipEmpty());
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> previous_;
};

TEST(RailLedgerTest, ARunOfFailuresKeepsItsRootCauseAndWarnsOnceWithWhereTheSlicesGo) {
  // make test-rdma's cable pull: 214 retries, the nics view showed the last flush, and the
  // log said nothing (issue 43 items 4 and 6).
  LogLines log;
  RailLedger ledger(absl::Seconds(1), absl::Seconds(8));
  const absl::Time t0 = absl::Now();
  const fabric::RailId rxe{"verbs", "rxe0"};
  ledger.Failed(rxe, "node-b", absl::UnavailableError("transport retry counter exceeded"), true,
                t0, "tcp->tcp");
  for (int i = 1; i <= 5; ++i) {
    ledger.Failed(rxe, "node-b", absl::UnavailableError("Work Request Flushed Error"), true,
                  t0 + absl::Milliseconds(i), "tcp->tcp");
  }
  // Probes that fail: the pause grows, 2 s then 4 s.
  ledger.Failed(rxe, "node-b", absl::UnavailableError("INIT->RTR: Connection timed out"), false,
                t0 + absl::Seconds(1));
  ledger.Failed(rxe, "node-b", absl::UnavailableError("INIT->RTR: Connection timed out"), false,
                t0 + absl::Seconds(3));
  std::vector<RailPeerCounters> snap = ledger.Snapshot(t0 + absl::Seconds(3));
  ASSERT_THAT(snap, SizeIs(1));
  EXPECT_EQ(snap[0].state, "paused");
  EXPECT_EQ(snap[0].pause, absl::Seconds(4));
  EXPECT_EQ(snap[0].root_cause, "transport retry counter exceeded");
  EXPECT_EQ(snap[0].last_error, "INIT->RTR: Connection timed out");
  EXPECT_EQ(snap[0].fallback, "tcp->tcp");
  EXPECT_EQ(snap[0].errors, 8u);
  std::vector<std::string> warnings;
  for (const std::string& line : log.Lines()) {
    if (absl::StartsWith(line, "warning")) warnings.push_back(line);
  }
  ASSERT_THAT(warnings, SizeIs(1));
  EXPECT_EQ(warnings[0],
            "warning rail verbs:rxe0 to node-b paused 1s: transport retry counter exceeded; its "
            "slices go to tcp->tcp");
  // Carrying again after the pause ends the run: said once, and the next failure is a new
  // root cause.
  ledger.Carried(rxe, "node-b", 4096, t0 + absl::Seconds(7));
  EXPECT_THAT(log.Lines().back(),
              HasSubstr("carries again after 8 error(s) (the first: transport retry counter"));
  ledger.Failed(rxe, "node-b", absl::UnavailableError("port down"), false,
                t0 + absl::Seconds(10));
  snap = ledger.Snapshot(t0 + absl::Seconds(10));
  EXPECT_EQ(snap[0].root_cause, "port down");
  EXPECT_EQ(snap[0].fallback, "");
  EXPECT_EQ(snap[0].pause, absl::Seconds(1));
  // A fallback learnt after the run's warning is said once more.
  ledger.Failed(rxe, "node-b", absl::UnavailableError("flushed"), true,
                t0 + absl::Seconds(10) + absl::Milliseconds(1), "tcp->tcp");
  ledger.Failed(rxe, "node-b", absl::UnavailableError("flushed"), true,
                t0 + absl::Seconds(10) + absl::Milliseconds(2), "tcp->tcp");
  EXPECT_EQ(log.Lines().back(),
            "warning rail verbs:rxe0 to node-b (port down); its slices go to tcp->tcp");
  EXPECT_THAT(log.Lines(), SizeIs(6));
}

TEST(RailLedgerTest, ASliceThatWasOnItsWayWhenTheRailBrokeEndsNoRun) {
  // make test-rdma's rdma link delete: a completion already on its way succeeded 14 ms after
  // the removal failed the first slice, the rail "carried again", and the next slice's
  // failure warned a second time about the same removal.
  LogLines log;
  RailLedger ledger(absl::Seconds(1), absl::Seconds(8));
  const fabric::RailId rxe{"verbs", "rxe0"};
  const absl::Time t0 = absl::Now();
  const absl::Status removed = absl::UnavailableError("verbs: rxe0 was removed");
  ledger.Failed(rxe, "node-b", removed, true, t0, "tcp->tcp");
  ledger.Carried(rxe, "node-b", 4096, t0 + absl::Milliseconds(14));
  ledger.Failed(rxe, "node-b", removed, true, t0 + absl::Milliseconds(41), "tcp->tcp");
  std::vector<RailPeerCounters> snap = ledger.Snapshot(t0 + absl::Milliseconds(41));
  ASSERT_THAT(snap, SizeIs(1));
  EXPECT_EQ(snap[0].state, "paused");
  EXPECT_EQ(snap[0].bytes, 4096u) << "the slice's bytes count all the same";
  ASSERT_THAT(log.Lines(), SizeIs(1));
  EXPECT_THAT(log.Lines()[0], HasSubstr("warning rail verbs:rxe0 to node-b paused 1s"));
  // After the pause, a slice that goes through is the rail carrying again.
  ledger.Carried(rxe, "node-b", 4096, t0 + absl::Seconds(1));
  EXPECT_EQ(ledger.Snapshot(t0 + absl::Seconds(1))[0].state, "ok");
  EXPECT_THAT(log.Lines().back(), HasSubstr("carries again after 2 error(s)"));
}

TEST(RailLedgerTest, ARailThatCouldNotConnectNamesWhereItsSlicesWent) {
  LogLines log;
  RailLedger ledger(absl::Seconds(1), absl::Seconds(8));
  const fabric::RailId rxe{"verbs", "rxe0"};
  const absl::Time t0 = absl::Now();
  ledger.Failed(rxe, "node-b",
                absl::UnavailableError("ibv_modify_qp(QP 0x13, INIT->RTR): Connection timed out"),
                false, t0);
  ledger.FellBack(rxe, "node-b", "tcp->tcp");
  ledger.FellBack(rxe, "node-b", "tcp->tcp");  // the next op of the batch: said once
  EXPECT_EQ(ledger.Snapshot(t0)[0].fallback, "tcp->tcp");
  ASSERT_THAT(log.Lines(), SizeIs(2));
  EXPECT_EQ(log.Lines()[1],
            "warning rail verbs:rxe0 to node-b (ibv_modify_qp(QP 0x13, INIT->RTR): Connection "
            "timed out); its slices go to tcp->tcp");
}

TEST(CarriedByTest, BytesCountUnderTheProvidersWhoseRailsCarriedThem) {
  // make test-rdma's cable pull: tcp carried the put, `ferryctl stats` said verbs.
  auto names = [](std::vector<std::string> v) {
    return std::make_shared<const std::vector<std::string>>(std::move(v));
  };
  StripedOutcome none;
  EXPECT_EQ(CarriedBy(none, "verbs"), "verbs");
  StripedOutcome tcp{absl::OkStatus(), names({"tcp"}), names({"tcp"}), {}};
  EXPECT_EQ(CarriedBy(tcp, "verbs"), "tcp");
  StripedOutcome rails{absl::OkStatus(), names({"verbs:mlx5_0", "verbs:mlx5_1"}), nullptr, {}};
  EXPECT_EQ(CarriedBy(rails, "verbs"), "verbs");
  StripedOutcome both{absl::OkStatus(), names({"tcp:mlx5_1", "verbs:mlx5_0"}), nullptr, {}};
  EXPECT_EQ(CarriedBy(both, "verbs"), "tcp+verbs");
}

// Two routes, one lane each, and an op of four 1 MiB slices.
class StripedOpTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kSlice = 1 << 20;

  void SetUp() override {
    for (int i = 0; i < 2; ++i) {
      auto ep = std::make_shared<HeldEndpoint>();
      endpoints_.push_back(ep);
      Route route{Tcp(absl::StrCat("mlx5_", i)), Tcp(absl::StrCat("mlx5_", i))};
      lanes_.push_back({ep, route, nullptr, {0x1000u * (i + 1), 7u}});
    }
  }

  std::shared_ptr<StripedOp> Start(uint64_t length) {
    StripedOp::Spec spec{false, 0, 0, length, kSlice, "node-b", 1, 0};
    Wanted wanted = MakeWanted([this] { return wanted_; });
    auto op = std::make_shared<StripedOp>(spec, std::make_shared<LaneSet>(lanes_, reserve_),
                                          ledger_, queue_, wanted,
                                          [this](StripedOutcome o) { outcome_ = std::move(o); });
    queue_->Enqueue(1, op->Slices(), wanted);
    return op;
  }

  std::vector<std::shared_ptr<HeldEndpoint>> endpoints_;
  std::vector<Lane> lanes_;
  std::vector<Lane> reserve_;
  std::shared_ptr<RailLedger> ledger_ =
      std::make_shared<RailLedger>(absl::Seconds(1), absl::Seconds(30));
  std::shared_ptr<FairQueue> queue_ = std::make_shared<FairQueue>(64 << 20);
  bool wanted_ = true;
  std::optional<StripedOutcome> outcome_;
};

TEST_F(StripedOpTest, SlicesAlternateBetweenTheRoutesAndTheOutcomeNamesThem) {
  Start(4 * kSlice);
  ASSERT_EQ(endpoints_[0]->posted(), 2u);
  ASSERT_EQ(endpoints_[1]->posted(), 2u);
  // Each lane's base address plus the slice's offset.
  EXPECT_EQ(endpoints_[0]->address(0), 0x1000u);
  EXPECT_EQ(endpoints_[1]->address(0), 0x2000u + kSlice);
  EXPECT_EQ(endpoints_[0]->address(1), 0x1000u + 2 * kSlice);
  while (endpoints_[0]->CompleteOne() || endpoints_[1]->CompleteOne()) {
  }
  ASSERT_TRUE(outcome_.has_value());
  EXPECT_TRUE(outcome_->status.ok()) << outcome_->status;
  ASSERT_NE(outcome_->ours, nullptr);
  EXPECT_THAT(*outcome_->ours, ElementsAre("tcp:mlx5_0", "tcp:mlx5_1"));
  ASSERT_NE(outcome_->theirs, nullptr);
  EXPECT_THAT(*outcome_->theirs, ElementsAre("tcp:mlx5_0", "tcp:mlx5_1"));
  EXPECT_THAT(outcome_->retries, IsEmpty());
  auto snap = ledger_->Snapshot(absl::Now());
  ASSERT_THAT(snap, SizeIs(2));
  EXPECT_EQ(snap[0].bytes, 2 * kSlice);
  EXPECT_EQ(snap[1].bytes, 2 * kSlice);
}

TEST_F(StripedOpTest, ATransportErrorMovesTheSliceToTheOtherRouteAndPausesItsRail) {
  Start(4 * kSlice);
  // mlx5_1's connection breaks under its two slices.
  endpoints_[1]->Refuse();
  ASSERT_TRUE(endpoints_[1]->CompleteOne(absl::UnavailableError("connection reset by peer")));
  ASSERT_TRUE(endpoints_[1]->CompleteOne(absl::UnavailableError("connection reset by peer")));
  EXPECT_EQ(endpoints_[0]->posted(), 4u) << "both slices should have moved to mlx5_0";
  EXPECT_FALSE(outcome_.has_value());
  while (endpoints_[0]->CompleteOne()) {
  }
  ASSERT_TRUE(outcome_.has_value());
  EXPECT_TRUE(outcome_->status.ok()) << outcome_->status;
  ASSERT_NE(outcome_->ours, nullptr);
  EXPECT_THAT(*outcome_->ours, ElementsAre("tcp:mlx5_0"));
  ASSERT_THAT(outcome_->retries, SizeIs(2));
  EXPECT_THAT(outcome_->retries[0], HasSubstr("1 MiB at +1048576 on tcp:mlx5_1->tcp:mlx5_1 "
                                              "failed (connection reset by peer); carried by "
                                              "tcp:mlx5_0->tcp:mlx5_0"));
  EXPECT_FALSE(ledger_->Usable(Tcp("mlx5_1"), "node-b", absl::Now()));
  for (const auto& c : ledger_->Snapshot(absl::Now())) {
    if (c.rail == Tcp("mlx5_1")) {
      EXPECT_EQ(c.state, "paused");
      EXPECT_EQ(c.errors, 2u);
      EXPECT_EQ(c.retries, 2u);
    } else {
      EXPECT_EQ(c.bytes, 4 * kSlice);
    }
  }
}

TEST_F(StripedOpTest, WhenEveryRouteFailedTheOpFailsUnavailableNamingTheLastRoute) {
  Start(2 * kSlice);
  endpoints_[0]->Refuse();
  endpoints_[1]->Refuse();
  ASSERT_TRUE(endpoints_[0]->CompleteOne(absl::UnavailableError("reset")));
  ASSERT_TRUE(endpoints_[1]->CompleteOne(absl::UnavailableError("reset")));
  ASSERT_TRUE(outcome_.has_value());
  EXPECT_EQ(outcome_->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(outcome_->status.message(), HasSubstr("no other route to node-b left"));
}

TEST_F(StripedOpTest, WhenEveryNicFailedTheReserveProviderCarriesTheRest) {
  auto tcp = std::make_shared<HeldEndpoint>();
  reserve_.push_back({tcp, {{"tcp", ""}, {"tcp", ""}}, nullptr, {0x9000u, 9u}});
  for (Lane& l : lanes_) l.route = {{"verbs", l.route.ours.nic}, {"verbs", l.route.theirs.nic}};
  Start(2 * kSlice);
  EXPECT_EQ(tcp->posted(), 0u) << "the reserve took a slice while the NICs were fine";
  endpoints_[0]->Refuse();
  endpoints_[1]->Refuse();
  ASSERT_TRUE(endpoints_[0]->CompleteOne(absl::UnavailableError("port down")));
  ASSERT_TRUE(endpoints_[1]->CompleteOne(absl::UnavailableError("port down")));
  ASSERT_EQ(tcp->posted(), 2u);
  EXPECT_EQ(tcp->address(0), 0x9000u);
  while (tcp->CompleteOne()) {
  }
  ASSERT_TRUE(outcome_.has_value());
  EXPECT_TRUE(outcome_->status.ok()) << outcome_->status;
  ASSERT_NE(outcome_->ours, nullptr);
  EXPECT_THAT(*outcome_->ours, ElementsAre("tcp"));
  ASSERT_THAT(outcome_->retries, SizeIs(2));
  EXPECT_THAT(outcome_->retries[1], HasSubstr("on verbs:mlx5_1->verbs:mlx5_1 failed (port down); "
                                              "carried by tcp->tcp"));
  // The ledger (ferryctl nics, the warning) says where the failed NIC's slices went.
  for (const RailPeerCounters& c : ledger_->Snapshot(absl::Now())) {
    if (c.rail.provider != "verbs") continue;
    EXPECT_EQ(c.root_cause, "port down") << c.rail.ToString();
    EXPECT_EQ(c.fallback, "tcp->tcp") << c.rail.ToString();
  }
}

TEST_F(StripedOpTest, ARefusedKeyIsNotRetriedElsewhere) {
  Start(2 * kSlice);
  ASSERT_TRUE(endpoints_[0]->CompleteOne(absl::PermissionDeniedError("bad key")));
  ASSERT_TRUE(endpoints_[1]->CompleteOne());
  ASSERT_TRUE(outcome_.has_value());
  EXPECT_EQ(outcome_->status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(outcome_->retries, IsEmpty());
  EXPECT_EQ(endpoints_[1]->posted(), 0u);
  EXPECT_TRUE(ledger_->Usable(Tcp("mlx5_0"), "node-b", absl::Now()));  // not the wire's fault
}

TEST_F(StripedOpTest, ARefusalExplainsTheBrokenConnectionsItCaused) {
  // tcp and verbs end a connection after a refusal: the slice posted beside the refused one
  // fails UNAVAILABLE, maybe first. The op reports the refusal.
  Start(2 * kSlice);
  endpoints_[0]->Refuse();
  endpoints_[1]->Refuse();
  ASSERT_TRUE(endpoints_[0]->CompleteOne(absl::UnavailableError("connection ended")));
  ASSERT_TRUE(endpoints_[1]->CompleteOne(absl::PermissionDeniedError("remote access refused")));
  ASSERT_TRUE(outcome_.has_value());
  EXPECT_EQ(outcome_->status.code(), absl::StatusCode::kPermissionDenied) << outcome_->status;
}

TEST_F(StripedOpTest, AnEndedTransferRetriesNothing) {
  Start(2 * kSlice);
  wanted_ = false;
  ASSERT_TRUE(endpoints_[0]->CompleteOne(absl::UnavailableError("reset")));
  ASSERT_TRUE(endpoints_[1]->CompleteOne());
  ASSERT_TRUE(outcome_.has_value());
  EXPECT_EQ(outcome_->status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(endpoints_[1]->posted(), 0u);
}

}  // namespace
}  // namespace ferry::server
