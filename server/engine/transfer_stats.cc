#include "server/engine/transfer_stats.h"

#include <algorithm>

namespace ferry::server {

const char* SizeClassOf(uint64_t bytes) {
  if (bytes <= (4u << 10)) return "<=4KiB";
  if (bytes <= (64u << 10)) return "<=64KiB";
  if (bytes <= (1u << 20)) return "<=1MiB";
  if (bytes <= (16u << 20)) return "<=16MiB";
  return ">16MiB";
}

void TransferStats::Record(const std::string& peer, bool read, const ferry::v1::OpResult& result) {
  absl::MutexLock lock(&mu_);
  RecordLocked(peer, read, result);
}

void TransferStats::RecordLocked(const std::string& peer, bool read,
                                 const ferry::v1::OpResult& result) {
  const std::string mode = result.legs_size() > 0 ? result.legs(0).mode() : "";
  OpTotals& t = totals_[{peer, read ? "read" : "write", mode.empty() ? "none" : mode,
                         result.provider().empty() ? "none" : result.provider()}];
  ++t.ops;
  t.bytes += result.bytes();
  if (result.code() != 0) {
    ++t.failed;
    return;
  }
  // The op's own length: bytes of a succeeded op.
  LatencyHistogram& h = latency_[SizeClassOf(result.bytes())];
  const double us = static_cast<double>(result.duration_us());
  auto bucket = std::lower_bound(kLatencyBoundsUs.begin(), kLatencyBoundsUs.end(), us);
  if (bucket != kLatencyBoundsUs.end()) ++h.buckets[bucket - kLatencyBoundsUs.begin()];
  ++h.count;
  h.sum_us += us;
}

void TransferStats::CountTransfer(bool succeeded) {
  absl::MutexLock lock(&mu_);
  ++(succeeded ? succeeded_ : failed_);
}

std::map<TransferStats::Key, OpTotals> TransferStats::Totals() const {
  absl::MutexLock lock(&mu_);
  return totals_;
}

std::map<std::string, LatencyHistogram> TransferStats::Latency() const {
  absl::MutexLock lock(&mu_);
  return latency_;
}

uint64_t TransferStats::transfers_succeeded() const {
  absl::MutexLock lock(&mu_);
  return succeeded_;
}

uint64_t TransferStats::transfers_failed() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}

}  // namespace ferry::server
