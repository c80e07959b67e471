#pragma once
// Where a run of the agent starts counting the ids it hands to clients (sessions, buffers,
// transfers). Not at 1: a client of an earlier run that outlived a restart (a process that
// kept its objects, or a raw gRPC client) still names its old ids, and ids counted from 1
// again would name what a new client of the same uid just made, so that it would write
// into that buffer or cancel that transfer. Drawn from the run's random incarnation, the
// ranges of two runs are 2^20 ids apart with probability 1 - 2^-24, yet the ids stay short
// enough to read in a log (at most 14 digits).

#include <cstdint>

namespace ferry {

inline uint64_t FirstIdOfRun(uint64_t incarnation) {
  return (((incarnation >> 40) & 0xffffff) << 20) + 1;
}

}  // namespace ferry
