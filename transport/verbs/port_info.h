#pragma once
// What the provider learned about its device and port at open time; everything the QP
// transitions, splitting and inlining depend on.

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>

namespace ferry::verbs {

struct PortInfo {
  std::string device;       // e.g. "mlx5_0"
  uint8_t port = 1;
  uint8_t link_layer = IBV_LINK_LAYER_INFINIBAND;
  uint16_t lid = 0;         // InfiniBand address
  int gid_index = -1;       // RoCE: the chosen RoCE v2 entry; InfiniBand: 0 if it has one
  ibv_gid gid = {};
  ibv_mtu active_mtu = IBV_MTU_1024;
  // InfiniBand: the subnet requires a GRH on every packet (IBV_QPF_GRH_REQUIRED).
  bool grh_required = false;
  uint64_t max_msg_sz = 1ull << 30;
  // Device limits (ibv_query_device).
  int max_qp_wr = 0;
  int max_cqe = 0;
  int max_cq = 0;
  int max_sge = 0;
  int max_qp_rd_atom = 0;       // READs this QP may answer
  int max_qp_init_rd_atom = 0;  // READs this QP may have outstanding

  bool is_roce() const { return link_layer == IBV_LINK_LAYER_ETHERNET; }
};

}  // namespace ferry::verbs
