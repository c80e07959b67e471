#pragma once
// RC queue pair transitions RESET -> INIT -> RTR -> RTS, with the attributes each port kind
// needs: InfiniBand addresses the peer by LID; RoCE needs a GRH with the peer's GID and our
// RoCE v2 GID index. The attribute builders are pure so tests can check them field by field.

#include <infiniband/verbs.h>

#include "absl/status/status.h"
#include "transport/verbs/handshake.h"
#include "transport/verbs/port_info.h"
#include "transport/verbs/verbs_api.h"
#include "transport/verbs/verbs_options.h"

namespace ferry::verbs {

// Hop limit for RoCE v2: routable across L3 hops (rdma-core's default for connected QPs).
constexpr uint8_t kRoceHopLimit = 64;
// RNR NAK timer code 12 = 0.64 ms before the sender retries a WRITE-with-immediate whose
// receive was not posted yet.
constexpr uint8_t kMinRnrTimer = 12;

// `qp_access`: IBV_ACCESS_REMOTE_* the QP lets peers use (targets need remote write/read).
// The partition is options.pkey_index.
ibv_qp_attr InitAttr(const PortInfo& port, int qp_access, const VerbsOptions& options,
                     int* mask);
// The path MTU is the smaller of the two ports' active MTUs; service level and (with a GRH)
// traffic class from `options`. A GRH on RoCE always, on InfiniBand where the port requires
// one (IBV_QPF_GRH_REQUIRED).
ibv_qp_attr RtrAttr(const PortInfo& port, const QpAddress& remote, const VerbsOptions& options,
                    int* mask);
ibv_qp_attr RtsAttr(const PortInfo& port, uint32_t local_psn, const VerbsOptions& options,
                    int* mask);

// Drives `qp` from RESET to RTS against `remote`. The error names the transition, the QP
// number and errno.
absl::Status ConnectQp(VerbsApi& api, ibv_qp* qp, const PortInfo& port, int qp_access,
                       uint32_t local_psn, const QpAddress& remote, const VerbsOptions& options);

// Moves `qp` to the error state: the HCA stops it and flushes every outstanding WR.
absl::Status MoveToError(VerbsApi& api, ibv_qp* qp);

// A random 24-bit start PSN, so a stale packet of an earlier connection is not accepted.
uint32_t RandomPsn();

const char* QpStateName(ibv_qp_state state);

}  // namespace ferry::verbs
