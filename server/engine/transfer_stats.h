#pragma once
// What the agent's transfers did, added up as they finish: ops, bytes and failures by peer,
// direction, mode (host / gdr / staged) and provider, and op latency by size class. Read by
// `ferryctl stats` (GetStats) and the Prometheus exporter; cheap to record (one lock per
// finished transfer, a map lookup per op).

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "ferry/v1/agent.pb.h"

namespace ferry::server {

// Op latency buckets (upper bounds, microseconds): a Prometheus-style cumulative histogram.
// Ten to a decade (the R10 preferred numbers: each bound about 1.26 x the last) from 10 us
// to 10 s, so a quantile read off them (`ferryctl stats`' "P50 <=") is at most 28% above the
// true one: a 55 ms op reads <= 63000 us (with 1-2.5-5 steps it read <= 100000 us).
inline constexpr std::array<double, 61> kLatencyBoundsUs = {
    10, 12.5, 16, 20, 25, 31.5, 40, 50, 63, 80,
    100, 125, 160, 200, 250, 315, 400, 500, 630, 800,
    1000, 1250, 1600, 2000, 2500, 3150, 4000, 5000, 6300, 8000,
    10000, 12500, 16000, 20000, 25000, 31500, 40000, 50000, 63000, 80000,
    100000, 125000, 160000, 200000, 250000, 315000, 400000, 500000, 630000, 800000,
    1000000, 1250000, 1600000, 2000000, 2500000, 3150000, 4000000, 5000000, 6300000, 8000000,
    10000000};

// "<=4KiB", "<=64KiB", "<=1MiB", "<=16MiB", ">16MiB".
const char* SizeClassOf(uint64_t bytes);

struct OpTotals {
  uint64_t ops = 0;
  uint64_t bytes = 0;
  uint64_t failed = 0;
};

struct LatencyHistogram {
  std::array<uint64_t, kLatencyBoundsUs.size()> buckets{};  // not cumulative
  uint64_t count = 0;     // ops that succeeded (failed ones are not timed)
  double sum_us = 0;
};

class TransferStats {
 public:
  // (peer, direction "write" / "read", mode, provider)
  using Key = std::tuple<std::string, std::string, std::string, std::string>;

  // One finished op, as the engine reads it off a transfer.
  struct OpRecord {
    const std::string& peer;
    bool read;
    const std::string& mode;      // the local leg's; "" when never planned
    const std::string& provider;  // "" when it never reached one
    int code;                     // 0: succeeded
    uint64_t bytes;
    uint64_t duration_us;
  };
  // Counts one finished op: `peer`, READ or WRITE, and its result (legs[0] says the mode).
  void Record(const std::string& peer, bool read, const ferry::v1::OpResult& result)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Call around a transfer's ops so they take the lock once.
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION(mu_) { mu_.Lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION(mu_) { mu_.Unlock(); }
  void RecordLocked(const OpRecord& op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::map<Key, OpTotals> Totals() const;
  // By size class.
  std::map<std::string, LatencyHistogram> Latency() const;
  uint64_t transfers_succeeded() const;
  uint64_t transfers_failed() const;
  void CountTransfer(bool succeeded);

 private:
  mutable absl::Mutex mu_;
  std::map<Key, OpTotals> totals_ ABSL_GUARDED_BY(mu_);
  // The entry the previous op counted into: the ops of a batch mostly share a key, and
  // comparing it is cheaper than a map lookup that builds a key of four strings.
  Key last_key_ ABSL_GUARDED_BY(mu_);
  OpTotals* last_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::map<std::string, LatencyHistogram> latency_ ABSL_GUARDED_BY(mu_);
  // Likewise the histogram of the previous op's size class.
  const char* last_class_ ABSL_GUARDED_BY(mu_) = nullptr;
  LatencyHistogram* last_histogram_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t succeeded_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t failed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ferry::server
