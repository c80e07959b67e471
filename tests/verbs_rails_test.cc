// Rails over the software verbs model (DESIGN.md, "Rails"): four HCAs a node (mlx5_0..3 on
// node A, mlx5_4..7 on node B, all in one model), one VerbsFabric each, paired i <-> i by
// PairRails, two RC QPs a pair: eight lanes. One 64 MiB op is cut into 1 MiB slices and
// spread over them by StripedOp through the peer's FairQueue, as the engine runs it. What
// each device carried is read from two places that must agree: the HCAs' own port counters
// (the model's port_xmit_data / port_rcv_data) and the RailLedger.
//
// A link that fails mid-transfer (the model takes a port down once it has moved 4 MiB, with
// the rest of its work requests posted) is ours in one run, where the provider hears
// IBV_EVENT_PORT_ERR (unless its QPs' transport retries run out first), and the peer's in
// the other, where our QPs only learn it from transport retries running out
// (IBV_WC_RETRY_EXC_ERR, then flushes). Either way the op succeeds, its
// slices move to the other devices, the rail is paused, and once the port is back and the
// pause is over the rail carries its share again.

#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/engine/fair_queue.h"
#include "server/engine/rail_ledger.h"
#include "server/engine/route_choice.h"
#include "server/engine/striped_op.h"
#include "tests/verbs_model/verbs_model.h"
#include "transport/verbs/verbs_endpoint.h"
#include "transport/verbs/verbs_fabric.h"

namespace ferry::server {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using verbs::VerbsFabric;
using verbs::model::VerbsModel;

constexpr int kDevices = 4;
constexpr uint32_t kQpsPerPeer = 2;
constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kOpBytes = 64 * kMiB;
constexpr uint64_t kSliceBytes = kMiB;
// The engine's window for this peer: peer_window_bytes (16 MiB) per route
// (TransferEngine::QueueFor), so every slice of the op is posted at once, as in ferryd.
constexpr uint64_t kWindowBytes = 16 * kMiB * kDevices;
// Where the failing link goes down: a quarter of the way through its device's share.
constexpr uint64_t kFailAfter = 4 * kMiB;
constexpr int kFailing = 3;
const char* const kPeer = "node-b";

std::string Ours(int i) { return absl::StrCat("mlx5_", i); }
std::string Theirs(int i) { return absl::StrCat("mlx5_", kDevices + i); }
std::string MiB(uint64_t bytes) { return absl::StrCat(static_cast<double>(bytes) / kMiB, " MiB"); }

bool Eventually(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// A pattern that differs per byte position and per `seed`, so a slice landing at the wrong
// offset, twice, or not at all shows.
void Fill(std::vector<char>& mem, uint32_t seed) {
  uint32_t x = seed * 2654435761u + 1;
  for (char& c : mem) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    c = static_cast<char>(x);
  }
}

// "" when equal, else where they first differ.
std::string Compare(const std::vector<char>& got, const std::vector<char>& want) {
  if (got.size() != want.size()) return absl::StrCat("sizes ", got.size(), " != ", want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) return absl::StrCat("first difference at byte ", i);
  }
  return "";
}

// A buffer registered with every fabric of one node.
struct Registered {
  std::vector<char> mem;
  std::map<fabric::RailId, std::unique_ptr<fabric::MemoryRegion>> regions;
};

// What each of our devices carried for one op: the ledger's count for its rail, the model's
// port counters of our device and of the peer's device it is paired with.
struct Carried {
  uint64_t ledger = 0;
  uint64_t ours = 0;    // WRITE: our port_xmit_data; READ: our port_rcv_data
  uint64_t theirs = 0;  // WRITE: their port_rcv_data; READ: their port_xmit_data
};

// Whose port the failing link takes down: our device's or the peer's it is paired with.
enum class Side { kOurs, kTheirs };
void PrintTo(Side side, std::ostream* os) { *os << (side == Side::kOurs ? "ours" : "theirs"); }

class VerbsRailsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<verbs::model::DeviceConfig> devices;
    for (int i = 0; i < kDevices; ++i) {
      devices.push_back(verbs::model::InfinibandDevice(Ours(i), 0x11 + i));
    }
    for (int i = 0; i < kDevices; ++i) {
      devices.push_back(verbs::model::InfinibandDevice(Theirs(i), 0x21 + i));
    }
    model_ = std::make_shared<VerbsModel>(std::move(devices));
    for (int i = 0; i < kDevices; ++i) {
      for (auto [name, node] : {std::pair{Ours(i), &ours_}, std::pair{Theirs(i), &theirs_}}) {
        verbs::VerbsOptions options;
        options.device = name;
        options.qps_per_peer = kQpsPerPeer;
        // A lost ACK is retried once after 4.096 us x 2^8 = 1 ms: a dead link fails its
        // work requests within 2 ms (ibv_modify_qp(3): IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT).
        options.timeout = 8;
        options.retry_cnt = 1;
        auto f = VerbsFabric::Create(options, model_);
        ASSERT_TRUE(f.ok()) << f.status();
        node->push_back(std::move(*f));
      }
    }
    std::vector<fabric::RailId> our_rails, their_rails;
    for (auto& f : ours_) our_rails.push_back(f->rail());
    for (auto& f : theirs_) their_rails.push_back(f->rail());
    routes_ = PairRails(our_rails, their_rails);
    ASSERT_EQ(routes_.size(), static_cast<size_t>(kDevices));
    for (int i = 0; i < kDevices; ++i) {
      ASSERT_EQ(routes_[i].theirs, their_rails[i]) << "rails pair i <-> i";
    }
    src_ = Register(ours_, fabric::kLocal);
    back_ = Register(ours_, fabric::kLocal);
    dst_ = Register(theirs_, fabric::kRemoteWrite | fabric::kRemoteRead);
    Fill(src_.mem, 1);
    // Lanes as the engine orders them: route 0 lane 0, route 1 lane 0, ..., route 0 lane 1,
    // so consecutive slices leave through different devices.
    endpoints_.resize(kQpsPerPeer * kDevices);
    for (int i = 0; i < kDevices; ++i) {
      for (uint32_t q = 0; q < kQpsPerPeer; ++q) ASSERT_NO_FATAL_FAILURE(Connect(i, q));
    }
  }

  void TearDown() override {
    for (auto& ep : endpoints_) {
      if (ep) ep->Close();
    }
    endpoints_.clear();
    // The HCA owes nothing: every work request executed or flushed, every completion polled.
    EXPECT_EQ(model_->WorkOutstanding(), 0u);
    src_.regions.clear();
    back_.regions.clear();
    dst_.regions.clear();
    ours_.clear();
    theirs_.clear();
    // Every QP, MR, CQ, PD and context released, every async event acknowledged, and no
    // destroy left waiting for one (a hang on the hardware).
    EXPECT_TRUE(Eventually([&] { return model_->LiveObjects() == 0; })) << model_->LiveObjects();
    EXPECT_EQ(model_->UnackedEvents(), 0);
    EXPECT_EQ(model_->BlockedDestroys(), 0u);
  }

  Registered Register(std::vector<std::unique_ptr<VerbsFabric>>& node, uint32_t access) {
    Registered r;
    r.mem.assign(kOpBytes, 0);
    for (auto& f : node) {
      auto region = f->Register(r.mem.data(), r.mem.size(), access);
      EXPECT_TRUE(region.ok()) << region.status();
      if (region.ok()) r.regions[f->rail()] = std::move(*region);
    }
    return r;
  }

  // A new connection for lane `qp` of route `route` (replacing a broken one).
  void Connect(int route, uint32_t qp) {
    auto& ep = endpoints_[qp * kDevices + route];
    if (ep) ep->Close();
    auto made = fabric::ConnectDirect(*ours_[route], *theirs_[route]);
    ASSERT_TRUE(made.ok()) << made.status();
    ep = std::move(*made);
  }

  std::vector<Lane> Lanes(const Registered& local) {
    std::vector<Lane> lanes;
    for (size_t k = 0; k < endpoints_.size(); ++k) {
      const Route& route = routes_[k % kDevices];
      const fabric::MemoryRegion& remote = *dst_.regions.at(route.theirs);
      lanes.push_back({endpoints_[k], route, local.regions.at(route.ours).get(),
                       {remote.remote_address(), remote.key()}});
    }
    return lanes;
  }

  // One op of the whole buffer through StripedOp and a fresh FairQueue for the peer; what
  // each device carried (ledger and port counters, as differences over the op).
  StripedOutcome Run(bool read, Registered& local, RailLedger& ledger,
                     std::vector<Carried>* carried) {
    std::vector<Carried> before = Counts(read, ledger);
    auto queue = std::make_shared<FairQueue>(kWindowBytes);
    StripedOutcome outcome;
    absl::Notification done;
    StripedOp::Spec spec{read, 0, 0, kOpBytes, kSliceBytes, kPeer, /*transfer_id=*/1, 0};
    // No `wanted`, as FairQueue::Enqueue allows: nothing cancels this op.
    auto op = std::make_shared<StripedOp>(std::move(spec),
                                          std::make_shared<LaneSet>(Lanes(local),
                                                                    std::vector<Lane>{}),
                                          // The test's ledger outlives the op it waits for.
                                          std::shared_ptr<RailLedger>(&ledger, [](auto*) {}),
                                          queue, nullptr, [&](StripedOutcome o) {
                                            outcome = std::move(o);
                                            done.Notify();
                                          });
    queue->Enqueue(1, op->Slices(), nullptr);
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(60)));
    // Every slice settled exactly once: nothing left posted or queued.
    EXPECT_EQ(queue->in_flight_bytes(), 0u);
    EXPECT_EQ(queue->queued(), 0u);
    model_->WaitIdle();
    std::vector<Carried> after = Counts(read, ledger);
    carried->assign(kDevices, {});
    for (int i = 0; i < kDevices; ++i) {
      (*carried)[i] = {after[i].ledger - before[i].ledger, after[i].ours - before[i].ours,
                       after[i].theirs - before[i].theirs};
    }
    return outcome;
  }

  std::vector<Carried> Counts(bool read, const RailLedger& ledger) {
    std::vector<Carried> out(kDevices);
    for (const RailPeerCounters& c : ledger.Snapshot(absl::Now())) {
      for (int i = 0; i < kDevices; ++i) {
        if (c.rail == routes_[i].ours && c.peer == kPeer) out[i].ledger = c.bytes;
      }
    }
    for (int i = 0; i < kDevices; ++i) {
      VerbsModel::PortCounters ours = model_->Counters(Ours(i));
      VerbsModel::PortCounters theirs = model_->Counters(Theirs(i));
      out[i].ours = read ? ours.rcv_data : ours.xmit_data;
      out[i].theirs = read ? theirs.xmit_data : theirs.rcv_data;
    }
    return out;
  }

  static RailPeerCounters LedgerOf(const RailLedger& ledger, const fabric::RailId& rail,
                                   absl::Time now) {
    for (const RailPeerCounters& c : ledger.Snapshot(now)) {
      if (c.rail == rail && c.peer == kPeer) return c;
    }
    return {};
  }

  static void Print(const std::string& what, bool read, const std::vector<Carried>& carried) {
    for (int i = 0; i < kDevices; ++i) {
      std::printf("[ rails    ] %s: %s->%s ledger %s, %s %s %s, %s %s %s\n", what.c_str(),
                  Ours(i).c_str(), Theirs(i).c_str(), MiB(carried[i].ledger).c_str(),
                  Ours(i).c_str(), read ? "port_rcv_data" : "port_xmit_data",
                  MiB(carried[i].ours).c_str(), Theirs(i).c_str(),
                  read ? "port_xmit_data" : "port_rcv_data", MiB(carried[i].theirs).c_str());
    }
  }

  // The model's port counters say what the ledger says, device by device, and every byte of
  // the op was carried once.
  static void ExpectCountersAgree(const std::vector<Carried>& carried) {
    uint64_t total = 0;
    for (int i = 0; i < kDevices; ++i) {
      EXPECT_EQ(carried[i].ours, carried[i].ledger) << Ours(i);
      EXPECT_EQ(carried[i].theirs, carried[i].ledger) << Theirs(i);
      total += carried[i].ledger;
    }
    EXPECT_EQ(total, kOpBytes);
  }

  static void ExpectEvenShares(const std::vector<Carried>& carried) {
    const double quarter = static_cast<double>(kOpBytes) / kDevices;
    for (int i = 0; i < kDevices; ++i) {
      EXPECT_NEAR(static_cast<double>(carried[i].ledger), quarter, quarter * 0.1) << Ours(i);
      EXPECT_NEAR(static_cast<double>(carried[i].ours), quarter, quarter * 0.1) << Ours(i);
    }
  }

  // Takes the failing pair's link down after kFailAfter bytes on `side`, runs a WRITE and
  // checks that it succeeded on the other devices: the common part of the failure tests.
  StripedOutcome RunWithFailingLink(Side side, RailLedger& ledger, std::vector<Carried>* carried) {
    const std::string device = side == Side::kOurs ? Ours(kFailing) : Theirs(kFailing);
    model_->SetPortDownAfter(device, 1, kFailAfter);
    StripedOutcome outcome = Run(/*read=*/false, src_, ledger, carried);
    Print(absl::StrCat("WRITE, ", device, " port down after ", MiB(kFailAfter)), false, *carried);
    EXPECT_TRUE(outcome.status.ok()) << outcome.status;
    EXPECT_EQ(Compare(dst_.mem, src_.mem), "");
    const std::string failed = routes_[kFailing].ToString();
    EXPECT_THAT(outcome.retries, Not(IsEmpty()));
    for (const std::string& r : outcome.retries) {
      EXPECT_THAT(r, HasSubstr(absl::StrCat(" on ", failed, " failed ("))) << r;
    }
    if (!outcome.retries.empty()) {
      std::printf("[ rails    ] %zu retries, the first: %s\n", outcome.retries.size(),
                  outcome.retries.front().c_str());
    }
    ExpectCountersAgree(*carried);
    // It carried what it moved before its link went, and less than every other device.
    EXPECT_EQ((*carried)[kFailing].ledger, kFailAfter);
    for (int i = 0; i < kDevices; ++i) {
      if (i == kFailing) continue;
      EXPECT_LT((*carried)[kFailing].ledger, (*carried)[i].ledger) << Ours(i);
    }
    // Its slices not yet carried were each retried once, on another device.
    const RailPeerCounters rail = LedgerOf(ledger, routes_[kFailing].ours, absl::Now());
    EXPECT_GT(rail.errors, 0u);
    EXPECT_EQ(rail.retries, rail.errors);
    EXPECT_EQ(outcome.retries.size(), rail.retries);
    EXPECT_EQ(rail.errors, (kOpBytes / kDevices - kFailAfter) / kSliceBytes);
    for (int i = 0; i < kDevices; ++i) {
      if (i == kFailing) continue;
      const RailPeerCounters other = LedgerOf(ledger, routes_[i].ours, absl::Now());
      EXPECT_EQ(other.state, "ok") << Ours(i);
      EXPECT_EQ(other.errors, 0u) << Ours(i);
    }
    uint64_t slices = 0;
    for (const RailPeerCounters& c : ledger.Snapshot(absl::Now())) slices += c.ops;
    EXPECT_EQ(slices, kOpBytes / kSliceBytes);
    if (side == Side::kOurs) {
      // Our NIC said so (IBV_EVENT_PORT_ERR): its fabric refuses new connections.
      EXPECT_TRUE(Eventually([&] { return !ours_[kFailing]->health().ok(); }));
    } else {
      // Only the peer's port went: our device is fine and only its QPs' retries ran out.
      EXPECT_TRUE(ours_[kFailing]->health().ok());
      EXPECT_TRUE(Eventually([&] { return !theirs_[kFailing]->health().ok(); }));
      // The first slice of each QP to fail ran out of transport retries; the rest flushed.
      EXPECT_THAT(outcome.retries, Contains(HasSubstr("transport retry counter exceeded")));
    }
    return outcome;
  }

  std::shared_ptr<VerbsModel> model_;
  std::vector<std::unique_ptr<VerbsFabric>> ours_, theirs_;
  std::vector<Route> routes_;
  Registered src_, back_, dst_;
  std::vector<std::shared_ptr<fabric::Endpoint>> endpoints_;
};

TEST_F(VerbsRailsTest, OneOpIsStripedOverFourDevicesAndTwoQpsEach) {
  RailLedger ledger;
  std::vector<Carried> carried;
  StripedOutcome w = Run(/*read=*/false, src_, ledger, &carried);
  Print("WRITE", false, carried);
  ASSERT_TRUE(w.status.ok()) << w.status;
  EXPECT_EQ(Compare(dst_.mem, src_.mem), "");
  EXPECT_THAT(w.retries, IsEmpty());
  ASSERT_TRUE(w.ours && w.theirs);
  EXPECT_EQ(w.ours->size(), static_cast<size_t>(kDevices));
  EXPECT_EQ(w.theirs->size(), static_cast<size_t>(kDevices));
  ExpectCountersAgree(carried);
  ExpectEvenShares(carried);
  // Eight lanes, eight QPs: each posted its eighth of the slices as one work request each.
  for (const auto& ep : endpoints_) {
    const auto& verbs_ep = dynamic_cast<const verbs::VerbsEndpoint&>(*ep);
    EXPECT_EQ(model_->SendStats(verbs_ep.qpn()).posted, kOpBytes / kSliceBytes / endpoints_.size())
        << "QP 0x" << std::hex << verbs_ep.qpn();
  }

  // Back again by READ: now the peer's ports send and ours receive.
  StripedOutcome r = Run(/*read=*/true, back_, ledger, &carried);
  Print("READ", true, carried);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(Compare(back_.mem, src_.mem), "");
  EXPECT_THAT(r.retries, IsEmpty());
  ExpectCountersAgree(carried);
  ExpectEvenShares(carried);
  for (const RailPeerCounters& c : ledger.Snapshot(absl::Now())) {
    EXPECT_EQ(c.state, "ok") << c.rail.ToString();
    EXPECT_EQ(c.errors, 0u) << c.rail.ToString();
    EXPECT_EQ(c.ops, 2 * kOpBytes / kSliceBytes / kDevices) << c.rail.ToString();
  }
}

class VerbsRailsFailoverTest : public VerbsRailsTest,
                               public ::testing::WithParamInterface<Side> {};

TEST_P(VerbsRailsFailoverTest, ALinkLostMidTransferMovesItsSlicesToTheOtherDevices) {
  // A pause longer than the test: the rail is still paused when we look.
  RailLedger ledger(absl::Seconds(60));
  std::vector<Carried> carried;
  StripedOutcome outcome = RunWithFailingLink(GetParam(), ledger, &carried);
  ASSERT_TRUE(outcome.status.ok());
  const absl::Time now = absl::Now();
  const RailPeerCounters rail = LedgerOf(ledger, routes_[kFailing].ours, now);
  EXPECT_EQ(rail.state, "paused");
  EXPECT_FALSE(ledger.Usable(routes_[kFailing].ours, kPeer, now));
  ASSERT_NE(outcome.ours, nullptr);
  EXPECT_THAT(*outcome.ours, Contains(routes_[kFailing].ours.ToString()));  // before it failed
  // The failed device's lanes are broken; the others' are not.
  for (size_t k = 0; k < endpoints_.size(); ++k) {
    EXPECT_EQ(endpoints_[k]->broken(), static_cast<int>(k % kDevices) == kFailing) << "lane " << k;
  }
}

// After the pause the rail may be probed; with its port back, a fresh connection on it
// carries its share and the ledger calls it healthy again.
TEST_P(VerbsRailsFailoverTest, ARailCarriesAgainOnceItsPortIsBackAndThePauseIsOver) {
  RailLedger ledger(absl::Milliseconds(50));
  std::vector<Carried> carried;
  ASSERT_TRUE(RunWithFailingLink(GetParam(), ledger, &carried).status.ok());
  const fabric::RailId& rail = routes_[kFailing].ours;
  RailPeerCounters paused = LedgerOf(ledger, rail, absl::Now());
  ASSERT_NE(paused.paused_until, absl::InfinitePast());
  // Paused until then (the op may have outlasted a 50 ms pause, so judged at that time).
  EXPECT_EQ(LedgerOf(ledger, rail, paused.paused_until - absl::Nanoseconds(1)).state, "paused");
  EXPECT_FALSE(ledger.Usable(rail, kPeer, paused.paused_until - absl::Nanoseconds(1)));

  VerbsFabric& down = GetParam() == Side::kOurs ? *ours_[kFailing] : *theirs_[kFailing];
  model_->SetPortState(GetParam() == Side::kOurs ? Ours(kFailing) : Theirs(kFailing), 1,
                       IBV_PORT_ACTIVE);
  ASSERT_TRUE(Eventually([&] { return down.health().ok(); })) << down.health();
  ASSERT_TRUE(Eventually([&] { return ledger.Usable(rail, kPeer, absl::Now()); }));
  EXPECT_EQ(LedgerOf(ledger, rail, absl::Now()).state, "probing");
  for (uint32_t q = 0; q < kQpsPerPeer; ++q) ASSERT_NO_FATAL_FAILURE(Connect(kFailing, q));

  Fill(src_.mem, 2);
  StripedOutcome again = Run(/*read=*/false, src_, ledger, &carried);
  Print("WRITE after recovery", false, carried);
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_EQ(Compare(dst_.mem, src_.mem), "");
  EXPECT_THAT(again.retries, IsEmpty());
  ExpectCountersAgree(carried);
  ExpectEvenShares(carried);
  const RailPeerCounters healthy = LedgerOf(ledger, rail, absl::Now());
  EXPECT_EQ(healthy.state, "ok");
  EXPECT_EQ(healthy.paused_until, absl::InfinitePast());
  EXPECT_EQ(healthy.errors, paused.errors);  // history stays
}

INSTANTIATE_TEST_SUITE_P(Sides, VerbsRailsFailoverTest,
                         ::testing::Values(Side::kOurs, Side::kTheirs),
                         [](const ::testing::TestParamInfo<Side>& info) {
                           return info.param == Side::kOurs ? "OurPortDown" : "PeersPortDown";
                         });

}  // namespace
}  // namespace ferry::server
