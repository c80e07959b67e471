#pragma once
// The security suite (`ferry-bench --suite security`): what mutual TLS on the Peer API costs,
// in one run: a pair of agents with mtls and a pair with security.mode insecure, measured in
// alternating rounds (so the machine's noise falls on both) at 64 MiB WRITEs and at one 4 KiB
// WRITE outstanding, where the per-op control calls (ResolveBuffer over the Peer API) weigh
// most. The data path is the same in both: tcp payloads are not encrypted.

#include <cstdint>

#include "bench/measurement.h"

namespace ferry::bench {

struct SecurityOptions {
  double seconds = 1.0;  // per point and round
  int rounds = 2;
};

// Appends rows "mtls ..." / "insecure ..." and a finding with the ratios. Returns false on
// an error (printed).
bool RunSecuritySuite(const SecurityOptions& options, Report& report);

}  // namespace ferry::bench
