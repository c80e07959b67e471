#pragma once
// What one end of an RC connection tells the other through the Peer Connect call: its QP
// number, start PSN, port address (LID for InfiniBand, GID for RoCE) and active MTU, and
// whether it takes immediates (posts receives for them). The
// initiator's request also names the target QPs of its earlier, now closed, endpoints, so
// the target frees them (an RC target never learns by itself that its initiator is gone).

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ferry::verbs {

struct QpAddress {
  uint8_t link_layer = IBV_LINK_LAYER_INFINIBAND;  // IBV_LINK_LAYER_*
  ibv_mtu mtu = IBV_MTU_1024;                      // the sender's port active MTU
  uint32_t qpn = 0;                                // 24 bits
  uint32_t psn = 0;                                // 24 bits
  uint16_t lid = 0;
  ibv_gid gid = {};
  // Random per fabric instance: the target frees retired QPs only for their own initiator.
  uint64_t fabric_id = 0;
  // Target's reply: it keeps receives posted, so WRITE-with-immediate may be used.
  bool takes_immediates = false;
  std::vector<uint32_t> retired_qpns;
};

// A fixed little-endian layout with a magic and version, so a mismatched peer is refused
// with a clear message instead of wiring a QP to garbage.
std::string SerializeQpAddress(const QpAddress& address);
absl::StatusOr<QpAddress> ParseQpAddress(const std::string& bytes);

// "fe80::1" style text of a GID, for messages and the fabric address.
std::string GidToString(const ibv_gid& gid);

}  // namespace ferry::verbs
