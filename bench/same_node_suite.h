#pragma once
// The same-node suite (`ferry-bench --suite same-node`): transfers between two clients of one
// agent, which the agent copies itself (server/engine/local_copy.h), beside a plain memcpy of
// the same bytes in the same process and run: 64 MiB and 256 MiB WRITEs one at a time, and a
// KV batch of 4096 scattered 16 KiB blocks, in alternating rounds, best of each. Where the
// agent sees CUDA GPUs (tests/gpu/run.sh on a lent machine), 256 MiB GPU -> GPU WRITEs on one
// device and across two, beside cudaMemcpy D2D; elsewhere those rows skip, saying why.

#include "bench/report.h"

namespace ferry::bench {

struct SameNodeOptions {
  double seconds = 1.0;  // per point and round
  int rounds = 3;
};

// Appends rows "ferry same-node ..." and "memcpy ...", and findings with the ratios against
// the goals (256 MiB >= 0.8 x memcpy; KV >= 0.5 x; GPU -> GPU >= 0.8 x cudaMemcpy D2D).
// Returns false on an error (printed).
bool RunSameNodeSuite(const SameNodeOptions& options, Report& report);

}  // namespace ferry::bench
