#pragma once
// ferryd's start-up check of RLIMIT_MEMLOCK: verbs registrations (ibv_reg_mr) charge every
// pinned host page to it and fail with ENOMEM past it (transport/topology/memlock_check.cc
// says why, and `ferryctl doctor` runs the same count). The agent starts regardless: tcp
// needs no pinning, and GPU memory is not charged; it says at once what to raise instead of
// failing registrations later.

#include <string>

#include "transport/topology/memlock_need.h"
#include "transport/topology/probes.h"

namespace ferry::server {

// The one warning to log, or "" when there is nothing to say: no verbs fabric in use,
// CAP_IPC_LOCK held, an unlimited limit, or one at least `need`.
std::string MemlockWarning(const topology::MemlockLimit& limit, const topology::MemlockNeed& need,
                           bool verbs_in_use);

}  // namespace ferry::server
