// The verbs provider on the software verbs model: handshake bytes, device and GID choice, the
// QP attributes chosen for InfiniBand and RoCE, completion status mapping, splitting,
// selective signalling and inline, flush-once on a QP error, and reconnect.

#include <arpa/inet.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/completion_waiter.h"
#include "tests/fakes/gpu_copies.h"
#include "tests/verbs_model/verbs_model.h"
#include "tests/verbs_model/verbs_pair.h"
#include "transport/memory/gpu_device.h"
#include "transport/providers.h"
#include "transport/verbs/completion_poller.h"
#include "transport/verbs/handshake.h"
#include "transport/verbs/qp_state.h"
#include "transport/verbs/verbs_endpoint.h"
#include "transport/verbs/verbs_fabric.h"
#include "transport/verbs/verbs_region.h"

namespace ferry::verbs {
namespace {

using ::testing::HasSubstr;

using Waiter = fabric::CompletionWaiter;

TEST(HandshakeTest, RoundTripsEveryField) {
  QpAddress a;
  a.link_layer = IBV_LINK_LAYER_ETHERNET;
  a.mtu = IBV_MTU_2048;
  a.qpn = 0xabcdef;
  a.psn = 0x123456;
  a.lid = 0x4321;
  a.gid = model::Ipv4MappedGid("192.168.1.9");
  a.fabric_id = 0x1122334455667788ull;
  a.retired_qpns = {7, 8, 0xffffff};
  auto b = ParseQpAddress(SerializeQpAddress(a));
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->link_layer, a.link_layer);
  EXPECT_EQ(b->mtu, a.mtu);
  EXPECT_EQ(b->qpn, a.qpn);
  EXPECT_EQ(b->psn, a.psn);
  EXPECT_EQ(b->lid, a.lid);
  EXPECT_EQ(std::memcmp(b->gid.raw, a.gid.raw, 16), 0);
  EXPECT_EQ(b->fabric_id, a.fabric_id);
  EXPECT_EQ(b->retired_qpns, a.retired_qpns);
  EXPECT_EQ(GidToString(a.gid), "::ffff:192.168.1.9");
}

TEST(HandshakeTest, MalformedBytesAreRefusedWithTheReason) {
  QpAddress a;
  a.qpn = 5;
  std::string good = SerializeQpAddress(a);
  EXPECT_THAT(std::string(ParseQpAddress("").status().message()), HasSubstr("shorter than"));
  std::string bad = good;
  bad[0] = 'X';
  EXPECT_THAT(std::string(ParseQpAddress(bad).status().message()), HasSubstr("bad magic"));
  bad = good;
  bad[4] = 9;
  EXPECT_THAT(std::string(ParseQpAddress(bad).status().message()), HasSubstr("version 9"));
  bad = good;
  bad[6] = 0;
  EXPECT_THAT(std::string(ParseQpAddress(bad).status().message()), HasSubstr("bad MTU"));
  bad = good;
  bad[11] = 1;  // QPN above 24 bits
  EXPECT_THAT(std::string(ParseQpAddress(bad).status().message()), HasSubstr("not 24-bit"));
  EXPECT_THAT(std::string(ParseQpAddress(good + "x").status().message()),
              HasSubstr("does not match the length"));
  EXPECT_EQ(ParseQpAddress("tcp").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(VerbsDeviceTest, NoRdmaIsUnavailableWithTheCallAndErrno) {
  auto f =
      VerbsFabric::Create({}, std::make_shared<VerbsModel>(std::vector<model::DeviceConfig>{}));
  EXPECT_EQ(f.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(f.status().message(), "ibv_get_device_list: no RDMA devices (ENOSYS)");
}

TEST(VerbsDeviceTest, RegistrySkipsVerbsHereAndSaysWhy) {
  fabric::ProviderOptions options;
  options.providers = {"verbs", "tcp"};
  std::vector<std::string> skipped;
  auto fabrics = fabric::CreateFabrics(options, &skipped);
  ASSERT_TRUE(fabrics.ok()) << fabrics.status();
  if (fabrics->size() == 2) GTEST_SKIP() << "this machine has an RDMA NIC";
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_THAT(skipped[0], HasSubstr("verbs not used: ibv_get_device_list: no RDMA devices"));
}

TEST(VerbsDeviceTest, PicksByNameOrTheFirstActivePort) {
  auto down = model::InfinibandDevice("mlx5_0", 1);
  down.ports[0].state = IBV_PORT_DOWN;
  auto up = model::InfinibandDevice("mlx5_1", 2);
  auto m = std::make_shared<VerbsModel>(std::vector<model::DeviceConfig>{down, up});
  auto any = VerbsFabric::Create({}, m);
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ((*any)->port().device, "mlx5_1");
  EXPECT_EQ((*any)->address(), "mlx5_1:1/ib/lid=0x2");
  VerbsOptions named;
  named.device = "mlx5_0";
  auto d = VerbsFabric::Create(named, m);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(d.status().message()),
              HasSubstr("mlx5_0 has no active port (port 1 is down)"));
  named.device = "mlx5_9";
  auto missing = VerbsFabric::Create(named, m);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("found: mlx5_0, mlx5_1"));
  m->FailNext(model::Call::kAllocPd, ENOMEM);
  EXPECT_THAT(std::string(VerbsFabric::Create({}, m).status().message()),
              HasSubstr("ibv_alloc_pd(mlx5_1)"));
}

TEST(VerbsQpTest, InfinibandAddressesByLidWithTheSmallerMtu) {
  VerbsOptions options;
  options.timeout = 17;
  options.retry_cnt = 5;
  options.rnr_retry = 6;
  Pair p(IbModel(1u << 30, IBV_MTU_2048), options, options);
  ASSERT_TRUE(p.endpoint);
  auto& ep = p.verbs_endpoint();
  ibv_qp_attr ini = p.model->QpAttributes(ep.qpn());
  ibv_qp_attr tgt = p.model->QpAttributes(ep.remote_qpn());
  EXPECT_EQ(p.model->QpState(ep.qpn()), IBV_QPS_RTS);
  EXPECT_EQ(p.model->QpState(ep.remote_qpn()), IBV_QPS_RTS);
  EXPECT_EQ(ini.ah_attr.is_global, 0);
  EXPECT_EQ(ini.ah_attr.dlid, 0x22);
  EXPECT_EQ(tgt.ah_attr.dlid, 0x11);
  EXPECT_EQ(ini.path_mtu, IBV_MTU_2048);
  EXPECT_EQ(tgt.path_mtu, IBV_MTU_2048);
  EXPECT_EQ(ini.dest_qp_num, ep.remote_qpn());
  EXPECT_EQ(tgt.dest_qp_num, ep.qpn());
  EXPECT_EQ(ini.sq_psn, tgt.rq_psn);
  EXPECT_EQ(tgt.sq_psn, ini.rq_psn);
  EXPECT_EQ(ini.timeout, 17);
  EXPECT_EQ(ini.retry_cnt, 5);
  EXPECT_EQ(ini.rnr_retry, 6);
  // Only the target lets peers in.
  EXPECT_EQ(ini.qp_access_flags, 0u);
  EXPECT_EQ(tgt.qp_access_flags,
            static_cast<unsigned>(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
}

TEST(VerbsQpTest, RoceUsesAGrhFromTheRoceV2Gid) {
  Pair p(RoceModel());
  ASSERT_TRUE(p.endpoint);
  EXPECT_EQ(p.initiator->port().gid_index, 3);  // IPv4-mapped RoCE v2
  EXPECT_EQ(p.initiator->address(), "mlx5_0:1/roce/::ffff:10.0.0.1");
  auto& ep = p.verbs_endpoint();
  ibv_qp_attr ini = p.model->QpAttributes(ep.qpn());
  EXPECT_EQ(ini.ah_attr.is_global, 1);
  EXPECT_EQ(ini.ah_attr.grh.sgid_index, 3);
  EXPECT_EQ(ini.ah_attr.grh.hop_limit, kRoceHopLimit);
  EXPECT_EQ(std::memcmp(ini.ah_attr.grh.dgid.raw, model::Ipv4MappedGid("10.0.0.2").raw, 16), 0);
  EXPECT_EQ(ini.path_mtu, IBV_MTU_1024);
  // And it carries bytes.
  std::vector<char> src(5000, 'r'), dst(5000, 0);
  auto s = p.initiator->Register(src.data(), src.size(), fabric::kLocal);
  auto d = p.target->Register(dst.data(), dst.size(), fabric::kRemoteWrite);
  Waiter w;
  ASSERT_TRUE(p.endpoint->PostWrite({s->get(), 0, 5000}, {(*d)->remote_address(), (*d)->key()},
                                    w.Callback()).ok());
  EXPECT_TRUE(w.Wait().ok()) << w.Wait();
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 'r'), 5000);
}

// QoS and partition come from config (issue 12): service level, GRH traffic class, P_Key.
TEST(VerbsQpTest, ServiceLevelTrafficClassAndPkeyComeFromOptions) {
  VerbsOptions options;
  options.sl = 3;
  options.traffic_class = 106;
  options.pkey_index = 2;
  Pair roce(RoceModel(), options, options);
  ASSERT_TRUE(roce.endpoint);
  ibv_qp_attr r = roce.model->QpAttributes(roce.verbs_endpoint().qpn());
  EXPECT_EQ(r.ah_attr.sl, 3);
  EXPECT_EQ(r.ah_attr.grh.traffic_class, 106);
  EXPECT_EQ(r.pkey_index, 2);
  // A P_Key index beyond the port's table is refused by ibv_modify_qp, naming the step.
  VerbsOptions bad;
  bad.device = "mlx5_0";
  bad.pkey_index = 500;
  auto m = IbModel();
  auto a = VerbsFabric::Create(bad, m);
  VerbsOptions b_options;
  b_options.device = "mlx5_1";
  auto b = VerbsFabric::Create(b_options, m);
  ASSERT_TRUE(a.ok() && b.ok());
  auto refused = fabric::ConnectDirect(**a, **b);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("ibv_modify_qp"));
}

// An InfiniBand port with IBV_QPF_GRH_REQUIRED refuses RTR without a GRH; ferry sets one.
TEST(VerbsQpTest, InfinibandPortsThatRequireAGrhGetOne) {
  auto a = model::InfinibandDevice("mlx5_0", 0x11);
  auto b = model::InfinibandDevice("mlx5_1", 0x22);
  a.ports[0].flags = b.ports[0].flags = IBV_QPF_GRH_REQUIRED;
  Pair p(std::make_shared<VerbsModel>(std::vector<model::DeviceConfig>{a, b}));
  ASSERT_TRUE(p.endpoint);
  ibv_qp_attr ini = p.model->QpAttributes(p.verbs_endpoint().qpn());
  EXPECT_EQ(ini.ah_attr.is_global, 1);
  EXPECT_EQ(ini.ah_attr.dlid, 0x22);
  EXPECT_EQ(std::memcmp(ini.ah_attr.grh.dgid.raw, b.ports[0].gids[0].gid.raw, 16), 0);
}

// The GID auto-pick never takes a link-local fe80:: RoCE v2 entry (it does not route), and
// says so when nothing else is there; an explicit gid_index still may.
TEST(VerbsQpTest, AutoPickSkipsLinkLocalRoceGids) {
  auto only_link_local = [] {
    auto d = model::RoceDevice("mlx5_0", "10.0.0.1");
    d.ports[0].gids.resize(2);  // the fe80:: v1 and v2 entries
    return std::make_shared<VerbsModel>(std::vector<model::DeviceConfig>{d});
  };
  auto f = VerbsFabric::Create({}, only_link_local());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(f.status().message()), HasSubstr("1 link-local fe80:: skipped"));
  VerbsOptions explicit_index;
  explicit_index.gid_index = 1;
  auto g = VerbsFabric::Create(explicit_index, only_link_local());
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->port().gid_index, 1);
  // With a global IPv6 entry after the link-local one, the global one is taken.
  auto d = model::RoceDevice("mlx5_0", "10.0.0.1");
  d.ports[0].gids.resize(2);
  ibv_gid_entry global = d.ports[0].gids[1];
  global.gid.global.subnet_prefix = htobe64(0x20010db800000000ull);
  global.gid_index = 2;
  d.ports[0].gids.push_back(global);
  auto h =
      VerbsFabric::Create({}, std::make_shared<VerbsModel>(std::vector<model::DeviceConfig>{d}));
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ((*h)->port().gid_index, 2);
}

TEST(VerbsQpTest, GidIndexMustBeRoceV2AndLinkLayersMustMatch) {
  auto m = RoceModel();
  VerbsOptions v1;
  v1.gid_index = 2;  // the RoCE v1 entry
  auto f = VerbsFabric::Create(v1, m);
  EXPECT_EQ(f.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(f.status().message()),
              HasSubstr("GID index 2 (::ffff:10.0.0.1) is not RoCE v2"));
  auto roce = VerbsFabric::Create({}, m);
  ASSERT_TRUE(roce.ok());
  auto pending = (*roce)->BeginConnect("mlx5_3:1/ib/lid=0x5");
  EXPECT_EQ(pending.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(pending.status().message()), HasSubstr("different link layers"));
}

TEST(CompletionStatusTest, MapsWcStatusesWithTheFacts) {
  ibv_wc wc = {};
  wc.qp_num = 0x1a2;
  wc.wr_id = 99;
  wc.status = IBV_WC_SUCCESS;
  EXPECT_TRUE(WcStatusToStatus(wc).ok());
  wc.status = IBV_WC_REM_ACCESS_ERR;
  absl::Status s = WcStatusToStatus(wc);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(s.message()), HasSubstr("QP 0x1a2 wr_id 99"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(ibv_wc_status_str(IBV_WC_REM_ACCESS_ERR)));
  for (auto st : {IBV_WC_WR_FLUSH_ERR, IBV_WC_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR}) {
    wc.status = st;
    EXPECT_EQ(WcStatusToStatus(wc).code(), absl::StatusCode::kUnavailable) << st;
  }
  wc.status = IBV_WC_LOC_PROT_ERR;
  EXPECT_EQ(WcStatusToStatus(wc).code(), absl::StatusCode::kFailedPrecondition);
  wc.status = IBV_WC_REM_INV_REQ_ERR;
  EXPECT_EQ(WcStatusToStatus(wc).code(), absl::StatusCode::kInvalidArgument);
}

TEST(VerbsOpsTest, LargeOpsAreSplitAtTheMessageSizeAndTheImmediateComesLast) {
  Pair p(IbModel(64 << 10));
  ASSERT_TRUE(p.endpoint);
  const uint64_t size = (1 << 20) + 3;
  std::vector<char> src(size), dst(size, 0);
  for (size_t i = 0; i < size; ++i) src[i] = static_cast<char>(i * 7);
  auto s = p.initiator->Register(src.data(), size, fabric::kLocal);
  auto d = p.target->Register(dst.data(), size, fabric::kRemoteWrite);
  absl::Notification seen;
  bool landed = false;
  p.target->SetImmediateHandler([&](uint32_t imm) {
    landed = imm == 42 && std::memcmp(src.data(), dst.data(), size) == 0;
    seen.Notify();
  });
  p.Reconnect();
  Waiter w;
  ASSERT_TRUE(p.endpoint->PostWriteWithImmediate({s->get(), 0, size},
                                                 {(*d)->remote_address(), (*d)->key()}, 42,
                                                 w.Callback()).ok());
  EXPECT_TRUE(w.Wait().ok()) << w.Wait();
  seen.WaitForNotification();
  EXPECT_TRUE(landed);
  EXPECT_EQ(p.model->SendStats(p.verbs_endpoint().qpn()).posted, 17u);  // 16 x 64 KiB + 3 B
  p.target->SetImmediateHandler(nullptr);
}

TEST(VerbsOpsTest, SelectiveSignallingWithQueueFlowControl) {
  VerbsOptions options;
  options.send_queue_depth = 32;
  options.signal_every = 8;
  options.inline_threshold = 0;
  Pair p(IbModel(), options);
  ASSERT_TRUE(p.endpoint);
  constexpr int kOps = 500;
  std::vector<char> src(kOps * 16, 's'), dst(kOps * 16, 0);
  auto s = p.initiator->Register(src.data(), src.size(), fabric::kLocal);
  auto d = p.target->Register(dst.data(), dst.size(), fabric::kRemoteWrite);
  std::atomic<int> ok{0}, calls{0};
  absl::Notification all;
  p.model->SetPaused(true);  // everything piles up: 32 on the QP, the rest in the provider
  for (int i = 0; i < kOps; ++i) {
    ASSERT_TRUE(p.endpoint->PostWrite({s->get(), i * 16ull, 16},
                                      {(*d)->remote_address() + i * 16, (*d)->key()},
                                      [&](absl::Status st) {
                                        ok.fetch_add(st.ok());
                                        if (calls.fetch_add(1) + 1 == kOps) all.Notify();
                                      }).ok());
  }
  EXPECT_EQ(p.model->SendStats(p.verbs_endpoint().qpn()).posted, 32u);
  p.model->SetPaused(false);
  ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(ok.load(), kOps);
  auto stats = p.model->SendStats(p.verbs_endpoint().qpn());
  EXPECT_EQ(stats.posted, static_cast<uint64_t>(kOps));
  EXPECT_LT(stats.signaled, stats.posted / 2) << "a completion per WR defeats the point";
  EXPECT_EQ(p.model->CqOverruns(), 0u);
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 's'), kOps * 16);
}

TEST(VerbsOpsTest, TinyPayloadsGoInline) {
  VerbsOptions options;
  options.inline_threshold = 32;
  Pair p(IbModel(), options);
  ASSERT_TRUE(p.endpoint);
  std::vector<char> src(64, 'a'), dst(64, 0);
  auto s = p.initiator->Register(src.data(), 64, fabric::kLocal);
  auto d = p.target->Register(dst.data(), 64, fabric::kRemoteWrite);
  p.model->SetPaused(true);
  Waiter small, second;
  ASSERT_TRUE(p.endpoint->PostWrite({s->get(), 0, 32}, {(*d)->remote_address(), (*d)->key()},
                                    small.Callback()).ok());
  ASSERT_TRUE(p.endpoint->PostWrite({s->get(), 32, 32}, {(*d)->remote_address() + 32, (*d)->key()},
                                    second.Callback()).ok());
  // Inline data was copied at post time; the rest is read when the HCA gets to it.
  std::memset(src.data(), 'b', 64);
  p.model->SetPaused(false);
  EXPECT_TRUE(small.Wait().ok());
  EXPECT_TRUE(second.Wait().ok());
  EXPECT_EQ(std::count(dst.begin(), dst.begin() + 32, 'a'), 32);
  EXPECT_EQ(p.model->SendStats(p.verbs_endpoint().qpn()).inlined, 2u);
  Waiter big;
  std::vector<char> more(33, 'm');
  auto m = p.initiator->Register(more.data(), 33, fabric::kLocal);
  ASSERT_TRUE(p.endpoint->PostWrite({m->get(), 0, 33}, {(*d)->remote_address(), (*d)->key()},
                                    big.Callback()).ok());
  EXPECT_TRUE(big.Wait().ok());
  EXPECT_EQ(p.model->SendStats(p.verbs_endpoint().qpn()).inlined, 2u);  // 33 > 32: not inline
}

TEST(VerbsOpsTest, QpErrorFlushesEachOpOnceThenReconnectFreesTheOldTarget) {
  Pair p(IbModel());
  ASSERT_TRUE(p.endpoint);
  std::vector<char> src(4096, 'e'), dst(4096, 0);
  auto s = p.initiator->Register(src.data(), src.size(), fabric::kLocal);
  auto d = p.target->Register(dst.data(), dst.size(), fabric::kRemoteWrite);
  constexpr int kOps = 50;
  std::vector<std::atomic<int>> calls(kOps);
  std::atomic<int> unavailable{0};
  p.model->SetPaused(true);
  for (int i = 0; i < kOps; ++i) {
    ASSERT_TRUE(p.endpoint->PostWrite({s->get(), 0, 4096}, {(*d)->remote_address(), (*d)->key()},
                                      [&, i](absl::Status st) {
                                        calls[i].fetch_add(1);
                                        unavailable.fetch_add(st.code() ==
                                                              absl::StatusCode::kUnavailable);
                                      }).ok());
  }
  const uint32_t old_target = p.verbs_endpoint().remote_qpn();
  p.model->ForceError(p.verbs_endpoint().qpn());  // the link dies
  p.model->SetPaused(false);
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (unavailable.load() < kOps && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(unavailable.load(), kOps);
  EXPECT_TRUE(p.endpoint->broken());
  Waiter refused;
  EXPECT_EQ(p.endpoint->PostWrite({s->get(), 0, 1}, {(*d)->remote_address(), (*d)->key()},
                                  refused.Callback()).code(),
            absl::StatusCode::kUnavailable);
  p.endpoint->Close();
  for (int i = 0; i < kOps; ++i) EXPECT_EQ(calls[i].load(), 1) << i;

  // The next handshake tells the target which of its QPs the closed endpoint used.
  EXPECT_EQ(p.model->QpState(old_target), IBV_QPS_RTS);
  auto again = fabric::ConnectDirect(*p.initiator, *p.target);
  ASSERT_TRUE(again.ok()) << again.status();
  p.endpoint = *again;
  EXPECT_EQ(p.model->QpState(old_target), IBV_QPS_UNKNOWN);
  EXPECT_EQ(p.target->accepted_connections(), 1u);
  Waiter w;
  ASSERT_TRUE(p.endpoint->PostWrite({s->get(), 0, 4096}, {(*d)->remote_address(), (*d)->key()},
                                    w.Callback()).ok());
  EXPECT_TRUE(w.Wait().ok()) << w.Wait();
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 'e'), 4096);
}

TEST(VerbsOpsTest, FailedPostIsRefusedNowAndBreaksTheEndpoint) {
  Pair p(IbModel());
  ASSERT_TRUE(p.endpoint);
  std::vector<char> src(64), dst(64);
  auto s = p.initiator->Register(src.data(), 64, fabric::kLocal);
  auto d = p.target->Register(dst.data(), 64, fabric::kRemoteWrite);
  p.model->FailNext(model::Call::kPostSend, EINVAL);
  bool ran = false;
  absl::Status st = p.endpoint->PostWrite({s->get(), 0, 64}, {(*d)->remote_address(), (*d)->key()},
                                          [&](absl::Status) { ran = true; });
  EXPECT_EQ(st.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(st.message()), HasSubstr("ibv_post_send(QP 0x"));
  EXPECT_THAT(std::string(st.message()), HasSubstr("(EINVAL)"));
  EXPECT_FALSE(ran);
  EXPECT_TRUE(p.endpoint->broken());
}

TEST(VerbsOpsTest, CloseInsideACompletionDoesNotDeadlock) {
  Pair p(IbModel());
  ASSERT_TRUE(p.endpoint);
  std::vector<char> src(64), dst(64);
  auto s = p.initiator->Register(src.data(), 64, fabric::kLocal);
  auto d = p.target->Register(dst.data(), 64, fabric::kRemoteWrite);
  absl::Notification closed;
  std::shared_ptr<fabric::Endpoint> ep = p.endpoint;
  ASSERT_TRUE(ep->PostWrite({s->get(), 0, 64}, {(*d)->remote_address(), (*d)->key()},
                            [ep, &closed](absl::Status) {
                              ep->Close();  // on the poller thread
                              closed.Notify();
                            }).ok());
  EXPECT_TRUE(closed.WaitForNotificationWithTimeout(absl::Seconds(10)));
}

TEST(VerbsRegionTest, RegistrationReportsHowAndFailuresCarryTheCall) {
  Pair p(IbModel());
  std::vector<char> mem(4096);
  auto r = p.initiator->Register(mem.data(), mem.size(), fabric::kRemoteRead);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->registration(), "ibv_reg_mr");
  p.model->FailNext(model::Call::kRegMr, ENOMEM);
  auto failed = p.initiator->Register(mem.data(), mem.size(), fabric::kLocal);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("ibv_reg_mr(mlx5_0, 4 KiB)"));
}

TEST(VerbsRegionTest, DmabufRegionsAreReachableByPeers) {
  Pair p(IbModel());
  ASSERT_TRUE(p.endpoint);
  int fd = memfd_create("gpu-buffer", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(fd, 1 << 16), 0);
  void* gpu_va = reinterpret_cast<void*>(0x7f1200000000ull);  // a device pointer, never touched
  auto r = p.target->RegisterDmabuf(gpu_va, 1 << 16, {fd, 0}, fabric::kRemoteWrite);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->registration(), "ibv_reg_dmabuf_mr");
  EXPECT_EQ((*r)->remote_address(), reinterpret_cast<uint64_t>(gpu_va));
  std::vector<char> src(100, 'g');
  auto s = p.initiator->Register(src.data(), 100, fabric::kLocal);
  Waiter w;
  ASSERT_TRUE(p.endpoint->PostWrite({s->get(), 0, 100}, {(*r)->remote_address() + 500, (*r)->key()},
                                    w.Callback()).ok());
  EXPECT_TRUE(w.Wait().ok()) << w.Wait();
  char back[100];
  ASSERT_EQ(pread(fd, back, 100, 500), 100);
  EXPECT_EQ(std::memcmp(back, src.data(), 100), 0);
  close(fd);
  auto bad = p.target->RegisterDmabuf(gpu_va, 4096, {-1, 0}, fabric::kRemoteWrite);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

// ibv_reg_dmabuf_mr leaves mr->addr at the dma-buf offset (rdma-core libibverbs/verbs.c):
// the region must still be addressed by the iova it was registered at, locally and by
// peers. Here the offset is not 0, so taking mr->addr would send every access astray.
TEST(VerbsRegionTest, DmabufRegionsAreAddressedByTheirIovaNotMrAddr) {
  Pair p(IbModel());
  ASSERT_TRUE(p.endpoint);
  int fd = memfd_create("gpu-buffer", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(fd, 3 << 16), 0);
  const uint64_t offset = 1 << 16;
  void* gpu_va = reinterpret_cast<void*>(0x7f1200010000ull);  // same offset within a page
  auto target = p.target->RegisterDmabuf(gpu_va, 1 << 16, {fd, offset}, fabric::kRemoteWrite);
  ASSERT_TRUE(target.ok()) << target.status();
  EXPECT_EQ((*target)->remote_address(), reinterpret_cast<uint64_t>(gpu_va));
  // A source in GPU memory too: the initiator's SGE uses its iova.
  int src_fd = memfd_create("gpu-src", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(src_fd, 2 << 16), 0);
  ASSERT_EQ(pwrite(src_fd, std::string(4096, 's').data(), 4096, 1 << 16), 4096);
  void* src_va = reinterpret_cast<void*>(0x7f3400000000ull);
  auto src = p.initiator->RegisterDmabuf(src_va, 1 << 16, {src_fd, 1 << 16}, fabric::kLocal);
  ASSERT_TRUE(src.ok()) << src.status();
  Waiter w;
  ASSERT_TRUE(p.endpoint
                  ->PostWrite({src->get(), 0, 4096},
                              {(*target)->remote_address() + 100, (*target)->key()}, w.Callback())
                  .ok());
  EXPECT_TRUE(w.Wait().ok()) << w.Wait();
  char back[4096];
  ASSERT_EQ(pread(fd, back, 4096, offset + 100), 4096);
  EXPECT_EQ(std::string(back, 4096), std::string(4096, 's'));
  close(fd);
  close(src_fd);
}

// Inline data is read by the CPU at post time (libmlx5): a small WRITE from GPU memory must
// go by DMA, or the agent faults. The model refuses inline from DMA-BUF memory (EFAULT).
TEST(VerbsOpsTest, SmallWritesFromGpuMemoryAreNeverInline) {
  Pair p(IbModel());
  ASSERT_TRUE(p.endpoint);
  std::vector<char> landing(4096, 0);
  auto target = p.target->Register(landing.data(), landing.size(), fabric::kRemoteWrite);
  ASSERT_TRUE(target.ok());
  int fd = memfd_create("gpu-src", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  ASSERT_EQ(pwrite(fd, "0123456789abcdef", 16, 0), 16);
  void* gpu_va = reinterpret_cast<void*>(0x7f5600000000ull);
  auto gpu = p.initiator->RegisterDmabuf(gpu_va, 4096, {fd, 0}, fabric::kLocal);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  // Peer memory (nvidia-peermem) is ibv_reg_mr of a device pointer: marked, never inline.
  std::vector<char> peer_mem(64, 'p');
  auto peer = p.initiator->Register(peer_mem.data(), 64, fabric::kLocal | fabric::kDeviceMemory);
  ASSERT_TRUE(peer.ok()) << peer.status();
  std::vector<char> host(64, 'h');
  auto host_region = p.initiator->Register(host.data(), 64, fabric::kLocal);
  ASSERT_TRUE(host_region.ok());
  const fabric::RemoteSlice dst{(*target)->remote_address(), (*target)->key()};
  for (const fabric::MemoryRegion* src : {gpu->get(), peer->get(), host_region->get()}) {
    Waiter w;
    ASSERT_TRUE(p.endpoint->PostWrite({src, 0, 16}, dst, w.Callback()).ok());
    EXPECT_TRUE(w.Wait().ok()) << w.Wait();
  }
  EXPECT_EQ(std::string(landing.data(), 16), std::string(16, 'h'));
  EXPECT_EQ(p.model->CpuFaults(), 0u);
  // Only the host-memory WRITE went inline.
  EXPECT_EQ(p.model->SendStats(p.verbs_endpoint().qpn()).inlined, 1u);
  close(fd);
}

// GDR by peer memory (GpuPools::RegisterForGdr's fallback after DMA-BUF): ibv_reg_mr of a
// device pointer works only where nvidia_peermem is loaded. Then a peer's WRITE lands in
// the GPU's memory, and a small WRITE from GPU memory goes by DMA: the CPU never reads it.
TEST(VerbsRegionTest, GpuMemoryRegistersThroughPeerMemoryOnly) {
  Pair p(IbModel());
  ASSERT_TRUE(p.endpoint);
  auto gpu = memory::CreateSimGpu(0, "", 0);
  auto slab = gpu->AllocateSlab(1 << 16);
  ASSERT_TRUE(slab.ok()) << slab.status();
  char* device = static_cast<char*>((*slab)->data());
  constexpr uint32_t kTarget = fabric::kRemoteWrite | fabric::kDeviceMemory;
  auto refused = p.target->Register(device, 1 << 15, kTarget);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("ibv_reg_mr(mlx5_1, 32 KiB)"));

  p.model->SetPeerMemoryLoaded(true);
  auto target = p.target->Register(device, 1 << 15, kTarget);
  ASSERT_TRUE(target.ok()) << target.status();
  auto source = p.initiator->Register(device + (1 << 15), 1 << 15,
                                      fabric::kLocal | fabric::kDeviceMemory);
  ASSERT_TRUE(source.ok()) << source.status();
  std::vector<char> host(64, 'h');
  auto host_region = p.initiator->Register(host.data(), host.size(), fabric::kRemoteWrite);
  ASSERT_TRUE(host_region.ok());

  auto write = [&](const fabric::LocalSlice& src, const fabric::RemoteSlice& dst) {
    Waiter w;
    absl::Status posted = p.endpoint->PostWrite(src, dst, w.Callback());
    return posted.ok() ? w.Wait() : posted;
  };
  EXPECT_TRUE(
      write({host_region->get(), 0, 64}, {(*target)->remote_address() + 1000, (*target)->key()})
          .ok());
  std::vector<char> landed(64);
  ASSERT_TRUE(fake::ReadGpu(*gpu, landed.data(), device + 1000, 64).ok());
  EXPECT_EQ(landed, host);

  const std::string pattern = "from device memory";
  ASSERT_TRUE(fake::WriteGpu(*gpu, device + (1 << 15), pattern.data(), pattern.size()).ok());
  auto back = p.target->Register(host.data(), host.size(), fabric::kRemoteWrite);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(
      write({source->get(), 0, pattern.size()}, {(*back)->remote_address(), (*back)->key()}).ok());
  EXPECT_EQ(std::string(host.data(), pattern.size()), pattern);
  EXPECT_EQ(p.model->CpuFaults(), 0u);
}

// Host registrations ask for relaxed ordering (issue 12, defect 7), with the role's access.
TEST(VerbsRegionTest, HostRegistrationsAskForRelaxedOrdering) {
  Pair p(IbModel());
  ASSERT_TRUE(p.endpoint);
  std::vector<char> mem(4096);
  auto r = p.target->Register(mem.data(), mem.size(), fabric::kRemoteWrite);
  ASSERT_TRUE(r.ok()) << r.status();
  int access = p.model->MrAccess(dynamic_cast<const VerbsRegion&>(**r).lkey());
  EXPECT_EQ(access, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_RELAXED_ORDERING);
}

TEST(VerbsLifetimeTest, EverythingIsReleasedInOrder) {
  auto m = IbModel();
  {
    Pair p(m);
    ASSERT_TRUE(p.endpoint);
    std::vector<char> mem(64);
    auto r = p.target->Register(mem.data(), 64, fabric::kRemoteWrite);
    ASSERT_TRUE(r.ok());
    EXPECT_GT(m->LiveObjects(), 0);
  }
  // The model refuses to close a context with a PD or CQ left, or a PD with MRs or QPs.
  EXPECT_EQ(m->LiveObjects(), 0);
}

}  // namespace
}  // namespace ferry::verbs
