// The software verbs model on its own, driven through the seam the way a provider would:
// it must refuse what an HCA refuses, so that the provider tests on it mean something.

#include "tests/verbs_model/verbs_model.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/fakes/gpu_copies.h"
#include "transport/memory/gpu_device.h"

namespace ferry::verbs::model {
namespace {

// The first device `m` lists, opened; nullptr when it lists none.
ibv_context* OpenFirst(VerbsModel& m) {
  int n = 0;
  ibv_device** list = m.GetDeviceList(&n);
  ibv_context* ctx = n > 0 ? m.OpenDevice(list[0]) : nullptr;
  if (list != nullptr) m.FreeDeviceList(list);
  return ctx;
}

// An RC QP in INIT on the first device `m` lists, with its PD and CQ, and the RTR attributes
// the RoCE tests start from (dest_qp_num 0x99, path MTU 1024, port 1; no path yet).
struct RoceQp {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;  // null when INIT failed
  ibv_qp_attr rtr = {};
};
RoceQp RcQpInInit(VerbsModel& m) {
  RoceQp r;
  r.ctx = OpenFirst(m);
  r.pd = m.AllocPd(r.ctx);
  r.cq = m.CreateCq(r.ctx, 16);
  ibv_qp_init_attr init = {};
  init.send_cq = init.recv_cq = r.cq;
  init.qp_type = IBV_QPT_RC;
  init.cap = {4, 4, 1, 1, 0};
  ibv_qp* qp = m.CreateQp(r.pd, &init);
  ibv_qp_attr a = {};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  if (m.ModifyQp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) ==
      0) {
    r.qp = qp;
  }
  r.rtr.qp_state = IBV_QPS_RTR;
  r.rtr.path_mtu = IBV_MTU_1024;
  r.rtr.dest_qp_num = 0x99;
  r.rtr.ah_attr.port_num = 1;
  return r;
}

class VerbsModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    ibv_device** list = model_.GetDeviceList(&n);
    ASSERT_EQ(n, 2);
    ctx_a_ = model_.OpenDevice(list[0]);
    ctx_b_ = model_.OpenDevice(list[1]);
    model_.FreeDeviceList(list);
    pd_a_ = model_.AllocPd(ctx_a_);
    pd_b_ = model_.AllocPd(ctx_b_);
    cq_a_ = model_.CreateCq(ctx_a_, 64);
    cq_b_ = model_.CreateCq(ctx_b_, 64);
    ASSERT_TRUE(pd_a_ && pd_b_ && cq_a_ && cq_b_);
  }
  void TearDown() override {
    for (ibv_qp* qp : qps_) EXPECT_EQ(model_.DestroyQp(qp), 0);
    for (ibv_mr* mr : mrs_) EXPECT_EQ(model_.DeregMr(mr), 0);
    EXPECT_EQ(model_.DestroyCq(cq_a_), 0);
    EXPECT_EQ(model_.DestroyCq(cq_b_), 0);
    EXPECT_EQ(model_.DeallocPd(pd_a_), 0);
    EXPECT_EQ(model_.DeallocPd(pd_b_), 0);
    EXPECT_EQ(model_.CloseDevice(ctx_a_), 0);
    EXPECT_EQ(model_.CloseDevice(ctx_b_), 0);
    EXPECT_EQ(model_.LiveObjects(), 0);
  }

  ibv_qp* Qp(ibv_pd* pd, ibv_cq* cq, uint32_t send = 8, uint32_t recv = 8) {
    ibv_qp_init_attr init = {};
    init.send_cq = init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap = {send, recv, 1, 1, 64};
    ibv_qp* qp = model_.CreateQp(pd, &init);
    EXPECT_NE(qp, nullptr);
    qps_.push_back(qp);
    return qp;
  }
  ibv_mr* Mr(ibv_pd* pd, std::vector<char>& mem, int access) {
    ibv_mr* mr = model_.RegMr(pd, mem.data(), mem.size(), access);
    EXPECT_NE(mr, nullptr);
    mrs_.push_back(mr);
    return mr;
  }
  // RESET -> RTS towards `peer` at `lid`, with the PSNs both sides agree on.
  int Connect(ibv_qp* qp, uint32_t peer, uint16_t lid, uint32_t sq_psn, uint32_t rq_psn,
              uint8_t rnr_retry = 7, uint8_t timeout = 14, uint8_t retry_cnt = 6) {
    ibv_qp_attr a = {};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (int rc = model_.ModifyQp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                             IBV_QP_ACCESS_FLAGS)) return rc;
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = peer;
    a.rq_psn = rq_psn;
    a.max_dest_rd_atomic = 4;
    a.min_rnr_timer = 12;
    a.ah_attr.dlid = lid;
    a.ah_attr.port_num = 1;
    if (int rc = model_.ModifyQp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                             IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
      return rc;
    }
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = sq_psn;
    a.timeout = timeout;
    a.retry_cnt = retry_cnt;
    a.rnr_retry = rnr_retry;
    a.max_rd_atomic = 4;
    return model_.ModifyQp(qp, &a,
                           IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                               IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  }
  // A connected pair: a on LID 1 -> b on LID 2.
  void Pair(ibv_qp** a, ibv_qp** b, uint8_t rnr_retry = 7) {
    *a = Qp(pd_a_, cq_a_);
    *b = Qp(pd_b_, cq_b_);
    ASSERT_EQ(Connect(*a, (*b)->qp_num, 2, 100, 200, rnr_retry), 0);
    ASSERT_EQ(Connect(*b, (*a)->qp_num, 1, 200, 100, rnr_retry), 0);
  }
  int Post(ibv_qp* qp, ibv_wr_opcode op, void* local, uint32_t len, uint32_t lkey,
           uint64_t remote, uint32_t rkey, uint64_t wr_id, bool signaled = true) {
    ibv_sge sge = {reinterpret_cast<uint64_t>(local), len, lkey};
    ibv_send_wr wr = {};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = signaled ? IBV_SEND_SIGNALED : 0;
    wr.imm_data = htonl(0xabcd);
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    return model_.PostSend(qp, &wr, &bad);
  }
  // A signalled inline WRITE of `sge` to (remote, rkey).
  static ibv_send_wr InlineWrite(ibv_sge* sge, uint64_t remote, uint32_t rkey) {
    ibv_send_wr wr{};
    wr.sg_list = sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = rkey;
    return wr;
  }
  std::vector<ibv_wc> Poll(ibv_cq* cq, size_t want) {
    std::vector<ibv_wc> out;
    absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (out.size() < want && absl::Now() < deadline) {
      ibv_wc wc[16];
      int n = model_.PollCq(cq, 16, wc);
      out.insert(out.end(), wc, wc + n);
      if (n == 0) absl::SleepFor(absl::Microseconds(100));
    }
    return out;
  }

  VerbsModel model_{{[] {
                       auto d = InfinibandDevice("mlx5_0", 1);
                       d.ports[0].max_msg_sz = 1 << 20;
                       return d;
                     }(),
                     InfinibandDevice("mlx5_1", 2)}};
  ibv_context *ctx_a_ = nullptr, *ctx_b_ = nullptr;
  ibv_pd *pd_a_ = nullptr, *pd_b_ = nullptr;
  ibv_cq *cq_a_ = nullptr, *cq_b_ = nullptr;
  std::vector<ibv_qp*> qps_;
  std::vector<ibv_mr*> mrs_;
};

TEST(VerbsModelDevicesTest, NoDevicesIsNullWithEnosysLikeAKernelWithoutRdma) {
  VerbsModel none({});
  int n = -1;
  errno = 0;
  EXPECT_EQ(none.GetDeviceList(&n), nullptr);
  EXPECT_EQ(errno, ENOSYS);
}

TEST_F(VerbsModelTest, QueriesDescribeThePortAndGidTable) {
  ibv_port_attr port = {};
  ASSERT_EQ(model_.QueryPort(ctx_b_, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(port.lid, 2);
  EXPECT_EQ(port.link_layer, IBV_LINK_LAYER_INFINIBAND);
  EXPECT_EQ(model_.QueryPort(ctx_b_, 2, &port), EINVAL);
  VerbsModel roce({RoceDevice("rxe0", "10.0.0.7")});
  int n = 0;
  ibv_device** list = roce.GetDeviceList(&n);
  ibv_context* ctx = roce.OpenDevice(list[0]);
  roce.FreeDeviceList(list);
  ibv_gid_entry entry = {};
  ASSERT_EQ(roce.QueryGidEx(ctx, 1, 3, &entry), 0);
  EXPECT_EQ(entry.gid_type, IBV_GID_TYPE_ROCE_V2);
  EXPECT_EQ(std::memcmp(entry.gid.raw, Ipv4MappedGid("10.0.0.7").raw, 16), 0);
  EXPECT_EQ(roce.QueryGidEx(ctx, 1, 9, &entry), EINVAL);
  EXPECT_EQ(roce.CloseDevice(ctx), 0);
}

TEST_F(VerbsModelTest, TransitionsNeedTheirAttributeMasks) {
  ibv_qp* qp = Qp(pd_a_, cq_a_);
  ibv_qp_attr a = {};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  // Missing IBV_QP_ACCESS_FLAGS.
  EXPECT_EQ(model_.ModifyQp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT), EINVAL);
  // RESET -> RTR skips INIT.
  a.qp_state = IBV_QPS_RTR;
  EXPECT_EQ(model_.ModifyQp(qp, &a, IBV_QP_STATE), EINVAL);
  EXPECT_EQ(model_.QpState(qp->qp_num), IBV_QPS_RESET);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 3;  // no such port
  EXPECT_EQ(model_.ModifyQp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                        IBV_QP_ACCESS_FLAGS), EINVAL);
  a.port_num = 1;
  ASSERT_EQ(model_.ModifyQp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                        IBV_QP_ACCESS_FLAGS), 0);
  // INIT -> RTR without a LID on InfiniBand, then without the RNR timer.
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = 0x99;
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  EXPECT_EQ(model_.ModifyQp(qp, &a, mask), EINVAL);
  a.ah_attr.dlid = 2;
  EXPECT_EQ(model_.ModifyQp(qp, &a, mask & ~IBV_QP_MIN_RNR_TIMER), EINVAL);
  // A bit that does not belong to this transition.
  EXPECT_EQ(model_.ModifyQp(qp, &a, mask | IBV_QP_SQ_PSN), EINVAL);
  ASSERT_EQ(model_.ModifyQp(qp, &a, mask), 0);
  EXPECT_EQ(model_.QpState(qp->qp_num), IBV_QPS_RTR);
  // Posting a send before RTS fails.
  std::vector<char> mem(64);
  ibv_mr* mr = Mr(pd_a_, mem, IBV_ACCESS_LOCAL_WRITE);
  EXPECT_EQ(Post(qp, IBV_WR_RDMA_WRITE, mem.data(), 8, mr->lkey, 0, 0, 1), EINVAL);
}

TEST_F(VerbsModelTest, RoceRtrToAGidNoActivePortHoldsTimesOutAfterTheNeighbourWait) {
  // make test-rdma: INIT->RTR between two rxe devices that could not reach each other failed
  // "Connection timed out" (the kernel's ARP wait, addr.c); the model used to accept any GID.
  VerbsModel roce({RoceDevice("rxe0", "10.0.0.7"), RoceDevice("rxe1", "10.0.0.8")});
  auto [ctx, pd, cq, qp, a] = RcQpInInit(roce);
  ASSERT_NE(qp, nullptr);
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.sgid_index = 3;
  a.ah_attr.grh.dgid = Ipv4MappedGid("10.0.0.9");  // nobody
  const int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  absl::Time start = absl::Now();
  EXPECT_EQ(roce.ModifyQp(qp, &a, mask), ETIMEDOUT);
  EXPECT_EQ(errno, ETIMEDOUT);
  EXPECT_GE(absl::Now() - start, kNeighbourTimeout);
  EXPECT_EQ(roce.QpState(qp->qp_num), IBV_QPS_INIT);
  // The peer's GID, its port down (the cable pulled): no ARP answer either.
  a.ah_attr.grh.dgid = Ipv4MappedGid("10.0.0.8");
  roce.SetPortState("rxe1", 1, IBV_PORT_DOWN);
  EXPECT_EQ(roce.ModifyQp(qp, &a, mask), ETIMEDOUT);
  roce.SetPortState("rxe1", 1, IBV_PORT_ACTIVE);
  start = absl::Now();
  EXPECT_EQ(roce.ModifyQp(qp, &a, mask), 0);
  EXPECT_LT(absl::Now() - start, kNeighbourTimeout);
  EXPECT_EQ(roce.QpState(qp->qp_num), IBV_QPS_RTR);
  EXPECT_EQ(roce.DestroyQp(qp), 0);
  EXPECT_EQ(roce.DestroyCq(cq), 0);
  EXPECT_EQ(roce.DeallocPd(pd), 0);
  EXPECT_EQ(roce.CloseDevice(ctx), 0);
}

TEST_F(VerbsModelTest, RemovingSoftRoceSendsNothingAndWaitsForItsContextsToClose) {
  // `rdma link delete rxe0` in make test-rdma: D state while ferryd held rxe0, no event.
  VerbsModel roce({SoftRoceDevice("rxe0", "10.0.0.7")});
  int n = 0;
  ibv_device** list = roce.GetDeviceList(&n);
  ASSERT_EQ(n, 1);
  ibv_device* rxe0 = list[0];
  roce.FreeDeviceList(list);
  ibv_context* ctx = roce.OpenDevice(rxe0);
  ASSERT_NE(ctx, nullptr);
  const uint64_t events = roce.EventsRaised();
  EXPECT_FALSE(roce.RemoveDevice("rxe0", absl::Milliseconds(100)));
  EXPECT_EQ(roce.BlockedRemovals(), 1u);
  EXPECT_EQ(roce.EventsRaised(), events);  // nothing tells the holder
  // Gone from the list and unopenable at once (its uverbs cdev went first).
  list = roce.GetDeviceList(&n);
  ASSERT_NE(list, nullptr);
  EXPECT_EQ(n, 0);
  roce.FreeDeviceList(list);
  EXPECT_EQ(roce.OpenDevice(rxe0), nullptr);
  EXPECT_EQ(errno, ENODEV);
  // Re-added (a new device of the old name) while the old one still waits for its holder,
  // then removed again: the removal returns once the holder closes.
  roce.AddDevice(SoftRoceDevice("rxe0", "10.0.0.7"));
  ibv_context* again = OpenFirst(roce);
  ASSERT_NE(again, nullptr);
  std::thread closer([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_EQ(roce.CloseDevice(again), 0);
  });
  EXPECT_TRUE(roce.RemoveDevice("rxe0", absl::Seconds(10)));
  closer.join();
  EXPECT_EQ(roce.CloseDevice(ctx), 0);
}

TEST_F(VerbsModelTest, RemovingADeviceThatDisassociatesRaisesDeviceFatalAndReturns) {
  VerbsModel roce({RoceDevice("mlx5_0", "10.0.0.7")});
  ibv_context* ctx = OpenFirst(roce);
  ASSERT_NE(ctx, nullptr);
  EXPECT_TRUE(roce.RemoveDevice("mlx5_0", absl::ZeroDuration()));
  ibv_async_event event = {};
  ASSERT_EQ(roce.GetAsyncEvent(ctx, &event), 0);
  EXPECT_EQ(event.event_type, IBV_EVENT_DEVICE_FATAL);
  roce.AckAsyncEvent(&event);
  EXPECT_EQ(roce.BlockedRemovals(), 0u);
  EXPECT_EQ(roce.CloseDevice(ctx), 0);
}

TEST_F(VerbsModelTest, RoceNeedsAGrhAndAnMtuThePortHas) {
  VerbsModel roce({RoceDevice("rxe0", "10.0.0.7")});
  auto [ctx, pd, cq, qp, a] = RcQpInInit(roce);
  ASSERT_NE(qp, nullptr);
  a.ah_attr.dlid = 7;  // a LID means nothing on Ethernet
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  EXPECT_EQ(roce.ModifyQp(qp, &a, mask), EINVAL);
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.sgid_index = 3;
  a.path_mtu = IBV_MTU_4096;  // above the port's 1024
  EXPECT_EQ(roce.ModifyQp(qp, &a, mask), EINVAL);
  a.path_mtu = IBV_MTU_1024;
  EXPECT_EQ(roce.ModifyQp(qp, &a, mask), 0);
  EXPECT_EQ(roce.DestroyQp(qp), 0);
  EXPECT_EQ(roce.DestroyCq(cq), 0);
  EXPECT_EQ(roce.DeallocPd(pd), 0);
  EXPECT_EQ(roce.CloseDevice(ctx), 0);
}

TEST_F(VerbsModelTest, WriteReadAndWriteWithImmediateMoveBytes) {
  ibv_qp *a, *b;
  Pair(&a, &b);
  std::vector<char> src(4096, 'w'), back(4096, 0), dst(4096, 0);
  ibv_mr* src_mr = Mr(pd_a_, src, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* back_mr = Mr(pd_a_, back, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* dst_mr = Mr(pd_b_, dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                      IBV_ACCESS_REMOTE_READ);
  uint64_t base = reinterpret_cast<uint64_t>(dst.data());
  ASSERT_EQ(Post(a, IBV_WR_RDMA_WRITE, src.data(), 4096, src_mr->lkey, base, dst_mr->rkey, 1), 0);
  ASSERT_EQ(Post(a, IBV_WR_RDMA_READ, back.data(), 100, back_mr->lkey, base + 10, dst_mr->rkey, 2),
            0);
  auto wcs = Poll(cq_a_, 2);
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, 1u);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(wcs[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[1].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(wcs[1].byte_len, 100u);
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 'w'), 4096);
  EXPECT_EQ(std::count(back.begin(), back.begin() + 100, 'w'), 100);

  ibv_recv_wr recv = {};
  recv.wr_id = 77;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(model_.PostRecv(b, &recv, &bad), 0);
  ASSERT_EQ(Post(a, IBV_WR_RDMA_WRITE_WITH_IMM, src.data(), 8, src_mr->lkey, base, dst_mr->rkey, 3),
            0);
  auto rwc = Poll(cq_b_, 1);
  ASSERT_EQ(rwc.size(), 1u);
  EXPECT_EQ(rwc[0].wr_id, 77u);
  EXPECT_EQ(rwc[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(ntohl(rwc[0].imm_data), 0xabcdu);
  EXPECT_EQ(rwc[0].byte_len, 8u);
  EXPECT_EQ(rwc[0].qp_num, b->qp_num);
  EXPECT_EQ(Poll(cq_a_, 1).size(), 1u);
}

// The port counters (sysfs port_xmit_data / port_rcv_data) count payload where it leaves
// and where it enters: a WRITE leaves the requester, a READ's response leaves the responder.
// A refused access moves nothing.
TEST_F(VerbsModelTest, PortCountersCountPayloadWhereItLeavesAndWhereItEnters) {
  ibv_qp *a, *b;
  Pair(&a, &b);
  std::vector<char> src(4096, 'w'), back(4096, 0), dst(4096, 0);
  ibv_mr* src_mr = Mr(pd_a_, src, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* back_mr = Mr(pd_a_, back, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* dst_mr = Mr(pd_b_, dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                      IBV_ACCESS_REMOTE_READ);
  uint64_t base = reinterpret_cast<uint64_t>(dst.data());
  ASSERT_EQ(Post(a, IBV_WR_RDMA_WRITE, src.data(), 4096, src_mr->lkey, base, dst_mr->rkey, 1), 0);
  ASSERT_EQ(Post(a, IBV_WR_RDMA_READ, back.data(), 100, back_mr->lkey, base, dst_mr->rkey, 2), 0);
  ASSERT_EQ(Poll(cq_a_, 2).size(), 2u);
  VerbsModel::PortCounters ours = model_.Counters("mlx5_0");
  VerbsModel::PortCounters theirs = model_.Counters("mlx5_1");
  EXPECT_EQ(ours.xmit_data, 4096u);
  EXPECT_EQ(ours.rcv_data, 100u);
  EXPECT_EQ(ours.requests, 2u);
  EXPECT_EQ(theirs.xmit_data, 100u);
  EXPECT_EQ(theirs.rcv_data, 4096u);
  EXPECT_EQ(theirs.requests, 0u);
  // A bad rkey: nothing is moved, nothing counted; the QP goes to ERR.
  ASSERT_EQ(Post(a, IBV_WR_RDMA_WRITE, src.data(), 4096, src_mr->lkey, base, dst_mr->rkey + 1, 3),
            0);
  auto wcs = Poll(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(model_.Counters("mlx5_0").xmit_data, 4096u);
  EXPECT_EQ(model_.Counters("mlx5_1").rcv_data, 4096u);
  EXPECT_EQ(model_.Counters("mlx5_9").xmit_data, 0u);  // no such device
  EXPECT_EQ(model_.WorkOutstanding(), 0u);
}

// A link that fails mid-transfer: the work requests up to the mark complete, the next one
// finds no ACK and fails after its retries, the rest flush; PORT_ERR is raised.
TEST_F(VerbsModelTest, APortSetToFailAfterSomeBytesGoesDownBetweenWorkRequests) {
  ibv_qp* a = Qp(pd_a_, cq_a_);
  ibv_qp* b = Qp(pd_b_, cq_b_);
  ASSERT_EQ(Connect(a, b->qp_num, 2, 100, 200, 7, /*timeout=*/8), 0);
  ASSERT_EQ(Connect(b, a->qp_num, 1, 200, 100, 7, /*timeout=*/8), 0);
  std::vector<char> src(4 * 4096, 'w'), dst(4 * 4096, 0);
  ibv_mr* src_mr = Mr(pd_a_, src, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* dst_mr = Mr(pd_b_, dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  model_.SetPortDownAfter("mlx5_1", 1, 2 * 4096);  // the responder's link
  model_.SetPaused(true);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(Post(a, IBV_WR_RDMA_WRITE, src.data() + i * 4096, 4096, src_mr->lkey,
                   reinterpret_cast<uint64_t>(dst.data()) + i * 4096, dst_mr->rkey, i),
              0);
  }
  model_.SetPaused(false);
  auto wcs = Poll(cq_a_, 4);
  ASSERT_EQ(wcs.size(), 4u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wcs[2].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(wcs[3].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 'w'), 2 * 4096);
  EXPECT_EQ(model_.Counters("mlx5_1").rcv_data, 2u * 4096);
  EXPECT_EQ(model_.Counters("mlx5_0").xmit_data, 2u * 4096);
  ibv_port_attr port = {};
  ASSERT_EQ(model_.QueryPort(ctx_b_, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_DOWN);
  ibv_async_event event = {};
  ASSERT_EQ(model_.GetAsyncEvent(ctx_b_, &event), 0);
  EXPECT_EQ(event.event_type, IBV_EVENT_PORT_ERR);
  model_.AckAsyncEvent(&event);
  // The mark is spent: back up, the port stays up.
  model_.SetPortState("mlx5_1", 1, IBV_PORT_ACTIVE);
  ASSERT_EQ(model_.GetAsyncEvent(ctx_b_, &event), 0);
  EXPECT_EQ(event.event_type, IBV_EVENT_PORT_ACTIVE);
  model_.AckAsyncEvent(&event);
  EXPECT_EQ(model_.WorkOutstanding(), 0u);
}

TEST_F(VerbsModelTest, BadRkeyIsRemoteAccessErrorThenEverythingFlushes) {
  ibv_qp *a, *b;
  Pair(&a, &b);
  std::vector<char> src(64, 'x'), dst(64, 0), read_only(64, 0);
  ibv_mr* src_mr = Mr(pd_a_, src, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* dst_mr = Mr(pd_b_, dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_mr* ro_mr = Mr(pd_b_, read_only, IBV_ACCESS_REMOTE_READ);
  uint64_t base = reinterpret_cast<uint64_t>(dst.data());
  model_.SetPaused(true);
  ASSERT_EQ(Post(a, IBV_WR_RDMA_WRITE, src.data(), 64, src_mr->lkey, base, dst_mr->rkey, 1, false),
            0);
  // Unsignalled, and the key of a region peers may not write.
  ASSERT_EQ(Post(a, IBV_WR_RDMA_WRITE, src.data(), 64, src_mr->lkey,
                 reinterpret_cast<uint64_t>(read_only.data()), ro_mr->rkey, 2, false), 0);
  ASSERT_EQ(Post(a, IBV_WR_RDMA_WRITE, src.data(), 64, src_mr->lkey, base, dst_mr->rkey, 3, false),
            0);
  model_.SetPaused(false);
  auto wcs = Poll(cq_a_, 2);
  ASSERT_EQ(wcs.size(), 2u);
  // The first WR succeeded silently; the refused one and the flushed one complete anyway.
  EXPECT_EQ(wcs[0].wr_id, 2u);
  EXPECT_EQ(wcs[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(wcs[1].wr_id, 3u);
  EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(model_.QpState(a->qp_num), IBV_QPS_ERR);
  EXPECT_EQ(std::count(read_only.begin(), read_only.end(), 0), 64);
  // Posting on a QP in ERR is accepted and flushed.
  ASSERT_EQ(Post(a, IBV_WR_RDMA_WRITE, src.data(), 64, src_mr->lkey, base, dst_mr->rkey, 4), 0);
  auto more = Poll(cq_a_, 1);
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0].status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(VerbsModelTest, BadLkeyAndOversizeAreLocalErrors) {
  ibv_qp *a, *b;
  Pair(&a, &b);
  std::vector<char> src(256, 'x'), dst(256, 0);
  ibv_mr* src_mr = Mr(pd_a_, src, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* dst_mr = Mr(pd_b_, dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  uint64_t base = reinterpret_cast<uint64_t>(dst.data());
  // Beyond the local MR.
  ASSERT_EQ(Post(a, IBV_WR_RDMA_WRITE, src.data() + 200, 100, src_mr->lkey, base, dst_mr->rkey, 1),
            0);
  auto wcs = Poll(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(std::count(dst.begin(), dst.end(), 0), 256);

  // Above the port's max_msg_sz (1 MiB on mlx5_0 here).
  std::vector<char> big(2 << 20), far(2 << 20);
  ibv_mr* big_mr = Mr(pd_a_, big, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* far_mr = Mr(pd_b_, far, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_qp *c, *d;
  Pair(&c, &d);
  ASSERT_EQ(Post(c, IBV_WR_RDMA_WRITE, big.data(), big.size(), big_mr->lkey,
                 reinterpret_cast<uint64_t>(far.data()), far_mr->rkey, 1), 0);
  auto len = Poll(cq_a_, 1);
  ASSERT_EQ(len.size(), 1u);
  EXPECT_EQ(len[0].status, IBV_WC_LOC_LEN_ERR);
}

TEST_F(VerbsModelTest, SendQueueSlotsReturnOnlyWhenASignalledCompletionIsPolled) {
  ibv_qp* a = Qp(pd_a_, cq_a_, /*send=*/4);
  ibv_qp* b = Qp(pd_b_, cq_b_);
  ASSERT_EQ(Connect(a, b->qp_num, 2, 1, 2), 0);
  ASSERT_EQ(Connect(b, a->qp_num, 1, 2, 1), 0);
  std::vector<char> src(64), dst(64);
  ibv_mr* src_mr = Mr(pd_a_, src, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* dst_mr = Mr(pd_b_, dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  uint64_t base = reinterpret_cast<uint64_t>(dst.data());
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(
        Post(a, IBV_WR_RDMA_WRITE, src.data(), 8, src_mr->lkey, base, dst_mr->rkey, i, i == 3), 0);
  }
  EXPECT_EQ(Post(a, IBV_WR_RDMA_WRITE, src.data(), 8, src_mr->lkey, base, dst_mr->rkey, 9), ENOMEM);
  model_.WaitIdle();
  // Executed, but nobody polled yet: still full.
  EXPECT_EQ(Post(a, IBV_WR_RDMA_WRITE, src.data(), 8, src_mr->lkey, base, dst_mr->rkey, 9), ENOMEM);
  ASSERT_EQ(Poll(cq_a_, 1).size(), 1u);
  EXPECT_EQ(Post(a, IBV_WR_RDMA_WRITE, src.data(), 8, src_mr->lkey, base, dst_mr->rkey, 9), 0);
  EXPECT_EQ(Poll(cq_a_, 1).size(), 1u);
}

TEST_F(VerbsModelTest, ImmediateWithoutAReceiveIsRnr) {
  ibv_qp *a, *b;
  Pair(&a, &b, /*rnr_retry=*/0);
  std::vector<char> src(8), dst(8);
  ibv_mr* src_mr = Mr(pd_a_, src, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* dst_mr = Mr(pd_b_, dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_EQ(Post(a, IBV_WR_RDMA_WRITE_WITH_IMM, src.data(), 8, src_mr->lkey,
                 reinterpret_cast<uint64_t>(dst.data()), dst_mr->rkey, 1), 0);
  auto wcs = Poll(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
}

TEST_F(VerbsModelTest, WrongPsnOrLidNeverConnects) {
  ibv_qp* a = Qp(pd_a_, cq_a_);
  ibv_qp* b = Qp(pd_b_, cq_b_);
  ASSERT_EQ(Connect(a, b->qp_num, 2, 100, 200), 0);
  ASSERT_EQ(Connect(b, a->qp_num, 1, 200, 101), 0);  // expects PSN 101, a starts at 100
  ibv_qp* c = Qp(pd_a_, cq_a_);
  ibv_qp* d = Qp(pd_b_, cq_b_);
  ASSERT_EQ(Connect(c, d->qp_num, 1, 5, 5), 0);  // d lives on LID 2
  ASSERT_EQ(Connect(d, c->qp_num, 1, 5, 5), 0);
  std::vector<char> src(8), dst(8);
  ibv_mr* src_mr = Mr(pd_a_, src, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* dst_mr = Mr(pd_b_, dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  const absl::Time start = absl::Now();
  for (ibv_qp* qp : {a, c}) {
    ASSERT_EQ(Post(qp, IBV_WR_RDMA_WRITE, src.data(), 8, src_mr->lkey,
                   reinterpret_cast<uint64_t>(dst.data()), dst_mr->rkey, 1), 0);
  }
  auto wcs = Poll(cq_a_, 2);
  ASSERT_EQ(wcs.size(), 2u);
  for (const auto& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_RETRY_EXC_ERR);
  // Only once 7 tries of 4.096 us x 2^14 (67 ms) each went unanswered.
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(465));
}

TEST_F(VerbsModelTest, RetriesTakeTheConfiguredTimeAndTimeoutZeroWaitsForever) {
  std::vector<char> src(8), dst(8);
  ibv_mr* src_mr = Mr(pd_a_, src, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* dst_mr = Mr(pd_b_, dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_qp* quick = Qp(pd_a_, cq_a_);
  ibv_qp* patient = Qp(pd_a_, cq_a_);
  // Both name a QP number nobody has: no ACK ever comes.
  ASSERT_EQ(Connect(quick, 0xdead, 2, 1, 1, 7, /*timeout=*/10), 0);
  ASSERT_EQ(Connect(patient, 0xdead, 2, 1, 1, 7, /*timeout=*/0), 0);
  const absl::Time start = absl::Now();
  for (ibv_qp* qp : {quick, patient}) {
    ASSERT_EQ(Post(qp, IBV_WR_RDMA_WRITE, src.data(), 8, src_mr->lkey,
                   reinterpret_cast<uint64_t>(dst.data()), dst_mr->rkey, qp->qp_num), 0);
  }
  auto wcs = Poll(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].qp_num, quick->qp_num);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_GE(absl::Now() - start, absl::Microseconds(7 * 4096));  // 7 x 4.096 us x 2^10
  // Timeout 0 is the IB spec's "infinite": still nothing, until the QP is torn down.
  absl::SleepFor(absl::Milliseconds(100));
  model_.WaitIdle();
  ibv_wc wc[4];
  EXPECT_EQ(model_.PollCq(cq_a_, 4, wc), 0);
  model_.ForceError(patient->qp_num);
  wcs = Poll(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_WR_FLUSH_ERR);
}

// Soft-RoCE takes retry_cnt 7 as "retry forever" (rxe_comp.c), where mlx5 counts 7: the
// model does as rxe, so a provider that asks for 7 would hang on a dead peer in its tests as
// it did on the real stack.
TEST_F(VerbsModelTest, RetryCountSevenRetriesForeverAsSoftRoceDoes) {
  std::vector<char> src(8), dst(8);
  ibv_mr* src_mr = Mr(pd_a_, src, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* dst_mr = Mr(pd_b_, dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_qp* forever = Qp(pd_a_, cq_a_);
  ASSERT_EQ(Connect(forever, 0xdead, 2, 1, 1, 7, /*timeout=*/10, /*retry_cnt=*/7), 0);
  ASSERT_EQ(Post(forever, IBV_WR_RDMA_WRITE, src.data(), 8, src_mr->lkey,
                 reinterpret_cast<uint64_t>(dst.data()), dst_mr->rkey, 1), 0);
  // 8 x 4.096 us x 2^10 is 34 ms: three times that and still nothing.
  absl::SleepFor(absl::Milliseconds(100));
  model_.WaitIdle();
  ibv_wc wc[4];
  EXPECT_EQ(model_.PollCq(cq_a_, 4, wc), 0) << "retry_cnt 7 gave up, as rxe never does";
  model_.ForceError(forever->qp_num);
  auto wcs = Poll(cq_a_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_WR_FLUSH_ERR);
}

TEST_F(VerbsModelTest, CqOverrunIsCounted) {
  ibv_cq* tiny = model_.CreateCq(ctx_a_, 1);
  ibv_qp_init_attr init = {};
  init.send_cq = init.recv_cq = tiny;
  init.qp_type = IBV_QPT_RC;
  init.cap = {4, 4, 1, 1, 0};
  ibv_qp* a = model_.CreateQp(pd_a_, &init);
  ibv_qp* b = Qp(pd_b_, cq_b_);
  ASSERT_EQ(Connect(a, b->qp_num, 2, 1, 2), 0);
  ASSERT_EQ(Connect(b, a->qp_num, 1, 2, 1), 0);
  std::vector<char> src(8), dst(8);
  ibv_mr* src_mr = Mr(pd_a_, src, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* dst_mr = Mr(pd_b_, dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(Post(a, IBV_WR_RDMA_WRITE, src.data(), 8, src_mr->lkey,
                   reinterpret_cast<uint64_t>(dst.data()), dst_mr->rkey, i), 0);
  }
  model_.WaitIdle();
  EXPECT_EQ(model_.CqOverruns(), 1u);
  // The overrun is an affiliated CQ error, and the QP that overran it is in ERR.
  ibv_async_event event = {};
  ASSERT_EQ(model_.GetAsyncEvent(ctx_a_, &event), 0);
  EXPECT_EQ(event.event_type, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(event.element.cq, tiny);
  model_.AckAsyncEvent(&event);
  EXPECT_EQ(model_.QpState(a->qp_num), IBV_QPS_ERR);
  // Later completions into the errored CQ are lost.
  ASSERT_EQ(Post(a, IBV_WR_RDMA_WRITE, src.data(), 8, src_mr->lkey,
                 reinterpret_cast<uint64_t>(dst.data()), dst_mr->rkey, 9), 0);
  ibv_wc wc[4];
  EXPECT_EQ(model_.PollCq(tiny, 4, wc), 1);  // only the one that fitted before the overrun
  EXPECT_EQ(model_.DestroyCq(tiny), EBUSY);  // a QP still uses it
  EXPECT_EQ(model_.DestroyQp(a), 0);
  EXPECT_EQ(model_.DestroyCq(tiny), 0);
}

TEST_F(VerbsModelTest, AsyncEventsBlockOrNotAsTheFdSaysAndDestroyWaitsForTheAck) {
  ibv_async_event event = {};
  // Nothing pending on a non-blocking fd: EAGAIN (ibv_get_async_event(3)).
  ASSERT_EQ(fcntl(ctx_a_->async_fd, F_SETFL, fcntl(ctx_a_->async_fd, F_GETFL) | O_NONBLOCK), 0);
  errno = 0;
  EXPECT_EQ(model_.GetAsyncEvent(ctx_a_, &event), -1);
  EXPECT_EQ(errno, EAGAIN);
  // A port going down is an unaffiliated event naming the port, and poll() sees it.
  model_.SetPortState("mlx5_0", 1, IBV_PORT_DOWN);
  pollfd pfd = {ctx_a_->async_fd, POLLIN, 0};
  ASSERT_EQ(poll(&pfd, 1, 1000), 1);
  ASSERT_EQ(model_.GetAsyncEvent(ctx_a_, &event), 0);
  EXPECT_EQ(event.event_type, IBV_EVENT_PORT_ERR);
  EXPECT_EQ(event.element.port_num, 1);
  model_.AckAsyncEvent(&event);
  ibv_port_attr port = {};
  ASSERT_EQ(model_.QueryPort(ctx_a_, 1, &port), 0);
  EXPECT_EQ(port.state, IBV_PORT_DOWN);
  model_.SetPortState("mlx5_0", 1, IBV_PORT_ACTIVE);
  ASSERT_EQ(model_.GetAsyncEvent(ctx_a_, &event), 0);
  EXPECT_EQ(event.event_type, IBV_EVENT_PORT_ACTIVE);
  model_.AckAsyncEvent(&event);
  // A blocking fd blocks until an event comes.
  ASSERT_EQ(fcntl(ctx_b_->async_fd, F_SETFL, fcntl(ctx_b_->async_fd, F_GETFL) & ~O_NONBLOCK), 0);
  ibv_qp *a = nullptr, *b = nullptr;
  Pair(&a, &b);
  std::thread raiser([&] {
    absl::SleepFor(absl::Milliseconds(20));
    model_.RaiseQpFatal(b->qp_num);
  });
  ASSERT_EQ(model_.GetAsyncEvent(ctx_b_, &event), 0);
  raiser.join();
  EXPECT_EQ(event.event_type, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(event.element.qp, b);
  EXPECT_EQ(model_.QpState(b->qp_num), IBV_QPS_ERR);
  // Destroying the QP waits until its event is acknowledged.
  const absl::Time start = absl::Now();
  std::thread acker([&] {
    absl::SleepFor(absl::Milliseconds(50));
    model_.AckAsyncEvent(&event);
  });
  EXPECT_EQ(model_.DestroyQp(b), 0);
  acker.join();
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(50));
  EXPECT_EQ(model_.UnackedEvents(), 0);
  EXPECT_EQ(model_.BlockedDestroys(), 0u);
  qps_.erase(std::find(qps_.begin(), qps_.end(), b));
}

TEST_F(VerbsModelTest, RegistrationRulesAndFaults) {
  std::vector<char> mem(64);
  // Remote write without local write is refused, as by every HCA.
  errno = 0;
  EXPECT_EQ(model_.RegMr(pd_a_, mem.data(), mem.size(), IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
  model_.FailNext(Call::kRegMr, ENOMEM);
  EXPECT_EQ(model_.RegMr(pd_a_, mem.data(), mem.size(), IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, ENOMEM);
  ibv_mr* mr = Mr(pd_a_, mem, IBV_ACCESS_LOCAL_WRITE);
  EXPECT_NE(mr, nullptr);
  EXPECT_EQ(model_.DeallocPd(pd_a_), EBUSY);  // an MR still lives in it
  EXPECT_EQ(model_.CloseDevice(ctx_a_), EBUSY);
}

TEST_F(VerbsModelTest, DmabufRegistrationReachesTheFdsPages) {
  int fd = memfd_create("dmabuf", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  const uint64_t iova = 0x7f0000000000ull;  // where a GPU buffer would be addressed
  ibv_mr* mr = model_.RegDmabufMr(pd_b_, 4096, 4096, iova,
                                  fd, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr);
  mrs_.push_back(mr);
  // rdma-core: addr is the dma-buf offset; the HCA addresses the MR by its iova.
  EXPECT_EQ(reinterpret_cast<uint64_t>(mr->addr), 4096u);
  ibv_qp *a, *b;
  Pair(&a, &b);
  std::vector<char> src(16, 'd');
  ibv_mr* src_mr = Mr(pd_a_, src, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(Post(a, IBV_WR_RDMA_WRITE, src.data(), 16, src_mr->lkey, iova + 100, mr->rkey, 1), 0);
  ASSERT_EQ(Poll(cq_a_, 1).at(0).status, IBV_WC_SUCCESS);
  char back[16];
  ASSERT_EQ(pread(fd, back, 16, 4096 + 100), 16);
  EXPECT_EQ(std::memcmp(back, src.data(), 16), 0);
  close(fd);
  errno = 0;
  EXPECT_EQ(model_.RegDmabufMr(pd_b_, 0, 4096, iova, -1, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EBADF);
}

TEST_F(VerbsModelTest, DmabufIovaAndOffsetMustShareThePageOffset) {
  int fd = memfd_create("dmabuf", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  errno = 0;
  EXPECT_EQ(model_.RegDmabufMr(pd_b_, 4096, 4096, 0x7f0000000100ull, fd, IBV_ACCESS_LOCAL_WRITE),
            nullptr);
  EXPECT_EQ(errno, EINVAL);
  close(fd);
}

TEST_F(VerbsModelTest, InlineFromDmabufMemoryFaults) {
  int fd = memfd_create("dmabuf", MFD_CLOEXEC);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  const uint64_t iova = 0x7f0000000000ull;
  ibv_mr* gpu = model_.RegDmabufMr(pd_a_, 0, 4096, iova, fd, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(gpu, nullptr);
  mrs_.push_back(gpu);
  ibv_qp *a, *b;
  Pair(&a, &b);
  std::vector<char> dst(64);
  ibv_mr* dst_mr = Mr(pd_b_, dst, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_sge sge{iova, 16, gpu->lkey};
  ibv_send_wr wr = InlineWrite(&sge, reinterpret_cast<uint64_t>(dst.data()), dst_mr->rkey);
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(model_.PostSend(a, &wr, &bad), EFAULT);
  EXPECT_EQ(bad, &wr);
  EXPECT_EQ(model_.CpuFaults(), 1u);
  close(fd);
}

// ibv_reg_mr of GPU memory (a simulated GPU's device range, which the CPU cannot touch):
// without nvidia_peermem get_user_pages finds no pages to pin and the call fails EFAULT, as on
// the hardware; once it is loaded, the peer-memory table gives the pages, and WRITE and READ
// move the GPU's own bytes (checked through its copy engine). Inline data from it faults.
TEST_F(VerbsModelTest, GpuMemoryRegistersOnlyThroughPeerMemory) {
  constexpr uint64_t kSlab = 1 << 16;
  auto gpu = memory::CreateSimGpu(0, "", 0);
  auto slab = gpu->AllocateSlab(kSlab);
  ASSERT_TRUE(slab.ok()) << slab.status();
  char* device = static_cast<char*>((*slab)->data());
  constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  errno = 0;
  EXPECT_EQ(model_.RegMr(pd_b_, device, kSlab, kAccess), nullptr);
  EXPECT_EQ(errno, EFAULT) << "no peer-memory client: get_user_pages fails";

  model_.SetPeerMemoryLoaded(true);
  errno = 0;
  EXPECT_EQ(model_.RegMr(pd_b_, device + 4096, kSlab, kAccess), nullptr);
  EXPECT_EQ(errno, EFAULT) << "a range past the allocation is no client's";
  errno = 0;
  EXPECT_EQ(model_.RegMr(pd_b_, reinterpret_cast<void*>(0x1000), 4096, kAccess), nullptr);
  EXPECT_EQ(errno, EFAULT) << "no mapping at all";
  ibv_mr* gpu_mr = model_.RegMr(pd_b_, device, kSlab, kAccess);
  ASSERT_NE(gpu_mr, nullptr) << errno;
  mrs_.push_back(gpu_mr);

  ibv_qp *a, *b;
  Pair(&a, &b);
  std::vector<char> src(4096), back(4096, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 1);
  ibv_mr* src_mr = Mr(pd_a_, src, IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* back_mr = Mr(pd_a_, back, IBV_ACCESS_LOCAL_WRITE);
  const uint64_t base = reinterpret_cast<uint64_t>(device);
  // WRITE into the GPU: the bytes land in device memory.
  ASSERT_EQ(Post(a, IBV_WR_RDMA_WRITE, src.data(), 4096, src_mr->lkey, base + 100, gpu_mr->rkey, 1),
            0);
  ASSERT_EQ(Poll(cq_a_, 1).at(0).status, IBV_WC_SUCCESS);
  std::vector<char> landed(4096);
  ASSERT_TRUE(fake::ReadGpu(*gpu, landed.data(), device + 100, 4096).ok());
  EXPECT_EQ(landed, src);
  // READ from the GPU: a pattern put there by the copy engine comes back.
  std::vector<char> pattern(4096, 'g');
  ASSERT_TRUE(fake::WriteGpu(*gpu, device + 8192, pattern.data(), pattern.size()).ok());
  ASSERT_EQ(Post(a, IBV_WR_RDMA_READ, back.data(), 4096, back_mr->lkey, base + 8192, gpu_mr->rkey,
                 2),
            0);
  ASSERT_EQ(Poll(cq_a_, 1).at(0).status, IBV_WC_SUCCESS);
  EXPECT_EQ(back, pattern);

  // The CPU reads inline data at post time: from GPU memory that faults.
  ibv_mr* dst_mr = Mr(pd_a_, back, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_sge sge{base, 16, gpu_mr->lkey};
  ibv_send_wr wr = InlineWrite(&sge, reinterpret_cast<uint64_t>(back.data()), dst_mr->rkey);
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(model_.PostSend(b, &wr, &bad), EFAULT);
  EXPECT_EQ(model_.CpuFaults(), 1u);
  // The MR pins the pages: freeing the slab first leaves it safe to deregister (TearDown).
  slab->reset();
}

TEST_F(VerbsModelTest, ForcedErrorFlushesReceives) {
  ibv_qp *a, *b;
  Pair(&a, &b);
  ibv_recv_wr recv = {};
  recv.wr_id = 5;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(model_.PostRecv(b, &recv, &bad), 0);
  model_.ForceError(b->qp_num);
  auto wcs = Poll(cq_b_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 5u);
  EXPECT_EQ(wcs[0].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(model_.QpState(b->qp_num), IBV_QPS_ERR);
}

}  // namespace
}  // namespace ferry::verbs::model
