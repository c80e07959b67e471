#pragma once
// How much host memory ferryd registers with its RDMA NICs, which the kernel charges to
// RLIMIT_MEMLOCK (memlock_check.cc says why). Shared by `ferryctl doctor` (CheckMemlock) and
// ferryd's start-up warning (server/agent/memlock_check.h), so both count the same bytes.

#include <cstdint>
#include <string>

#include "config/config.h"
#include "transport/topology/plan.h"

namespace ferry::topology {

struct MemlockNeed {
  uint64_t bytes = 0;
  // What those bytes are, e.g. "host pool 1 GiB + 1 bounce pool(s) of 16 MiB".
  std::string parts;
};

// Host buffers (at most the host pool) and a bounce pool per NUMA node a staged GPU goes
// through (server/buffers/bounce_pools.h). GPU memory does not count: peer memory and
// DMA-BUF pin it without charging memlock. Implemented in memlock_check.cc.
MemlockNeed RegisteredHostMemory(const TopologyPlan& plan, const config::Config& config);

}  // namespace ferry::topology
