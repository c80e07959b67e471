#pragma once
// Percentiles and rates for benchmark samples, and a measurement's timings from them.

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bench/measurement.h"

namespace ferry::bench {

// The q-th quantile (0..1) of `samples` by nearest rank; 0 for no samples.
inline double Percentile(std::vector<double> samples, double q) {
  if (samples.empty()) return 0;
  std::sort(samples.begin(), samples.end());
  size_t rank = static_cast<size_t>(q * static_cast<double>(samples.size() - 1) + 0.5);
  return samples[std::min(rank, samples.size() - 1)];
}

// GB/s (10^9 bytes per second).
inline double GBps(uint64_t bytes, double seconds) {
  return seconds <= 0 ? 0 : static_cast<double>(bytes) / seconds / 1e9;
}

// Fills in `m`'s time, rates and latency percentiles from its ops and bytes, the `seconds`
// they took and one latency (us) per timed iteration.
inline void SetTimings(Measurement& m, double seconds, const std::vector<double>& latencies) {
  m.seconds = seconds;
  m.gbps = GBps(m.bytes, seconds);
  m.ops_per_sec = seconds <= 0 ? 0 : static_cast<double>(m.ops) / seconds;
  m.p50_us = Percentile(latencies, 0.5);
  m.p99_us = Percentile(latencies, 0.99);
}

}  // namespace ferry::bench
