#pragma once
// Settings of the verbs provider (config section `verbs:`).

#include <cstdint>
#include <string>

namespace ferry::verbs {

struct VerbsOptions {
  // RDMA device by name (the NIC the topology chose); "" = the first with an active port.
  std::string device;
  // Port number; 0 = the device's first active port.
  uint32_t port = 0;
  // GID table index for RoCE; -1 = the first RoCE v2 GID (IPv4-mapped preferred). Unused on
  // InfiniBand, which addresses by LID.
  int gid_index = -1;
  // Ack timeout exponent: 4.096 us * 2^timeout (14 = 67 ms), as ibv_modify_qp takes it.
  uint32_t timeout = 14;
  // Transport retries before a WR fails with IBV_WC_RETRY_EXC_ERR (0..7). 6, not 7: the
  // kernel's Soft-RoCE takes 7 as "retry forever" (rxe_comp.c) where mlx5 counts 7 retries,
  // and a dead peer must be an error within seconds on both (7 x 67 ms here).
  uint32_t retry_cnt = 6;
  // Receiver-not-ready retries; 7 means retry forever (0..7).
  uint32_t rnr_retry = 7;
  // Send queue depth per endpoint; more ops than this wait in the provider.
  uint32_t send_queue_depth = 1024;
  // Request a completion every Nth WR (and for the last WR of each post), so the send queue
  // is reclaimed without a completion per op.
  uint32_t signal_every = 64;
  // Payloads up to this many bytes are copied into the WR (IBV_SEND_INLINE) when the device
  // allows it, saving the HCA a DMA read.
  uint32_t inline_threshold = 64;
  // Receives kept posted per accepted connection, one per WRITE-with-immediate in flight;
  // only on connections accepted while the fabric has an immediate handler.
  uint32_t recv_queue_depth = 256;
  // Entries per completion queue. Each QP takes its queue depth in one CQ; the device opens
  // another CQ of this size when the ones it has are fully promised (cq_pool.h).
  uint32_t cq_depth = 65536;
  // Largest single WR; larger ops are split. 0 = the port's max_msg_sz.
  uint64_t max_message_bytes = 0;
  // GRH traffic class (RoCE: DSCP << 2 | ECN) and InfiniBand service level, as the fabric's
  // QoS/lossless class expects; partition key index.
  uint8_t traffic_class = 0;
  uint8_t sl = 0;
  uint16_t pkey_index = 0;
  // RC QPs an initiator opens to each peer NIC; a direct op's slices are spread over them
  // (Fabric::endpoints_per_peer).
  uint32_t qps_per_peer = 2;
};

}  // namespace ferry::verbs
