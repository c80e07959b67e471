#pragma once
// The 64 MiB goal judged head to head. A ferry WRITE row, plain TCP sockets and
// ucx_perftest's put_bw take turns, `rounds` times, one run each per turn. The size sweep
// sets a single ferry row against a best of three for each baseline, minutes apart, and on
// the shared 2-core VM loopback TCP swings by half within minutes (bench/results): more than
// the gaps being judged. Here each baseline gets what ferry gets, and the three share the
// machine's moments.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/ferry_runner.h"
#include "bench/measurement.h"

namespace ferry::bench {

struct Turns {
  int rounds = 0;
  // "ferry write turns", "tcp sockets turns" and "ucx put_bw turns" at the size: each its
  // median turn, its note every turn's GB/s in order. A baseline that could not run is
  // missing (said on stderr).
  std::vector<Measurement> rows;
  // GB/s, one per turn, in order; empty for a baseline that could not run. A ratio is taken
  // between runs of the same turn only (its three runs are seconds apart).
  std::vector<double> ferry, sockets, ucx;
};

// `rounds` rounds of `size` bytes: ferry's WRITE row (`options`: its seconds and warm-up),
// then `connections` plain sockets for as long, then ucx_perftest put_bw (`ucx_iterations`
// puts). Fails only where ferry's row fails.
absl::StatusOr<Turns> RunTakingTurns(FerryRunner& runner, const RunOptions& options,
                                     int connections, uint64_t size, int ucx_iterations,
                                     int rounds);

// The judged sentence: the median of ferry's per-turn ratios to each baseline, each turn's
// ratio, and ferry's median against UCX's best turn.
std::string DescribeTurns(const Turns& turns, uint64_t size);

// Median of `values` (the lower middle for an even count); 0 for none.
double Median(std::vector<double> values);

}  // namespace ferry::bench
