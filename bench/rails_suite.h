#pragma once
// The rails suite (`ferry-bench --rails N`): aggregate WRITE throughput between two agents
// over 1, 2, 4 .. N tcp rails (one fabric per rail, each on its own loopback address), in
// one run, with the ratio to one rail and how busy the agents kept the CPUs: on a small VM
// every rail is the same loopback, so the cores, not the rails, may be the limit, and the
// suite says which.

#include <cstdint>

#include "bench/measurement.h"

namespace ferry::bench {

struct RailsOptions {
  uint32_t max_rails = 4;
  uint64_t op_bytes = 64ull << 20;  // each WRITE; a batch holds `ops` of them
  uint32_t ops = 8;
  uint32_t connections = 2;          // tcp connections per rail endpoint
  double seconds = 2.0;
};

// Appends rows "rails N" and a finding to `report`. Returns false on an error (printed).
bool RunRailsSuite(const RailsOptions& options, Report& report);

}  // namespace ferry::bench
