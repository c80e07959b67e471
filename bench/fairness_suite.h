#pragma once
// The fairness suite: what a small op waits while a large batch runs to the same peer.
// One 4 KiB WRITE at a time, idle and then beside a 4 GiB batch (64 x 64 MiB, submitted
// again as each ends), with 1 MiB slices in a 16 MiB window (the default) and a 64 MiB one,
// 512 KiB slices in a 4 MiB window, and slicing off (one slice per op, no window: every op
// queued on the wire at Submit, as before slicing), in the same run; and the batch's own
// throughput in each.

#include <cstdint>

#include "bench/measurement.h"

namespace ferry::bench {

struct FairnessOptions {
  uint64_t batch_bytes = 4ull << 30;
  uint64_t small = 4096;
  double seconds = 2.0;  // of small ops per case
};

// Appends its rows and findings to `report`. Returns false on an error (printed).
bool RunFairnessSuite(const FairnessOptions& options, Report& report);

}  // namespace ferry::bench
