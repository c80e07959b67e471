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
  static const std::string kNone;
  absl::MutexLock lock(&mu_);
  RecordLocked({.peer = peer,
                .read = read,
                .mode = result.legs_size() > 0 ? result.legs(0).mode() : kNone,
                .provider = result.provider(),
                .code = result.code(),
                .bytes = result.bytes(),
                .duration_us = result.duration_us()});
}

void TransferStats::RecordLocked(const OpRecord& op) {
  static const std::string kNone = "none", kRead = "read", kWrite = "write";
  const std::string& direction = op.read ? kRead : kWrite;
  const std::string& mode = op.mode.empty() ? kNone : op.mode;
  const std::string& provider = op.provider.empty() ? kNone : op.provider;
  if (last_ == nullptr || std::get<0>(last_key_) != op.peer ||
      std::get<1>(last_key_) != direction || std::get<2>(last_key_) != mode ||
      std::get<3>(last_key_) != provider) {
    last_key_ = Key(op.peer, direction, mode, provider);
    last_ = &totals_[last_key_];  // std::map: the entry stays where it is
  }
  OpTotals& t = *last_;
  ++t.ops;
  t.bytes += op.bytes;
  if (op.code != 0) {
    ++t.failed;
    return;
  }
  // The op's own length: bytes of a succeeded op.
  // SizeClassOf answers one of a few literals: the same pointer for the same class.
  const char* size_class = SizeClassOf(op.bytes);
  if (size_class != last_class_) {
    last_class_ = size_class;
    last_histogram_ = &latency_[size_class];
  }
  LatencyHistogram& h = *last_histogram_;
  const double us = static_cast<double>(op.duration_us);
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
