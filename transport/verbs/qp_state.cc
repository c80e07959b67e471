#include "transport/verbs/qp_state.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "absl/strings/str_format.h"

namespace ferry::verbs {
namespace {

absl::Status Modify(VerbsApi& api, ibv_qp* qp, ibv_qp_attr& attr, int mask, const char* step) {
  int rc = api.ModifyQp(qp, &attr, mask);
  if (rc == 0) return absl::OkStatus();
  int err = rc > 0 ? rc : errno;
  return absl::ErrnoToStatus(err, absl::StrFormat("ibv_modify_qp(QP 0x%x, %s)", qp->qp_num, step));
}

// READs in flight are bounded by both the device and a small constant: more buys nothing on
// current HCAs and costs responder resources.
constexpr int kMaxReadsInFlight = 16;

}  // namespace

ibv_qp_attr InitAttr(const PortInfo& port, int qp_access, const VerbsOptions& options,
                     int* mask) {
  ibv_qp_attr attr = {};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = options.pkey_index;
  attr.port_num = port.port;
  attr.qp_access_flags = qp_access;
  *mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
  return attr;
}

ibv_qp_attr RtrAttr(const PortInfo& port, const QpAddress& remote, const VerbsOptions& options,
                    int* mask) {
  ibv_qp_attr attr = {};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = std::min(port.active_mtu, remote.mtu);
  attr.dest_qp_num = remote.qpn;
  attr.rq_psn = remote.psn;
  attr.max_dest_rd_atomic =
      static_cast<uint8_t>(std::clamp(port.max_qp_rd_atom, 1, kMaxReadsInFlight));
  attr.min_rnr_timer = kMinRnrTimer;
  attr.ah_attr.port_num = port.port;
  attr.ah_attr.sl = options.sl;
  // RoCE has no LIDs: every packet carries a GRH, routed by the peer's GID from our RoCE v2
  // source GID. InfiniBand within one subnet is addressed by LID, with a GRH only where the
  // port demands one (then by both).
  const bool grh = port.is_roce() || port.grh_required;
  attr.ah_attr.is_global = grh ? 1 : 0;
  attr.ah_attr.dlid = port.is_roce() ? 0 : remote.lid;
  if (grh) {
    attr.ah_attr.grh.dgid = remote.gid;
    attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(std::max(port.gid_index, 0));
    attr.ah_attr.grh.hop_limit = kRoceHopLimit;
    attr.ah_attr.grh.traffic_class = options.traffic_class;
    attr.ah_attr.grh.flow_label = 0;
  }
  *mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  return attr;
}

ibv_qp_attr RtsAttr(const PortInfo& port, uint32_t local_psn, const VerbsOptions& options,
                    int* mask) {
  ibv_qp_attr attr = {};
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = local_psn;
  attr.timeout = static_cast<uint8_t>(options.timeout);
  attr.retry_cnt = static_cast<uint8_t>(options.retry_cnt);
  attr.rnr_retry = static_cast<uint8_t>(options.rnr_retry);
  attr.max_rd_atomic =
      static_cast<uint8_t>(std::clamp(port.max_qp_init_rd_atom, 1, kMaxReadsInFlight));
  *mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
          IBV_QP_MAX_QP_RD_ATOMIC;
  return attr;
}

absl::Status ConnectQp(VerbsApi& api, ibv_qp* qp, const PortInfo& port, int qp_access,
                       uint32_t local_psn, const QpAddress& remote, const VerbsOptions& options) {
  if (remote.link_layer != port.link_layer) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "verbs: peer QP 0x%x is on %s, our %s port %d is on %s", remote.qpn,
        remote.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet (RoCE)" : "InfiniBand",
        port.device, port.port, port.is_roce() ? "Ethernet (RoCE)" : "InfiniBand"));
  }
  int mask = 0;
  ibv_qp_attr init = InitAttr(port, qp_access, options, &mask);
  if (absl::Status s = Modify(api, qp, init, mask, "RESET->INIT"); !s.ok()) return s;
  ibv_qp_attr rtr = RtrAttr(port, remote, options, &mask);
  if (absl::Status s = Modify(api, qp, rtr, mask, "INIT->RTR"); !s.ok()) return s;
  ibv_qp_attr rts = RtsAttr(port, local_psn, options, &mask);
  return Modify(api, qp, rts, mask, "RTR->RTS");
}

absl::Status MoveToError(VerbsApi& api, ibv_qp* qp) {
  ibv_qp_attr attr = {};
  attr.qp_state = IBV_QPS_ERR;
  return Modify(api, qp, attr, IBV_QP_STATE, "->ERR");
}

uint32_t RandomPsn() {
  static thread_local std::mt19937 rng(std::random_device{}());
  return rng() & 0xffffff;
}

const char* QpStateName(ibv_qp_state state) {
  switch (state) {
    case IBV_QPS_RESET: return "RESET";
    case IBV_QPS_INIT: return "INIT";
    case IBV_QPS_RTR: return "RTR";
    case IBV_QPS_RTS: return "RTS";
    case IBV_QPS_SQD: return "SQD";
    case IBV_QPS_SQE: return "SQE";
    case IBV_QPS_ERR: return "ERR";
    default: return "UNKNOWN";
  }
}

}  // namespace ferry::verbs
