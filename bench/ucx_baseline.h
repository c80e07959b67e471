#pragma once
// ucx_perftest (Debian ucx-utils) over UCX's tcp transport on loopback: what a user of UCX
// without RDMA gets for the same put, measured in the same run as ferry (tcp tuned to 1 MiB
// segments: ucx_baseline.cc says why).
//   ucp_put_lat: one put at a time, ping-pong; ucx_perftest prints the one-way latency (half
//                the ping-pong), recorded here as the round trip (x2) so it reads beside
//                ferry's Submit-to-completion latency;
//   ucp_put_bw:  puts of one size streamed, bandwidth.

#include <cstdint>

#include "absl/status/statusor.h"
#include "bench/measurement.h"

namespace ferry::bench {

// Series "ucx put_lat": p50 round trip of `iterations` puts of `size` bytes (ucx_perftest
// reports no p99 in one run: left 0).
absl::StatusOr<Measurement> RunUcxPutLat(uint64_t size, int iterations);

// Series "ucx put_bw": `iterations` puts of `size` bytes, the best of `runs` runs.
absl::StatusOr<Measurement> RunUcxPutBw(uint64_t size, int iterations, int runs = 3);

}  // namespace ferry::bench
