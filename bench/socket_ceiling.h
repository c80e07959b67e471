#pragma once
// The kernel's ceiling for the tcp path on this machine, measured in the same run: plain
// blocking sockets over loopback, as many connections as ferry's tcp provider opens, each
// with a sending and a receiving thread of their own, moving one `size` buffer into another
// (no framing, no acks, no RPC). A ferry 64 MiB WRITE can at best match it; a baseline far
// above it moves bytes some other way than one TCP copy each side.
// (iperf3, the other TCP baseline, drives all its streams from one thread in Debian 12's
// 3.12, and sends from one small buffer that stays in cache.)

#include <cstdint>

#include "absl/status/statusor.h"
#include "bench/measurement.h"

namespace ferry::bench {

// Series "tcp sockets": `size` bytes split over `connections` per round, rounds repeated for
// at least `min_seconds`; the best of `runs` such runs, each on fresh connections.
absl::StatusOr<Measurement> RunSocketCeiling(int connections, uint64_t size, double min_seconds,
                                             int runs = 3);

}  // namespace ferry::bench
