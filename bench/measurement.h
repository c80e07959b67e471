#pragma once
// One row of results: a series (ferry, a baseline) at one size.

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::bench {

struct Measurement {
  std::string series;      // "ferry write", "iperf3 -P 4", "grpc stream", "ferry kv"
  uint64_t size = 0;       // bytes per op (kv: per block)
  uint64_t ops = 0;        // ops completed
  uint64_t bytes = 0;      // bytes moved
  double seconds = 0;
  double gbps = 0;
  double ops_per_sec = 0;
  double p50_us = 0;       // latency of one batch (Submit..Wait), or one push for grpc
  double p99_us = 0;
  uint64_t batch = 1;      // ops per batch
  // The agent's own duration of a batch (TransferResult.duration_us), p50; 0 when not known.
  // Beside p50_us it says how much of a round trip is outside the transfer (the call, the
  // request's parsing and planning, the answer).
  double agent_p50_us = 0;
  std::string note;
};

struct Report {
  std::string date;
  std::string machine;
  std::vector<Measurement> rows;
  uint64_t rss_a_peak = 0, rss_b_peak = 0;
  // RSS flatness: agent RSS after the first GiB and at the end of a long run.
  uint64_t rss_run_bytes = 0, rss_early = 0, rss_late = 0;
  std::vector<std::string> findings;  // ratios against the goals, in words
};

}  // namespace ferry::bench
