#pragma once
// The engine-only figure (ferry-engine-bench: the real engine over an in-process memcpy
// fabric, no wire) run from ferry-bench, so it lands in the same report and run as the
// wire numbers.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/measurement.h"

namespace ferry::bench {

// Runs `engine_bench` (a path) with --blocks, --sizes, --seconds and --layout (scattered or
// adjacent); one row per block size, series "engine only", ops_per_sec the wall rate and the
// note the layout and the rate per CPU-second.
absl::StatusOr<std::vector<Measurement>> RunEngineBench(const std::string& engine_bench,
                                                        int blocks,
                                                        const std::vector<uint64_t>& sizes,
                                                        double seconds, const std::string& layout);

}  // namespace ferry::bench
