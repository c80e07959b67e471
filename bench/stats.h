#pragma once
// Percentiles and rates for benchmark samples.

#include <algorithm>
#include <cstdint>
#include <vector>

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

}  // namespace ferry::bench
