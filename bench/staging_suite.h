#pragma once
// The staging suite: what the host-staged detour costs. Two agents with simulated GPUs
// (copy engines at a set rate, standing in for PCIe), GPU -> GPU writes of one size, first
// GDR (the direct path) and then staged at depth 1, 2, 4 and 8, in the same run.

#include <string>

#include "bench/measurement.h"

namespace ferry::bench {

struct StagingOptions {
  uint64_t size = 256ull << 20;  // long enough that pipeline fill and drain are small
  uint64_t chunk = 4ull << 20;
  // Simulated copy-engine bytes/s per GPU: below the wire here, so the copy is the slow
  // stage, as PCIe often is, and the 2-core machine is not the bottleneck.
  uint64_t copy_rate = 1ull << 30;
  double seconds = 1.0;
  std::string fixtures;             // tests/fixtures (hwloc machines)
};

// Appends rows "direct (gdr)" and "staged d=N" and findings to `report`. Returns false on
// an error (printed).
bool RunStagingSuite(const StagingOptions& options, Report& report);

}  // namespace ferry::bench
