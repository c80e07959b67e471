// The verbs provider on the software verbs model, where a node meets the rest of a cluster:
// the asynchronous events that break QPs and ports (a reader thread per device), CQs that
// grow with the number of connections, receives only where immediates are used, and target
// QPs freed when the agent that made them restarts.

#include <atomic>
#include <functional>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/completion_waiter.h"
#include "tests/verbs_model/verbs_model.h"
#include "tests/verbs_model/verbs_pair.h"
#include "transport/verbs/async_events.h"
#include "transport/verbs/verbs_endpoint.h"
#include "transport/verbs/verbs_fabric.h"
#include "transport/verbs/verbs_region.h"

namespace ferry::verbs {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using Waiter = fabric::CompletionWaiter;

// Polls `done` for up to 10 s: events arrive on another thread.
bool Eventually(const std::function<bool()>& done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

struct Buffers {
  Buffers(Pair& p, size_t size) : src(size, 's'), dst(size, 0) {
    auto s = p.initiator->Register(src.data(), size, fabric::kLocal);
    auto d = p.target->Register(dst.data(), size, fabric::kRemoteWrite | fabric::kRemoteRead);
    EXPECT_TRUE(s.ok() && d.ok());
    src_mr = std::move(*s);
    dst_mr = std::move(*d);
  }
  fabric::RemoteSlice remote(uint64_t offset = 0) const {
    return {dst_mr->remote_address() + offset, dst_mr->key()};
  }
  std::vector<char> src, dst;
  std::unique_ptr<fabric::MemoryRegion> src_mr, dst_mr;
};

TEST(AsyncEventTest, ClassifiesWhatEachEventBreaks) {
  ibv_async_event e = {};
  e.event_type = IBV_EVENT_PORT_ERR;
  e.element.port_num = 2;
  AsyncEventMeaning m = ClassifyAsyncEvent(e, "mlx5_3");
  EXPECT_EQ(m.kind, AsyncEventMeaning::kPortDown);
  EXPECT_EQ(m.port, 2);
  EXPECT_THAT(m.text, HasSubstr("mlx5_3 port 2"));
  e.event_type = IBV_EVENT_PORT_ACTIVE;
  EXPECT_EQ(ClassifyAsyncEvent(e, "mlx5_3").kind, AsyncEventMeaning::kPortUp);
  e.event_type = IBV_EVENT_DEVICE_FATAL;
  EXPECT_EQ(ClassifyAsyncEvent(e, "mlx5_3").kind, AsyncEventMeaning::kDeviceLost);
  e.event_type = IBV_EVENT_LID_CHANGE;
  EXPECT_EQ(ClassifyAsyncEvent(e, "mlx5_3").kind, AsyncEventMeaning::kInformational);
  ibv_qp qp = {};
  qp.qp_num = 0x77;
  e = {};
  e.element.qp = &qp;
  for (auto type : {IBV_EVENT_QP_FATAL, IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR}) {
    e.event_type = type;
    m = ClassifyAsyncEvent(e, "mlx5_3");
    EXPECT_EQ(m.kind, AsyncEventMeaning::kQpBroken) << type;
    EXPECT_EQ(m.qpn, 0x77u);
    EXPECT_THAT(m.text, HasSubstr("QP 0x77"));
  }
  e.event_type = IBV_EVENT_COMM_EST;
  EXPECT_EQ(ClassifyAsyncEvent(e, "mlx5_3").kind, AsyncEventMeaning::kInformational);
  ibv_cq cq = {};
  e = {};
  e.event_type = IBV_EVENT_CQ_ERR;
  e.element.cq = &cq;
  m = ClassifyAsyncEvent(e, "mlx5_3");
  EXPECT_EQ(m.kind, AsyncEventMeaning::kCqBroken);
  EXPECT_EQ(m.cq, &cq);
}

TEST(AsyncEventTest, PortDownBreaksEndpointsAtOnceAndRefusesConnectionsUntilItIsBack) {
  // Transport retries would take 8 x 4.3 s here (timeout 20): what breaks the endpoint
  // within seconds can only be the event.
  VerbsOptions slow_retries;
  slow_retries.timeout = 20;
  Pair p(IbModel(), slow_retries, slow_retries);
  ASSERT_TRUE(p.endpoint);
  Buffers b(p, 4096);
  EXPECT_TRUE(p.initiator->health().ok());
  p.model->SetPortState("mlx5_0", 1, IBV_PORT_DOWN);
  const absl::Time start = absl::Now();
  ASSERT_TRUE(Eventually([&] { return p.endpoint->broken(); }));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(p.initiator->health().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(p.initiator->health().message()), HasSubstr("mlx5_0 port 1"));
  EXPECT_TRUE(p.target->health().ok());
  Waiter w;
  EXPECT_EQ(p.endpoint->PostWrite({b.src_mr.get(), 0, 64}, b.remote(), w.Callback()).code(),
            absl::StatusCode::kUnavailable);
  auto refused = fabric::ConnectDirect(*p.initiator, *p.target);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("PORT_ERR"));

  p.model->SetPortState("mlx5_0", 1, IBV_PORT_ACTIVE);
  ASSERT_TRUE(Eventually([&] { return p.initiator->health().ok(); }));
  p.Reconnect();
  Waiter again;
  ASSERT_TRUE(p.endpoint->PostWrite({b.src_mr.get(), 0, 4096}, b.remote(), again.Callback()).ok());
  EXPECT_TRUE(again.Wait().ok()) << again.Wait();
  EXPECT_EQ(b.dst, b.src);
}

TEST(AsyncEventTest, OpsFlushedAfterARetryExceededReportTheRetryNotTheFlush) {
  // The far side's cable is pulled with 20 WRITEs posted: the first exhausts its transport
  // retries (1 + 6) x 4.096 us x 2^8, about 7 ms; the other 19 flush. Every op names the
  // root cause, as `ferryctl nics` and the ledger then do (issue 43 item 6).
  VerbsOptions quick;
  quick.timeout = 8;
  quick.retry_cnt = 6;
  Pair p(IbModel(), quick, quick);
  ASSERT_TRUE(p.endpoint);
  Buffers b(p, 4096);
  constexpr int kOps = 20;
  std::vector<absl::Status> statuses(kOps);
  std::atomic<int> done{0};
  p.model->SetPaused(true);
  for (int i = 0; i < kOps; ++i) {
    ASSERT_TRUE(p.endpoint
                    ->PostWrite({b.src_mr.get(), 0, 4096}, b.remote(),
                                [&, i](absl::Status s) {
                                  statuses[i] = std::move(s);
                                  done.fetch_add(1);
                                })
                    .ok());
  }
  p.model->SetPortState("mlx5_1", 1, IBV_PORT_DOWN);
  p.model->SetPaused(false);
  ASSERT_TRUE(Eventually([&] { return done.load() == kOps; }));
  for (int i = 0; i < kOps; ++i) {
    EXPECT_EQ(statuses[i].code(), absl::StatusCode::kUnavailable) << i;
    EXPECT_THAT(std::string(statuses[i].message()), HasSubstr("retry counter exceeded")) << i;
    EXPECT_THAT(std::string(statuses[i].message()), Not(HasSubstr("Flushed"))) << i;
  }
}

TEST(AsyncEventTest, QpFatalFailsEachOpOnce) {
  Pair p(IbModel());
  ASSERT_TRUE(p.endpoint);
  Buffers b(p, 4096);
  constexpr int kOps = 20;
  std::vector<std::atomic<int>> calls(kOps);
  std::atomic<int> failed{0};
  p.model->SetPaused(true);
  for (int i = 0; i < kOps; ++i) {
    ASSERT_TRUE(p.endpoint
                    ->PostWrite({b.src_mr.get(), 0, 4096}, b.remote(), [&, i](absl::Status s) {
                      calls[i].fetch_add(1);
                      failed.fetch_add(!s.ok());
                    })
                    .ok());
  }
  p.model->RaiseQpFatal(p.verbs_endpoint().qpn());
  p.model->SetPaused(false);
  ASSERT_TRUE(Eventually([&] { return failed.load() == kOps; }));
  EXPECT_TRUE(p.endpoint->broken());
  p.endpoint->Close();
  for (int i = 0; i < kOps; ++i) EXPECT_EQ(calls[i].load(), 1) << i;
  EXPECT_EQ(p.model->UnackedEvents(), 0);
}

// One WRITE of the whole source, posted while the model's data mover is paused.
void PostWhilePaused(Pair& p, Buffers& b, Waiter& w) {
  p.model->SetPaused(true);
  ASSERT_TRUE(
      p.endpoint->PostWrite({b.src_mr.get(), 0, b.src.size()}, b.remote(), w.Callback()).ok());
}

TEST(AsyncEventTest, ALostDeviceFailsOpsWhoseCompletionsNeverCome) {
  Pair p(IbModel());
  ASSERT_TRUE(p.endpoint);
  Buffers b(p, 4096);
  Waiter w;
  PostWhilePaused(p, b, w);
  // The device dies with the WRITE posted: no completion, flushed or not, will ever come.
  p.model->LoseDevice("mlx5_0");
  p.model->SetPaused(false);
  absl::Status s = w.Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("DEVICE_FATAL"));
  EXPECT_EQ(p.initiator->health().code(), absl::StatusCode::kUnavailable);
  // The fabric closes a lost device (so that its driver can reset it), and a lost device
  // stays lost, whatever its ports say afterwards: it is not taken back until its driver
  // adds it again.
  ASSERT_TRUE(Eventually([&] { return p.initiator->closes() == 1; }));
  p.model->SetPortState("mlx5_0", 1, IBV_PORT_ACTIVE);
  absl::SleepFor(3 * VerbsFabric::kReopenEvery);
  EXPECT_FALSE(p.initiator->health().ok());
  EXPECT_EQ(p.initiator->reopens(), 0u);
}

// `rdma link delete rxe0` in make test-rdma hung in D state while ferryd held rxe0: Soft-RoCE
// sends no event and the kernel waits for every context to close (the model's RemoveDevice).
// The fabric notices the device gone, fails its ops with that cause, releases every QP, MR,
// CQ and PD and closes the context, so the removal returns at once; when a device of that
// name is back, it is opened and every region registered again, with new keys.
TEST(DeviceRemovalTest, ARemovedSoftRoceDeviceIsClosedAtOnceAndUsedAgainWhenAddedBack) {
  auto model = std::make_shared<VerbsModel>(std::vector<model::DeviceConfig>{
      model::SoftRoceDevice("rxe0", "10.0.0.1"), model::SoftRoceDevice("rxe1", "10.0.0.2")});
  Pair p(model, {.device = "rxe0"}, {.device = "rxe1"});
  ASSERT_TRUE(p.endpoint);
  std::vector<std::string> keys_changed;
  absl::Mutex mu;
  p.initiator->SetKeysChangedHandler([&](const std::string& why) {
    absl::MutexLock lock(&mu);
    keys_changed.push_back(why);
  });
  Buffers b(p, 4096);
  Waiter first;
  ASSERT_TRUE(p.endpoint->PostWrite({b.src_mr.get(), 0, 4096}, b.remote(), first.Callback()).ok());
  ASSERT_TRUE(first.Wait().ok());
  const uint32_t old_lkey = dynamic_cast<const VerbsRegion&>(*b.src_mr).lkey();
  // A WRITE in flight when the device goes: its completion never comes.
  Waiter in_flight;
  PostWhilePaused(p, b, in_flight);
  const absl::Time start = absl::Now();
  EXPECT_TRUE(model->RemoveDevice("rxe0", absl::Seconds(10)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  EXPECT_EQ(model->BlockedRemovals(), 0u);
  model->SetPaused(false);
  absl::Status s = in_flight.Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rxe0 was removed"));
  EXPECT_THAT(std::string(p.initiator->health().message()), HasSubstr("rxe0 was removed"));
  EXPECT_TRUE(p.endpoint->broken());
  EXPECT_EQ(b.src_mr->key(), 0u);  // no MR while there is no device
  // Memory registered while the device is away waits for it rather than failing.
  std::vector<char> later(4096, 'l');
  auto later_mr = p.initiator->Register(later.data(), later.size(), fabric::kLocal);
  ASSERT_TRUE(later_mr.ok()) << later_mr.status();
  EXPECT_FALSE(fabric::ConnectDirect(*p.initiator, *p.target).ok());

  model->AddDevice(model::SoftRoceDevice("rxe0", "10.0.0.1"));
  ASSERT_TRUE(Eventually([&] { return p.initiator->health().ok(); }));
  EXPECT_EQ(p.initiator->reopens(), 1u);
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(keys_changed.size(), 1u);
    EXPECT_THAT(keys_changed[0], HasSubstr("rxe0 is back"));
  }
  EXPECT_NE(dynamic_cast<const VerbsRegion&>(*b.src_mr).lkey(), 0u);
  EXPECT_NE(dynamic_cast<const VerbsRegion&>(*b.src_mr).lkey(), old_lkey);
  p.endpoint->Close();
  auto ep = fabric::ConnectDirect(*p.initiator, *p.target);
  ASSERT_TRUE(ep.ok()) << ep.status();
  p.endpoint = *ep;
  Waiter again, from_later;
  ASSERT_TRUE(p.endpoint->PostWrite({b.src_mr.get(), 0, 2048}, b.remote(), again.Callback()).ok());
  ASSERT_TRUE(p.endpoint
                  ->PostWrite({later_mr->get(), 0, 2048}, b.remote(2048), from_later.Callback())
                  .ok());
  EXPECT_TRUE(again.Wait().ok());
  EXPECT_TRUE(from_later.Wait().ok());
  EXPECT_EQ(std::string(b.dst.begin(), b.dst.begin() + 2048), std::string(2048, 's'));
  EXPECT_EQ(std::string(b.dst.begin() + 2048, b.dst.end()), std::string(2048, 'l'));
  later_mr->reset();
}

TEST(DeviceRemovalTest, ADeviceThatRaisesDeviceFatalOnRemovalIsClosedAndReopenedToo) {
  // mlx5 disassociates: DEVICE_FATAL, and the removal returns without waiting.
  auto model = RoceModel();
  Pair p(model);
  ASSERT_TRUE(p.endpoint);
  EXPECT_TRUE(model->RemoveDevice("mlx5_0", absl::ZeroDuration()));
  ASSERT_TRUE(Eventually([&] { return p.initiator->closes() == 1; }));
  EXPECT_THAT(std::string(p.initiator->health().message()), HasSubstr("DEVICE_FATAL"));
  model->AddDevice(model::RoceDevice("mlx5_0", "10.0.0.1"));
  ASSERT_TRUE(Eventually([&] { return p.initiator->health().ok(); }));
  p.endpoint->Close();
  auto ep = fabric::ConnectDirect(*p.initiator, *p.target);
  ASSERT_TRUE(ep.ok()) << ep.status();
  p.endpoint = *ep;
}

TEST(AsyncEventTest, ACallbackOfALostDeviceMayDropTheLastReferenceToIt) {
  auto model = IbModel();
  auto a = VerbsFabric::Create({.device = "mlx5_0"}, model);
  auto b = VerbsFabric::Create({.device = "mlx5_1"}, model);
  ASSERT_TRUE(a.ok() && b.ok());
  auto ep = fabric::ConnectDirect(**a, **b);
  ASSERT_TRUE(ep.ok());
  std::vector<char> src(64), dst(64);
  auto s = (*a)->Register(src.data(), src.size(), fabric::kLocal);
  auto d = (*b)->Register(dst.data(), dst.size(), fabric::kRemoteWrite);
  ASSERT_TRUE(s.ok() && d.ok());
  // What keeps mlx5_0 open: the endpoint and the region, both owned by the op's callback.
  struct Owned {
    std::shared_ptr<fabric::Endpoint> endpoint;
    std::unique_ptr<fabric::MemoryRegion> region;
  };
  auto owned = std::make_shared<Owned>(Owned{*ep, std::move(*s)});
  const fabric::RemoteSlice remote{(*d)->remote_address(), (*d)->key()};
  fabric::Endpoint* endpoint = ep->get();
  ep->reset();
  a->reset();
  absl::Notification done;
  model->SetPaused(true);
  ASSERT_TRUE(endpoint
                  ->PostWrite({owned->region.get(), 0, 64}, remote,
                              [owned, &done](absl::Status) mutable {
                                // On the event thread: closes and frees the device's last
                                // users, which must neither wait for itself nor join itself.
                                owned->endpoint->Close();
                                owned->endpoint.reset();
                                owned->region.reset();
                                owned.reset();
                                done.Notify();
                              })
                  .ok());
  owned.reset();
  const absl::Time start = absl::Now();
  model->LoseDevice("mlx5_0");
  EXPECT_TRUE(done.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // no 10 s flush wait on its own thread
  model->SetPaused(false);
  d->reset();
  b->reset();
  ASSERT_TRUE(Eventually([&] { return model->LiveObjects() == 0; }));
}

TEST(AsyncEventTest, AFailingPollFailsTheQpsOfThatCq) {
  Pair p(IbModel());
  ASSERT_TRUE(p.endpoint);
  Buffers b(p, 64);
  Waiter w;
  PostWhilePaused(p, b, w);
  // Without the failed CQ's completions the WRITE would wait forever; it fails instead.
  // (Every poll fails: the target device's poller shares the model and could take a single
  // injected fault.)
  p.model->FailNext(model::Call::kPollCq, EIO, 1 << 30);
  absl::Status s = w.Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("ibv_poll_cq"));
  p.model->SetPaused(false);
}

TEST(CqPoolTest, AFullMeshOfTwoHundredPeersOpensMoreCqsAndGivesEveryEntryBack) {
  // Default depths: a 1024-WR send queue per connection in CQs of 65536 entries held 63
  // connections in the one CQ there was; a 200-node mesh needs 200 each way.
  auto model = IbModel();
  auto a = VerbsFabric::Create({.device = "mlx5_0"}, model);
  auto b = VerbsFabric::Create({.device = "mlx5_1"}, model);
  ASSERT_TRUE(a.ok() && b.ok());
  constexpr int kPeers = 200;
  std::vector<std::shared_ptr<fabric::Endpoint>> endpoints;
  for (int i = 0; i < kPeers; ++i) {
    for (auto [from, to] : {std::pair{a->get(), b->get()}, std::pair{b->get(), a->get()}}) {
      auto ep = fabric::ConnectDirect(*from, *to);
      ASSERT_TRUE(ep.ok()) << i << ": " << ep.status();
      endpoints.push_back(*ep);
    }
  }
  const CqPool& pool = (*a)->device().cq_pool();
  EXPECT_EQ(pool.cq_count(), 4u);  // 200 x 1024 + 200 x 1 entries, 65536 per CQ
  EXPECT_EQ(pool.reserved(), kPeers * 1024u + kPeers * 1u);
  // Data still moves on the last connection made.
  std::vector<char> src(256, 'm'), dst(256, 0);
  auto s = (*b)->Register(src.data(), src.size(), fabric::kLocal);
  auto d = (*a)->Register(dst.data(), dst.size(), fabric::kRemoteWrite);
  Waiter w;
  ASSERT_TRUE(endpoints.back()
                  ->PostWrite({s->get(), 0, 256}, {(*d)->remote_address(), (*d)->key()},
                              w.Callback())
                  .ok());
  EXPECT_TRUE(w.Wait().ok()) << w.Wait();
  EXPECT_EQ(dst, src);
  for (auto& ep : endpoints) ep->Close();
  endpoints.clear();
  a->reset();
  b->reset();
  s->reset();
  d->reset();
  EXPECT_EQ(model->LiveObjects(), 0);
}

TEST(CqPoolTest, AQpLargerThanOneCqIsRefusedWithTheSetting) {
  auto model = IbModel();
  auto a = VerbsFabric::Create({.device = "mlx5_0", .cq_depth = 512}, model);
  auto b = VerbsFabric::Create({.device = "mlx5_1"}, model);
  ASSERT_TRUE(a.ok() && b.ok());
  auto ep = fabric::ConnectDirect(**a, **b);
  EXPECT_EQ(ep.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(ep.status().message()), HasSubstr("verbs.cq_depth"));
}

TEST(TargetReceivesTest, NoImmediateHandlerMeansNoReceivesAndImmediatesAreRefused) {
  Pair p(IbModel());
  ASSERT_TRUE(p.endpoint);
  Buffers b(p, 64);
  const uint32_t target_qp = p.verbs_endpoint().remote_qpn();
  EXPECT_EQ(p.model->ReceivesPosted(target_qp), 0u);
  EXPECT_EQ(p.target->device().cq_pool().reserved(), 1u);
  Waiter refused;
  absl::Status s = p.endpoint->PostWriteWithImmediate({b.src_mr.get(), 0, 64}, b.remote(), 7,
                                                      refused.Callback());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("takes no immediates"));
  EXPECT_FALSE(p.endpoint->broken());
  Waiter plain;
  ASSERT_TRUE(p.endpoint->PostWrite({b.src_mr.get(), 0, 64}, b.remote(), plain.Callback()).ok());
  EXPECT_TRUE(plain.Wait().ok());

  // With a handler, later connections keep recv_queue_depth receives posted.
  absl::Notification got;
  p.target->SetImmediateHandler([&](uint32_t imm) {
    if (imm == 7) got.Notify();
  });
  p.Reconnect();
  EXPECT_EQ(p.model->ReceivesPosted(p.verbs_endpoint().remote_qpn()), 256u);
  Waiter w;
  ASSERT_TRUE(
      p.endpoint->PostWriteWithImmediate({b.src_mr.get(), 0, 64}, b.remote(), 7, w.Callback())
          .ok());
  EXPECT_TRUE(w.Wait().ok());
  EXPECT_TRUE(got.WaitForNotificationWithTimeout(absl::Seconds(10)));
  p.target->SetImmediateHandler(nullptr);
}

TEST(TargetReapTest, ARestartedAgentsOldTargetQpsAreFreedWhenItConnectsAgain) {
  auto model = IbModel();
  auto target = VerbsFabric::Create({.device = "mlx5_1"}, model);
  ASSERT_TRUE(target.ok());
  std::vector<std::shared_ptr<fabric::Endpoint>> kept;
  auto connect = [&](const fabric::PeerInstance& who) {
    auto initiator = VerbsFabric::Create({.device = "mlx5_0"}, model);
    ASSERT_TRUE(initiator.ok());
    auto ep = fabric::ConnectDirect(**initiator, **target, who);
    ASSERT_TRUE(ep.ok()) << ep.status();
    // The endpoint is never closed: the agent "crashed", and a crash tells nobody.
    kept.push_back(*ep);
  };
  connect({"node-a", 1});
  connect({"node-a", 1});
  connect({"node-b", 7});
  EXPECT_EQ((*target)->accepted_connections(), 3u);
  // node-a restarts (a new incarnation) and connects again: its two old QPs go.
  connect({"node-a", 2});
  EXPECT_EQ((*target)->accepted_connections(), 2u);
  // An agent that does not say who it is (incarnation 0) reaps nothing of anyone's.
  connect({"node-a", 0});
  EXPECT_EQ((*target)->accepted_connections(), 3u);
  for (auto& ep : kept) ep->Close();
}

}  // namespace
}  // namespace ferry::verbs
